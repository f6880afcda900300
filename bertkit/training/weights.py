"""Saving and restoring weights: whole files only, the disk's space checked first.

`save_weights_atomically` writes through a temporary file (a kill never leaves a
half-written file); the run's checkpoint commits each save by one atomic file replace
(`bertkit.training.checkpointing`), so a killed run resumes from its last whole checkpoint.
"""

from __future__ import annotations

import errno
import math
import os
from pathlib import Path

import keras
import numpy as np

from bertkit.errors import UserError

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
            keras.saving.save_weights(
                model, temporary, objects_to_skip=None if with_optimizer else optimizers
            )
        os.replace(temporary, path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        if error.errno not in _DISK_FULL and "errno = 28" not in str(error):  # HDF5's text
            raise
        raise UserError(
            f"cannot save the weights: {os.strerror(errno.ENOSPC)}", source=path
        ) from None


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
        raise UserError(
            f"not enough free space to save the weights (about {needed / 1e6:.1f} "
            f"MB needed, {free / 1e6:.1f} MB free)",
            source=path,
        )


def load_model_weights(model, path) -> None:
    """Loads a file of `save_weights_atomically(..., with_optimizer=False)` (or one with
    the optimizer, written before) into `model`, leaving its optimizer as it is."""
    model.load_weights(path, objects_to_skip=_optimizer_of(model))


def _optimizer_of(model) -> list:
    return [model.optimizer] if getattr(model, "optimizer", None) is not None else []
