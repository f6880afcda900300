"""Saving and restoring weights: whole files only, the disk's space checked first.

`save_weights_atomically` writes through a temporary file (a kill never leaves a
half-written file), and `AtomicBackupAndRestore` commits each epoch's backup by one
atomic file replace, so a killed run resumes from its last whole checkpoint.
"""

from __future__ import annotations

import errno
import math
import os
from pathlib import Path

import keras
import numpy as np

from bertkit.errors import UserError
from bertkit.run_dir import read_json, write_json

_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}


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
