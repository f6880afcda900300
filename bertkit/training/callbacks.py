"""Keras callbacks of a fine-tuning run's epochs: data order, divergence, evaluation, and
the metrics file, best weights and early stopping (`TrackRun`).

The callbacks of each step are in `bertkit.training.step_callbacks`, weight saving and
the resumable backup in `bertkit.training.weights`.
"""

from __future__ import annotations

import math
import sys
import time

import keras

from bertkit.errors import UserError
from bertkit.run_dir import write_json
from bertkit.training.weights import save_weights_atomically


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
        for generator in seed_generators(self.model):
            seed = keras.ops.convert_to_numpy(generator.state.value)[0]
            generator.state.assign(
                keras.ops.convert_to_tensor(
                    [seed, epoch * self._COUNTER_STRIDE], dtype=generator.state.dtype
                )
            )


def seed_generators(model) -> list:
    """The `keras.random.SeedGenerator`s of `model`'s layers (dropout's), in layer order."""
    return [
        generator
        for layer in model._flatten_layers()  # no public seed-state API
        for generator in getattr(layer, "_seed_generators", ())
    ]


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
        kept = (
            f"the checkpoint of epoch {self.epoch} is kept" if self.epoch else "no epoch finished"
        )
        raise UserError(
            f"training diverged: the loss is {float(loss)} at epoch "
            f"{self.epoch + 1}, step {batch + 1} ({kept}); lower the learning "
            f"rate (now {self.learning_rate:g})",
            key="training.learning_rate",
        )


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

    `floor`: the monitor's value for a model that learned nothing (the task's
    `baseline`, e.g. entity F1 0 for tagging every word O). The patience counts only
    once the best epoch beats it: on small data the validation metric can sit at the
    floor for the first epochs, and stopping there keeps a model that predicts nothing.

    `average` (an `EpochWindow`, `training.average_last_epochs`): the best weights saved are
    the mean of the epochs ending at the best one (`bertkit.training.averaging`).
    """

    def __init__(
        self,
        run,
        monitor: str,
        mode: str,
        patience: int | None,
        history: list,
        on_best=None,
        writes: bool = True,
        weights_of=None,
        floor: float | None = None,
        average=None,
    ):
        super().__init__()
        self.average = average
        self.weights_of, self.floor = weights_of, floor
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
        record = {
            "epoch": epoch + 1,
            **{
                k: float(v)
                for k, v in (logs or {}).items()
                if isinstance(v, (int, float)) and math.isfinite(v)
            },
        }
        record["train_seconds"] = round(
            time.time() - self._epoch_start - record.get("eval_seconds", 0.0), 2
        )
        self.history.append(record)
        model = self.weights_of or self.model
        if self.average is not None:
            self.average.add(record["epoch"], model)
        if self.best() is record:
            if self.writes:
                self._save_best(model, record["epoch"])
            if self.on_best is not None:
                self.on_best(record["epoch"])
        if self.writes:
            write_json(self.run.metrics_file, {"monitor": self.monitor, "epochs": self.history})
        if self.patience_ran_out(record):
            self.model.stop_training = True

    def _save_best(self, model, epoch: int) -> None:
        """The best weights (or the mean ending at them) to the run's weights file."""
        if self.average is None:
            save_weights_atomically(model, self.run.weights_file, with_optimizer=False)
            self.run.set_status("running", best_epoch=epoch)
            return
        averaged = self.average.save_mean(model, self.run.weights_file)
        self.run.set_status("running", best_epoch=epoch, averaged_epochs=averaged)

    def patience_ran_out(self, record: dict) -> bool:
        """Whether `patience` epochs up to `record` brought nothing better than the best,
        once the best has left the floor."""
        best = self.best()
        if not self.patience or record["epoch"] - best["epoch"] < self.patience:
            return False
        value = best.get(self.monitor)
        if self.floor is None or value is None:
            return True
        return value > self.floor if self.mode == "max" else value < self.floor


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
