"""Callbacks of every training step, none of which makes a step wait for its logs.

On JAX, Keras calls step-end callbacks on a thread once the step's logs are ready
(`async_safe`), so the main thread keeps queueing steps: `TimeSteps` (wall seconds of
the steps), `TrainingProgress` (a progress line now and then), `RecordSteps` (loss and
learning rate every N steps, for the report) and `StepTensorBoard` (those records as
TensorBoard charts, written per epoch).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from pathlib import Path

import keras

from bertkit.progress import Cadence, format_duration
from bertkit.run_dir import read_json, write_json


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
            self._first_end = self.phases.first_step_ended = time.perf_counter()
            self.phases.add("first_step", self._first_end - self._first_start)

    def on_epoch_end(self, epoch, logs=None):
        steps_from = self._epoch_start
        if self._first_end is not None and self._first_end > self._epoch_start:
            steps_from = self._first_end  # the epoch of the first step: after it
        self.phases.add("train_steps", time.perf_counter() - steps_from)


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

    def __init__(
        self,
        steps_per_epoch: int,
        epochs: int,
        sequences_per_step: float,
        stream=None,
        clock=time.monotonic,
    ):
        super().__init__()
        self.steps, self.epochs = steps_per_epoch, epochs
        self.sequences_per_step = sequences_per_step
        self.stream, self.clock = stream, clock
        self._lock = threading.Lock()

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch, self._last_step, self._first_step = epoch, 0, 0
        self.cadence = Cadence(self.steps, clock=self.clock)
        self.interval_loss = _IntervalLoss()
        self.learning_rate = learning_rate_at(self.model.optimizer)  # main thread: see there

    def checkpoint_state(self) -> dict:
        """Where the epoch's last line was, for a checkpoint in the middle of the epoch."""
        with self._lock:
            return {"printed": [self.interval_loss.step, self.interval_loss.total]}

    def resume_epoch(self, step: int, state: dict) -> None:
        """Goes on after `step` steps of the epoch: the next line's loss is the mean since
        the line before the interruption, its rate and ETA those of the steps from here."""
        self.interval_loss.step, self.interval_loss.total = state["printed"]
        self.cadence.last_done = self.interval_loss.step
        self._last_step = self._first_step = step

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
        done, elapsed = step - self._first_step, max(self.cadence.elapsed(), 1e-9)
        print(
            f"epoch {self.epoch + 1}/{self.epochs}  step {step}/{self.steps} "
            f"({100 * step // self.steps}%)  loss {loss:.4f}  "
            f"lr {self.learning_rate(self.epoch * self.steps + step):.3g}  "
            f"{done * self.sequences_per_step / elapsed:.1f} seq/s  "
            f"eta {format_duration(elapsed / done * (self.steps - step))}",
            file=self.stream or sys.stdout,
            flush=True,
        )


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

    def checkpoint_state(self) -> dict:
        """The epoch's records so far, for a checkpoint in the middle of the epoch."""
        with self._lock:
            return {"means": [[step, *mean] for step, mean in sorted(self._means.items())]}

    def resume_epoch(self, step: int, state: dict) -> None:
        with self._lock:
            self._means = {record[0]: tuple(record[1:]) for record in state["means"]}

    def on_epoch_end(self, epoch, logs=None):
        interval_loss = _IntervalLoss()
        with self._lock:
            means, self._means = sorted(self._means.items()), {}
        for step, (running_mean, learning_rate) in means:
            loss = interval_loss(step, running_mean)
            if math.isfinite(loss):
                self.records.append(
                    {
                        "epoch": self.epoch + 1,
                        "step": self.epoch * self.steps + step,
                        "progress": round(self.epoch + step / self.steps, 4),
                        "loss": loss,
                        "learning_rate": learning_rate,
                    }
                )
        write_json(self.path, {"every": self.every, "steps": self.records})


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
        super().__init__(log_dir, update_freq="epoch", write_graph=False, profile_batch=0, **kwargs)
        self.steps = steps

    def on_train_batch_end(self, batch, logs=None):
        pass  # Keras' writes the step summaries; here they are written per epoch

    def on_epoch_end(self, epoch, logs=None):
        with self._train_writer.as_default():
            for record in self.steps.records:
                if record["epoch"] == epoch + 1:  # RecordSteps has just added them
                    self.summary.scalar("batch_loss", record["loss"], step=record["step"])
                    self.summary.scalar(
                        "batch_learning_rate", record["learning_rate"], step=record["step"]
                    )
        super().on_epoch_end(epoch, logs)
