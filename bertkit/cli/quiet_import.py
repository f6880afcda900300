"""TensorFlow imported without its start-up chatter (its own module: `bertkit.cli` imports
the command modules, and `tune` imports TensorFlow late, so a helper there would be a cycle)."""

from __future__ import annotations

import os


def import_tensorflow_quietly() -> None:
    """Imports TensorFlow with the C++ start-up chatter (CUDA probing, oneDNN notices) hidden.

    TensorFlow logs those lines from C++ before `TF_CPP_MIN_LOG_LEVEL` takes effect; on a
    terminal they bury the one line a user error prints. Only the import is silenced.
    On the JAX backend too: keras-hub imports TensorFlow wherever it is installed.
    """
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            try:
                import tensorflow  # noqa: F401
            except ImportError:
                pass  # reported where TensorFlow is used
    finally:
        os.dup2(saved, 2)
        os.close(saved)
