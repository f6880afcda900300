"""Keras callbacks of a fine-tuning run: data order, evaluation, best model, metrics file,
progress lines and the per-step record of loss and learning rate."""

from __future__ import annotations

import errno
import math
import os
import sys
import threading
import time
from pathlib import Path

import keras
import numpy as np

from bertkit.errors import UserError
from bertkit.progress import Cadence, format_duration
from bertkit.run_dir import read_json, write_json


class SetEpoch(keras.callbacks.Callback):
    """Makes epoch `e`'s randomness a function of `e` alone: data order and dropout masks.

    Keras checkpoints do not restore the dropout seed generators' counters, so a
    resumed run would draw other dropout masks than an uninterrupted one; each
    epoch therefore restarts every generator's counter at an epoch-derived value.
    """

    _COUNTER_STRIDE = 1_000_003  # more dropout draws than any epoch makes

    def __init__(self, batches):
        super().__init__()
        self.batches = batches

    def on_epoch_begin(self, epoch, logs=None):
        self.batches.set_epoch(epoch)
        for layer in self.model._flatten_layers():  # Keras has no public seed-state API
            for generator in getattr(layer, "_seed_generators", ()):
                seed = keras.ops.convert_to_numpy(generator.state.value)[0]
                generator.state.assign(
                    keras.ops.convert_to_tensor([seed, epoch * self._COUNTER_STRIDE],
                                                dtype=generator.state.dtype))


class Evaluate(keras.callbacks.Callback):
    """Evaluates the task's metrics on the validation split after every epoch.

    Adds them to the epoch logs as `val_<name>`, so the callbacks that follow
    (best model, early stopping, TensorBoard) see them.
    """

    def __init__(self, evaluate_fn, announce: str | None = None, stream=None):
        super().__init__()
        self.evaluate_fn = evaluate_fn
        self.announce, self.stream = announce, stream

    def on_epoch_end(self, epoch, logs=None):
        if self.announce:  # so that the bar or the log does not go silent while it runs
            stream = self.stream or sys.stdout
            if _is_terminal(stream):  # on the bar's line; Keras' final bar overwrites it
                print(f"\r{self.announce}".ljust(80), end="", file=stream, flush=True)
            else:
                print(f"epoch {epoch + 1}: {self.announce}", file=stream, flush=True)
        started = time.time()
        metrics = self.evaluate_fn(self.model)
        for name, value in metrics.items():
            if isinstance(value, (int, float)):
                logs[f"val_{name}"] = float(value)
        logs["eval_seconds"] = round(time.time() - started, 2)


class StopOnNonFiniteLoss(keras.callbacks.Callback):
    """Stops a diverging run at its first NaN or infinite loss, with one line saying so.

    Raised before the epoch ends, so neither the best weights nor the last
    epoch's checkpoint are replaced by a broken model; Keras' `TerminateOnNaN`
    only stops, and the run would then be finished and exported.
    """

    async_safe = True  # its check runs on Keras' callback thread: no step waits for it

    def __init__(self, learning_rate: float):
        super().__init__()
        self.learning_rate = learning_rate
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is None or math.isfinite(float(loss)):
            return
        kept = (f"the checkpoint of epoch {self.epoch} is kept" if self.epoch
                else "no epoch finished")
        raise UserError(f"training diverged: the loss is {float(loss)} at epoch "
                        f"{self.epoch + 1}, step {batch + 1} ({kept}); lower the learning "
                        f"rate (now {self.learning_rate:g})", key="training.learning_rate")


class TrackRun(keras.callbacks.Callback):
    """Writes metrics per epoch, keeps the best weights, and stops early.

    Its state is rebuilt from the metrics history when a run resumes, so
    resuming gives the same best epoch and patience as an uninterrupted run.
    With `writes=False` (the processes but the first of a multi-process run) it
    writes nothing, and stops when the writing process does.
    `on_best(epoch)`, if given, is called when an epoch is the best so far (the
    trainer keeps that epoch's validation outputs). `weights_of`: the model whose
    weights are saved, when it is not the one `fit` trains (a packed training model
    shares the task model's weights).
    """

    def __init__(self, run, monitor: str, mode: str, patience: int | None, history: list,
                 on_best=None, writes: bool = True, weights_of=None):
        super().__init__()
        self.weights_of = weights_of
        self.run, self.monitor, self.mode, self.patience = run, monitor, mode, patience
        self.on_best = on_best
        self.writes = writes  # False: only decides the best epoch and when to stop
        self.history = list(history)
        self._epoch_start = time.time()

    def best(self) -> dict | None:
        scored = [h for h in self.history if self.monitor in h]
        if not scored:
            return self.history[-1] if self.history else None
        choose = max if self.mode == "max" else min
        return choose(scored, key=lambda h: h[self.monitor])  # first of equals wins

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.time()

    def on_epoch_end(self, epoch, logs=None):
        record = {"epoch": epoch + 1, **{k: float(v) for k, v in (logs or {}).items()
                                        if isinstance(v, (int, float)) and math.isfinite(v)}}
        record["train_seconds"] = round(
            time.time() - self._epoch_start - record.get("eval_seconds", 0.0), 2)
        self.history.append(record)
        if self.best() is record:
            if self.writes:
                save_weights_atomically(self.weights_of or self.model, self.run.weights_file,
                                        with_optimizer=False)
                self.run.set_status("running", best_epoch=record["epoch"])
            if self.on_best is not None:
                self.on_best(record["epoch"])
        if self.writes:
            write_json(self.run.metrics_file, {"monitor": self.monitor, "epochs": self.history})
        best = self.best()
        if self.patience and record["epoch"] - best["epoch"] >= self.patience:
            self.model.stop_training = True


class TimeSteps(keras.callbacks.Callback):
    """Adds the wall seconds of training steps to `phases`: the first step, which traces
    and compiles the step function, as `first_step`, the rest of each epoch's steps (up to
    its end, before its evaluation) as `train_steps`.

    Nothing here waits for a step: on JAX Keras calls step-end callbacks on a thread once
    the step's logs are ready (`async_safe`), so the main thread keeps queueing steps.
    """

    async_safe = True

    def __init__(self, phases):
        super().__init__()
        self.phases = phases
        self._first_start = None  # when the run's first step began
        self._first_end = None  # ... and ended, while its epoch lasts
        self._epoch_start = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.perf_counter()

    def on_train_batch_begin(self, batch, logs=None):
        if self._first_start is None:
            self._first_start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if self._first_end is None and self._first_start is not None:
            self._first_end = time.perf_counter()
            self.phases.add("first_step", self._first_end - self._first_start)

    def on_epoch_end(self, epoch, logs=None):
        steps_from = self._epoch_start
        if self._first_end is not None and self._first_end > self._epoch_start:
            steps_from = self._first_end  # the epoch of the first step: after it
        self.phases.add("train_steps", time.perf_counter() - steps_from)


def save_weights_atomically(model, path, *, with_optimizer: bool = True) -> None:
    """`model.save_weights` through a temporary file: a kill never leaves a half-written file.

    `with_optimizer=False` leaves the optimizer's state out: what a finished model needs,
    a third of the bytes with Adam's two moments per weight (read it back with
    `load_model_weights`). Resuming training needs it in.

    A disk too full for the file is a `UserError`, and leaves no partial file: the space is
    checked first, because HDF5 does not fail cleanly when a write fails (it prints each
    failed write and can crash the process as it closes the file).
    """
    from bertkit.parallel.multi_process import outside_distribution

    path = Path(path)
    temporary = path.with_name(".partial." + path.name)  # Keras wants the .weights.h5 suffix
    optimizers = _optimizer_of(model)
    saved = [v for o in optimizers for v in o.variables] if with_optimizer else []
    _require_space(path, _bytes_needed(model.weights + saved))
    try:
        with outside_distribution():
            keras.saving.save_weights(model, temporary, objects_to_skip=None if with_optimizer
                                      else optimizers)
        os.replace(temporary, path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        if error.errno not in _DISK_FULL and "errno = 28" not in str(error):  # HDF5's text
            raise
        raise UserError(f"cannot save the weights: {os.strerror(errno.ENOSPC)}",
                        source=path) from None


_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}


def _bytes_needed(variables) -> int:
    """About the size of an HDF5 file of `variables`: their bytes, plus 5% and 1 MiB for
    HDF5's own records (a few hundred bytes for each of a few hundred arrays)."""
    data = 0
    for variable in variables:
        try:
            itemsize = np.dtype(variable.dtype).itemsize
        except TypeError:  # bfloat16 and the like, unknown to NumPy: 2 bytes
            itemsize = 2
        data += math.prod(variable.shape) * itemsize
    return int(data * 1.05) + (1 << 20)


def _require_space(path: Path, needed: int) -> None:
    status = os.statvfs(path.parent)
    free = status.f_bavail * status.f_frsize
    if free < needed:
        raise UserError(f"not enough free space to save the weights (about {needed / 1e6:.1f} "
                        f"MB needed, {free / 1e6:.1f} MB free)", source=path)


def load_model_weights(model, path) -> None:
    """Loads a file of `save_weights_atomically(..., with_optimizer=False)` (or one with
    the optimizer, written before) into `model`, leaving its optimizer as it is."""
    model.load_weights(path, objects_to_skip=_optimizer_of(model))


def _optimizer_of(model) -> list:
    return [model.optimizer] if getattr(model, "optimizer", None) is not None else []


class StepTensorBoard(keras.callbacks.TensorBoard):
    """Keras' `TensorBoard` for the epochs' metrics, and the loss and learning rate of the
    steps `RecordSteps` logged (`batch_loss`, `batch_learning_rate`, at the run's step
    numbers), written at each epoch's end.

    Keras writes step summaries from its step hooks with a writer it makes the default
    on the main thread at each step's begin; that cannot run on Keras' callback thread
    (on JAX it even read buffers a running step had donated), so every step would wait
    for its logs. The steps' values here are those `RecordSteps` keeps anyway.
    """

    async_safe = True

    def __init__(self, log_dir, steps: RecordSteps, **kwargs):
        super().__init__(log_dir, update_freq="epoch", write_graph=False, profile_batch=0,
                         **kwargs)
        self.steps = steps

    def on_train_batch_end(self, batch, logs=None):
        pass  # Keras' writes the step summaries; here they are written per epoch

    def on_epoch_end(self, epoch, logs=None):
        with self._train_writer.as_default():
            for record in self.steps.records:
                if record["epoch"] == epoch + 1:  # RecordSteps has just added them
                    self.summary.scalar("batch_loss", record["loss"], step=record["step"])
                    self.summary.scalar("batch_learning_rate", record["learning_rate"],
                                        step=record["step"])
        super().on_epoch_end(epoch, logs)


class AtomicBackupAndRestore(keras.callbacks.BackupAndRestore):
    """Keras' `BackupAndRestore`, each backup committed by one atomic file replace.

    Keras rewrites `latest.weights.h5` in place, then its epoch metadata: a kill
    -9 during the write left a file h5py cannot open, and one between the two
    files would pair new weights with the previous epoch number. Here each
    backup writes its weights to a new file, then replaces the metadata, which
    names that file: that replace is the commit, and older weight files are
    removed after it. A run resumes from the last committed pair. Overrides
    Keras' private `_save_model` and `_load_model`. With `writes=False` (the
    processes but the first of a multi-process run) it only restores. The last
    epoch is not backed up (a second or two of writing weights and optimizer
    state): a run killed after it resumes from the epoch before.
    """

    def __init__(self, backup_dir, writes: bool = True, **kwargs):
        super().__init__(backup_dir, **kwargs)
        self.writes = writes
        # Backs up at epoch ends only: its step-end hook does nothing, on any thread.
        self.async_safe = self.save_freq == "epoch"

    def _save_model(self):
        last = (self.params or {}).get("epochs")
        if not self.writes or (last is not None and self._current_epoch >= last):
            return  # after the last epoch the run records itself trained: nothing to resume
        os.makedirs(self.backup_dir, exist_ok=True)
        name = f"epoch-{self._current_epoch}-batch-{self._last_batch_seen}.weights.h5"
        save_weights_atomically(self.model, Path(self.backup_dir) / name)
        write_json(self._training_metadata_path, {  # the commit
            "epoch": self._current_epoch, "batch": self._last_batch_seen, "weights": name})
        for older in Path(self.backup_dir).glob("*.weights.h5"):
            if older.name != name:
                older.unlink(missing_ok=True)

    def _load_model(self):
        metadata_path = Path(self._training_metadata_path)
        if not metadata_path.exists():  # nothing committed: a fresh run
            return
        metadata = read_json(metadata_path, "checkpoint metadata")
        weights = Path(self.backup_dir) / metadata["weights"]
        if self.model.optimizer is not None and not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)  # as Keras does
        self.model.load_weights(weights)
        self.model._initial_epoch = metadata["epoch"]


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def learning_rate_at(optimizer):
    """A function of the run's step count giving `optimizer`'s rate after that many steps.

    Step callbacks ask it on Keras' callback thread, where they must not touch the model:
    on JAX, `Callback.model` writes the training state back into the variables, racing
    the step that is running (which donates those buffers), and makes the next step read
    them again. bertkit's schedule is Python arithmetic on the step (Keras feeds a
    schedule its private count of steps, which a resumed run restores); another schedule
    is called on the step; a fixed rate is read once.
    """
    from bertkit.training.optimization import WarmupLinearDecay

    schedule = getattr(optimizer, "_learning_rate", None)
    if isinstance(schedule, WarmupLinearDecay):
        return schedule.value_at
    if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
        return lambda step: float(keras.ops.convert_to_numpy(schedule(step)))
    rate = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
    return lambda step: rate


class _IntervalLoss:
    """The mean loss of the steps since the last call, from Keras' running epoch mean."""

    def __init__(self):
        self.step, self.total = 0, 0.0

    def __call__(self, step: int, running_mean: float) -> float:
        total = running_mean * step
        loss = (total - self.total) / max(step - self.step, 1)
        self.step, self.total = step, total
        return loss


class TrainingProgress(keras.callbacks.Callback):
    """A progress line at every tenth of an epoch or every 30 s, for logs, CI and `nohup`.

    `epoch 1/3  step 12/40 (30%)  loss 0.6931  lr 2.9e-05  45.2 seq/s  eta 0:42`: the loss
    is the mean over the steps since the previous line (as transformers' Trainer logs
    it), sequences/s the epoch's average so far, the ETA the rest of the epoch. Keras'
    bar shows this on a terminal; its one line per epoch says nothing until the end.
    """

    async_safe = True  # steps may end out of order on Keras' threads: see `_last_step`

    def __init__(self, steps_per_epoch: int, epochs: int, sequences_per_step: float,
                 stream=None, clock=time.monotonic):
        super().__init__()
        self.steps, self.epochs = steps_per_epoch, epochs
        self.sequences_per_step = sequences_per_step
        self.stream, self.clock = stream, clock
        self._lock = threading.Lock()

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch, self._last_step = epoch, 0
        self.cadence = Cadence(self.steps, clock=self.clock)
        self.interval_loss = _IntervalLoss()
        self.learning_rate = learning_rate_at(self.model.optimizer)  # main thread: see there

    def on_train_batch_end(self, batch, logs=None):
        step = batch + 1
        with self._lock:
            if "loss" not in (logs or {}) or step <= self._last_step:
                return
            self._last_step = step
            if self.cadence.due(step):
                self._print(step, float(logs["loss"]))

    def _print(self, step: int, running_mean: float) -> None:
        loss = self.interval_loss(step, running_mean)
        rate = step * self.sequences_per_step / max(self.cadence.elapsed(), 1e-9)
        print(f"epoch {self.epoch + 1}/{self.epochs}  step {step}/{self.steps} "
              f"({100 * step // self.steps}%)  loss {loss:.4f}  "
              f"lr {self.learning_rate(self.epoch * self.steps + step):.3g}  "
              f"{rate:.1f} seq/s  "
              f"eta {format_duration(self.cadence.elapsed() / step * (self.steps - step))}",
              file=self.stream or sys.stdout, flush=True)


class RecordSteps(keras.callbacks.Callback):
    """Records the training loss and learning rate every `every` steps, for the report.

    Each record is `{"epoch", "step", "progress", "loss", "learning_rate"}` (`progress`
    in fractional epochs, `loss` the mean since the previous record), kept in `path`
    (written at the end of each epoch, so a resumed run keeps the finished epochs').
    The learning rate is also put in every step's logs, so that Keras' TensorBoard
    callback (with `update_freq=every`) charts it with the loss. Steps may
    end out of order on Keras' callback threads: the losses are put in order at the
    epoch's end.
    """

    async_safe = True

    def __init__(self, path, steps_per_epoch: int, every: int):
        super().__init__()
        self.path, self.steps, self.every = Path(path), steps_per_epoch, max(1, every)
        self.records = None
        self._lock = threading.Lock()
        self._means = {}  # step -> Keras' running mean of the epoch's loss

    def on_epoch_begin(self, epoch, logs=None):
        if self.records is None:  # the first epoch of this process: keep the earlier ones'
            kept = read_json(self.path)["steps"] if self.path.exists() else []
            self.records = [r for r in kept if r["epoch"] <= epoch]
        self.epoch, self._means = epoch, {}
        self.learning_rate = learning_rate_at(self.model.optimizer)  # main thread: see there

    def on_train_batch_end(self, batch, logs=None):
        step = batch + 1
        if logs is None or "loss" not in logs:
            return
        # every step (Python arithmetic): TensorBoard's steps need not be these records'
        logs["learning_rate"] = self.learning_rate(self.epoch * self.steps + step)
        if step % self.every and step != self.steps:
            return
        with self._lock:
            self._means[step] = (float(logs["loss"]), logs["learning_rate"])

    def on_epoch_end(self, epoch, logs=None):
        interval_loss = _IntervalLoss()
        with self._lock:
            means, self._means = sorted(self._means.items()), {}
        for step, (running_mean, learning_rate) in means:
            loss = interval_loss(step, running_mean)
            if math.isfinite(loss):
                self.records.append({"epoch": self.epoch + 1,
                                     "step": self.epoch * self.steps + step,
                                     "progress": round(self.epoch + step / self.steps, 4),
                                     "loss": loss, "learning_rate": learning_rate})
        write_json(self.path, {"every": self.every, "steps": self.records})


class ReportToTrial(keras.callbacks.Callback):
    """Reports each epoch's validation metric to an Optuna trial; stops a trial it prunes.

    optuna-integration's `KerasPruningCallback` is a separate package, reads a metric
    name Keras computes (bertkit's `val_<metric>` comes from `Evaluate`, so this
    callback must run after it), and raises `TrialPruned` inside `fit`, which would
    leave a half-made run directory. Here a pruned trial stops at the end of the
    epoch, and `finetune` finishes it as any run (best epoch so far, metrics,
    SavedModel). The last epoch is reported but never pruned: the trial has done all
    its training by then, and its result is a complete one. Only `trial.report` and
    `trial.should_prune` are used.
    """

    def __init__(self, trial, monitor: str):
        super().__init__()
        self.trial, self.monitor = trial, monitor
        self.pruned_after = None  # the epoch (1-based) after which the trial was pruned

    def on_epoch_end(self, epoch, logs=None):
        value = (logs or {}).get(self.monitor)
        if value is None or not math.isfinite(value):
            return
        self.trial.report(float(value), step=epoch + 1)
        if epoch + 1 < self.params.get("epochs", 0) and self.trial.should_prune():
            self.pruned_after = epoch + 1
            self.model.stop_training = True
