"""Averaging the weights of the last epochs (`training.average_last_epochs`, SWA-style).

Izmailov et al. 2018 ("Averaging weights leads to wider optima") average the weights an
optimizer passes through late in training; the mean sits nearer the centre of a flat region
than any one of them. Here the weights at the end of each epoch are kept (copies in host
memory: the training weights are never changed), and when an epoch is the best so far
(`TrackRun`, by the validation metric, else the loss) the run's best weights become the mean
of the N epochs ending at it: the best epoch and the N - 1 before it (fewer before epoch N).

Why those N and not the last N: bertkit keeps the best epoch's model, with early stopping or
without, so averaging keeps that choice and smooths around it; the epochs after the best are
those early stopping judged no better, and a run stopped `patience` epochs later would
otherwise keep a mean of epochs it rejected.

Resuming: each epoch's copy is also written to the run's `checkpoint/averaged/` (an `.npz`,
through a temporary file), the last N kept, so a run killed and resumed reads back the
epochs before its checkpoint and averages as an uninterrupted run would.
"""

from __future__ import annotations

import collections
import os
from pathlib import Path

import numpy as np

from bertkit.training.weights import save_weights_atomically


class EpochWindow:
    """The weights at the end of the last `size` epochs, and their mean saved as best.

    Example:
        >>> import keras, tempfile
        >>> model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
        >>> window = EpochWindow(2, tempfile.mkdtemp())
        >>> for epoch, value in enumerate([1.0, 2.0, 4.0], start=1):
        ...     _ = model.layers[0].kernel.assign([[value]])
        ...     window.add(epoch, model)
        >>> window.save_mean(model, Path(tempfile.mkdtemp()) / "best.weights.h5")
        [2, 3]
        >>> float(model.layers[0].kernel.numpy()[0, 0])  # the training weights, as they were
        4.0
    """

    def __init__(self, size: int, folder, finished_epochs: int = 0):
        self.size, self.folder = size, Path(folder)
        self.epochs = collections.deque(maxlen=size)  # (epoch, [arrays]), oldest first
        for epoch in range(max(1, finished_epochs - size + 1), finished_epochs + 1):
            with np.load(self._file(epoch)) as saved:  # a resumed run's epochs before it
                self.epochs.append((epoch, [saved[f"w{i}"] for i in range(len(saved.files))]))

    def add(self, epoch: int, model) -> None:
        """Keeps `model`'s weights at the end of `epoch` (1-based), in memory and on disk."""
        values = [np.array(variable.numpy()) for variable in _averaged(model)]
        self.epochs.append((epoch, values))
        self.folder.mkdir(parents=True, exist_ok=True)
        temporary = self.folder / f".partial.epoch-{epoch}.npz"
        np.savez(temporary, **{f"w{i}": value for i, value in enumerate(values)})
        os.replace(temporary, self._file(epoch))
        for old in self.folder.glob("epoch-*.npz"):
            if int(old.stem.split("-")[1]) <= epoch - self.size:
                old.unlink(missing_ok=True)

    def save_mean(self, model, path) -> list[int]:
        """Saves the mean of the kept epochs' weights to `path` as `model`'s weights (the
        training weights are put back after); returns the epochs averaged."""
        variables = _averaged(model)
        for index, variable in enumerate(variables):
            mean = np.mean([values[index] for _, values in self.epochs], axis=0, dtype=np.float64)
            variable.assign(mean.astype(variable.dtype))
        save_weights_atomically(model, path, with_optimizer=False)
        for variable, value in zip(variables, self.epochs[-1][1], strict=True):
            variable.assign(value)
        return [epoch for epoch, _ in self.epochs]

    def _file(self, epoch: int) -> Path:
        return self.folder / f"epoch-{epoch}.npz"


def _averaged(model) -> list:
    """The weights averaged: every floating-point weight (a seed generator's is not one)."""
    return [v for v in model.weights if np.dtype(v.dtype).kind == "f"]


def epoch_window(run, training, finished_epochs: int, writes: bool) -> EpochWindow | None:
    """The run's `EpochWindow` under `training.average_last_epochs` (None when 0, and in the
    processes of a multi-process job that write nothing)."""
    if not training.average_last_epochs or not writes:
        return None
    return EpochWindow(
        training.average_last_epochs, run.checkpoint_dir / "averaged", finished_epochs
    )


def averaged_line(epochs: list[int], best_epoch: int | None) -> str:
    """The one line a run prints about its averaged model.

    Example:
        >>> averaged_line([3, 4, 5], 5)  # doctest: +ELLIPSIS
        'the model is the mean of the weights at the end of epochs 3-5 (...), ... epoch, 5'
    """
    span = f"epochs {epochs[0]}-{epochs[-1]}" if len(epochs) > 1 else f"epoch {epochs[0]}"
    return (
        f"the model is the mean of the weights at the end of {span} "
        f"(training.average_last_epochs), ending at the best epoch, {best_epoch}"
    )
