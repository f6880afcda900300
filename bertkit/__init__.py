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
    "embed",
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


def embed(source, texts, *, token_level: bool = False, batch_size: int = 32, **options):
    """Vectors of `texts` from any backbone preset or finished run (`bertkit embed`).

    `options` (pooling, layers, combine, normalize, sequence_length) are
    `bertkit.serving.embedder.Embedder.load`'s; a sentence-transformers folder's own pooling
    and normalization are the defaults. Returns a `(texts, dimension)` float32 array, or
    with `token_level` each text's word pieces with offsets and vectors.

    Example:
        >>> import tempfile
        >>> from bertkit.testing.tiny import write_tiny_checkpoint
        >>> folder = write_tiny_checkpoint(tempfile.mkdtemp())
        >>> embed(folder, ["a fine film", "dull"], pooling="cls").shape
        (2, 32)
    """
    from bertkit.serving.embedder import Embedder

    embedder = Embedder.load(source, **options)
    if token_level:
        return embedder.embed_tokens(texts, batch_size)
    return embedder.embed(texts, batch_size)


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
