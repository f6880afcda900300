"""bertkit: fine-tune pretrained BERT models with Keras.

Public API::

    import bertkit
    model = bertkit.finetune("recipes/quickstart.yaml", training={"epochs": 1})
    model = bertkit.load("runs/quickstart")
    model.predict(["A warm, funny film."])

Importing bertkit is cheap: TensorFlow and Keras load on first use.
"""

import os

# TensorFlow leaves its oneDNN CPU kernels off on CPUs without AVX-512 unless asked;
# they double CPU matmul throughput there. Only effective before TensorFlow is imported.
# (TensorFlow's log level is the user's: only the `bertkit` command quiets it.)
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

from bertkit.errors import UserError  # noqa: E402
from bertkit.recipes.recipe import Recipe, load_recipe  # noqa: E402
from bertkit.task import (  # noqa: E402
    DataFiles,
    Features,
    NoOptions,
    PredictOption,
    Task,
    string_inputs,
)
from bertkit.training.preemption import Preempted  # noqa: E402

__version__ = "0.1.0"
__all__ = [
    "DataFiles",
    "Features",
    "NoOptions",
    "PredictOption",
    "Preempted",
    "Recipe",
    "Task",
    "UserError",
    "finetune",
    "load",
    "load_recipe",
    "string_inputs",
    "tune",
]


def finetune(recipe, **kwargs):
    """Fine-tunes a recipe; see `bertkit.training.trainer.finetune`."""
    from bertkit.training.trainer import finetune as _finetune

    return _finetune(recipe, **kwargs)


def tune(recipe, **kwargs):
    """Hyperparameter search over a recipe's `search:` section; see `bertkit.tuning.tuner.tune`."""
    from bertkit.tuning.tuner import tune as _tune

    return _tune(recipe, **kwargs)


def load(run_dir):
    """Loads a fine-tuned model from its run directory.

    See `bertkit.serving.finetuned.FineTunedModel`.
    """
    from bertkit.run_dir import RunDirectory

    RunDirectory.open(run_dir)  # a wrong path is reported before Keras and TensorFlow load
    from bertkit.serving.finetuned import FineTunedModel

    return FineTunedModel.load(run_dir)
