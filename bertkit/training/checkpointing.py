"""The run's checkpoint (`RunCheckpoint`) and `fit` resumed from it, mid-epoch included
(`fit_from`).

Why not Keras' `BackupAndRestore`: with `save_freq=N` it saves mid-epoch, but its restore
sets only the model's `_initial_epoch` (keras/src/callbacks/backup_and_restore.py), so a run
resumed from step k of epoch e trains epoch e again from step 0: k steps twice, on other
batches than an uninterrupted run's, the epoch's mean loss restarted. Its weights file is
rewritten in place (a kill mid-write leaves a file h5py cannot open), and what the weights
file does not hold is lost: the metrics' running sums (the epoch's mean loss in the logs)
and the dropout seed generators' counters. Here:

- `RunCheckpoint` saves at each epoch's end (but the last), every `checkpoint_every_steps`
  steps of the run, every `checkpoint_every_minutes`, and at the end of the step during
  which SIGTERM came (`bertkit.training.preemption`): the weights with the optimizer's state
  (its step count drives the learning-rate schedule; its accumulators hold a part-accumulated
  update) in a new file, then the commit, one atomic JSON write naming that file with the
  position (epoch, steps done), the model's metric variables and seed-generator states, and
  what step callbacks keep of the epoch so far (`RecordSteps`' loss records).
- `fit_from` resumes at that position: for step k > 0 of epoch e, one `fit` over the rest of
  epoch e (its batches from step k, `TrainingBatches.as_dataset(first_step=k)`: a batch is
  a function of its epoch and step), then one over epochs e + 1 on. `OneTraining` makes the
  two calls one training for the callbacks: one `on_train_begin` and `on_train_end`, the
  resumed epoch's steps numbered as in an uninterrupted run (progress, records, TensorBoard).
"""

from __future__ import annotations

import time
from pathlib import Path

import keras
import numpy as np

from bertkit.run_dir import read_json, write_json
from bertkit.training.callbacks import seed_generators
from bertkit.training.preemption import Preempted
from bertkit.training.weights import save_weights_atomically

METADATA = "training_metadata.json"  # the commit: names the weights file it goes with


class RunCheckpoint(keras.callbacks.Callback):
    """Saves the training state to `folder` and restores it when a run resumes.

    Args:
        folder: the run's `checkpoint/`.
        writes: False in the processes of a multi-process job but the first: they restore
            what process 0 saved, and save nothing.
        every_steps, every_minutes: save also every N steps of the run (step counts from
            the run's first step, so the same steps after a resume) or M minutes.
        keeps: {name: callback} whose `checkpoint_state()` is saved with a checkpoint taken
            mid-epoch and given back to its `resume_epoch(step, state)` on resuming there.
        sigterm: a `SigtermWatch`; its request stops training here (`Preempted`).

    Checks and saves happen in `on_train_batch_begin`: on the main thread (Keras runs step
    ends on threads on JAX), where the model holds the state after the steps before it.
    """

    def __init__(
        self,
        folder,
        *,
        writes: bool = True,
        every_steps: int | None = None,
        every_minutes: float | None = None,
        keeps: dict | None = None,
        sigterm=None,
        clock=time.monotonic,
    ):
        super().__init__()
        self.folder, self.writes, self.keeps = Path(folder), writes, dict(keeps or {})
        self.every_steps = every_steps
        self.every_seconds = every_minutes * 60 if every_minutes else None
        self.sigterm, self.clock = sigterm, clock
        self.wait_for_step_callbacks = lambda: None  # `OneTraining` sets it
        metadata = self.folder / METADATA
        self.committed = read_json(metadata, "checkpoint metadata") if metadata.exists() else None
        self.position = (0, 0)  # (epoch, steps of it done) to resume at
        if self.committed:
            self.position = (int(self.committed["epoch"]), int(self.committed.get("step", 0)))
        self._saved_at, self._saved_time, self.epoch = self.position, clock(), 0

    @classmethod
    def of_run(cls, run, training, *, writes: bool = True, sigterm=None) -> RunCheckpoint:
        """The checkpoint of `run` (a `RunDirectory`), saved as `training` (the recipe's
        `TrainingConfig`) asks."""
        return cls(
            run.checkpoint_dir,
            writes=writes,
            every_steps=training.checkpoint_every_steps,
            every_minutes=training.checkpoint_every_minutes,
            sigterm=sigterm,
        )

    def on_train_begin(self, logs=None):
        self._saved_time = self.clock()
        if self.committed:
            optimizer = self.model.optimizer
            if optimizer is not None and not optimizer.built:
                optimizer.build(self.model.trainable_variables)  # its variables, to load into
            self.model.load_weights(self.folder / self.committed["weights"])

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        if self.committed and self.position[1] and epoch == self.position[0]:
            self._restore_epoch_state(self.model, self.committed, self.position[1])

    def on_train_batch_begin(self, batch, logs=None):
        here = (self.epoch, batch)
        if batch and here != self._saved_at and self._due(batch):
            self._save(*here)
        if self.sigterm is not None and self.sigterm.stop_at(self._steps_before(batch)):
            if here != self._saved_at:
                self._save(*here)
            if here == (0, 0):
                raise Preempted(where="before its first step")
            raise Preempted(self.epoch + 1, batch) if batch else Preempted(self.epoch, 0)

    def on_epoch_end(self, epoch, logs=None):
        last = (self.params or {}).get("epochs")
        if last is None or epoch + 1 < last:  # after the last, the run records itself trained
            self._save(epoch + 1, 0)

    def _steps_before(self, step: int) -> int:
        """Steps of the run done before step `step` (0-based) of the current epoch."""
        return self.epoch * self.params["steps"] + step

    def _due(self, step: int) -> bool:
        if self.every_steps and self._steps_before(step) % self.every_steps == 0:
            return True
        return self.every_seconds is not None and (
            self.clock() - self._saved_time >= self.every_seconds
        )

    def _save(self, epoch: int, step: int) -> None:
        """Weights and optimizer to a new file, then the commit; older files go after it."""
        self._saved_at, self._saved_time = (epoch, step), self.clock()
        if not self.writes:
            return
        self.wait_for_step_callbacks()  # their records of the steps so far are all in
        model = self.model  # on JAX: the training state written back into the variables
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"epoch-{epoch}-step-{step}.weights.h5"
        save_weights_atomically(model, self.folder / name)
        record = {"epoch": epoch, "step": step, "weights": name}
        if step:  # the epoch's running state: after an epoch's end Keras resets the metrics
            record["metrics"] = _values(model.metrics_variables)
            record["seeds"] = _values(g.state for g in seed_generators(model))
            record["callbacks"] = {
                key: callback.checkpoint_state() for key, callback in self.keeps.items()
            }
        write_json(self.folder / METADATA, record)  # the commit
        for older in self.folder.glob("*.weights.h5"):
            if older.name != name:
                older.unlink(missing_ok=True)

    def _restore_epoch_state(self, model, saved: dict, step: int) -> None:
        """After Keras reset the metrics and `SetEpoch` the seeds at the epoch's start: the
        sums and counters after `step` steps of it, as the checkpoint saved them."""
        _assign(model.metrics_variables, saved["metrics"])
        _assign([g.state for g in seed_generators(model)], saved["seeds"])
        for key, state in saved.get("callbacks", {}).items():
            if key in self.keeps:
                self.keeps[key].resume_epoch(step, state)


def _values(variables) -> list:
    """Variables' values as JSON keeps them exactly (a float32 as a float64 is exact)."""
    return [keras.ops.convert_to_numpy(v.value).tolist() for v in variables]


def _assign(variables, values) -> None:
    for variable, value in zip(variables, values, strict=True):
        variable.assign(np.asarray(value, dtype=variable.dtype))


class OneTraining(keras.callbacks.CallbackList):
    """Keras' callback list, over `fit_from`'s one or two `fit` calls as over one training.

    `on_train_begin` reaches the callbacks once, `on_train_end` when `end` is called, and
    the steps of a fit over the rest of an epoch are numbered from `first_step`, as in an
    uninterrupted run. Keras takes a `CallbackList` given to `fit` as it is.
    """

    def __init__(self, callbacks, *, first_step: int, model, verbose: int, **params):
        super().__init__(
            callbacks,
            add_history=True,
            add_progbar=verbose != 0,
            model=model,
            verbose=verbose,
            **params,
        )
        self.first_step, self._began, self._end_logs = first_step, False, None

    def on_train_begin(self, logs=None):
        if not self._began:
            self._began = True
            super().on_train_begin(logs)

    def on_train_end(self, logs=None):
        self._end_logs = logs  # for `end`, after the last fit

    def end(self) -> None:
        super().on_train_end(self._end_logs)

    def on_train_batch_begin(self, batch, logs=None):
        super().on_train_batch_begin(batch + self.first_step, logs)

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch + self.first_step, logs)

    def wait_for_step_callbacks(self) -> None:
        """Waits for the step-end callbacks Keras runs on threads (JAX)."""
        if self._async_train:
            self._flush_futures()


def fit_from(
    trained, batches, callbacks: list, checkpoint: RunCheckpoint, *, epochs: int, verbose: int
) -> None:
    """Keras `fit` of `trained` on `batches` (a `TrainingBatches`) with `callbacks` (among
    them `checkpoint`), from `checkpoint.position` to the end of epoch `epochs`."""
    epoch, step = checkpoint.position
    listed = OneTraining(
        callbacks,
        first_step=step,
        model=trained,
        verbose=verbose,
        epochs=epochs,
        steps=len(batches),
    )
    checkpoint.wait_for_step_callbacks = listed.wait_for_step_callbacks
    if step:  # the rest of the interrupted epoch
        # On TensorFlow Keras makes the compiled metrics' variables as it traces the first
        # step: made now, they take the checkpoint's running sums before that step.
        trained._symbolic_build(data_batch=batches.batch(step, epoch))
        trained.fit(
            batches.as_dataset(first_step=step),
            initial_epoch=epoch,
            epochs=epoch + 1,
            callbacks=listed,
            shuffle=False,
        )
        epoch, listed.first_step = epoch + 1, 0
        if trained.stop_training:
            epoch = epochs
    if epoch < epochs:
        trained.fit(
            batches.as_dataset(),
            initial_epoch=epoch,
            epochs=epochs,
            callbacks=listed,
            shuffle=False,
        )  # shuffled per epoch by the batches
    listed.end()
