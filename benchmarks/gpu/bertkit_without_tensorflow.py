"""`bertkit ARGS...` as on a GPU machine without TensorFlow, on JAX: imports of TensorFlow and
tf-text fail as if they were not installed, even where they are (the CPU dry run)."""

import os
import sys

sys.modules["tensorflow"] = None
sys.modules["tensorflow_text"] = None
os.environ["KERAS_BACKEND"] = "jax"

from bertkit.cli import run  # noqa: E402

sys.argv = ["bertkit", *sys.argv[1:]]
run()
