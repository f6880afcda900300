"""Re-initialising the backbone's top layers before fine-tuning (`training.reinit_top_layers`).

Zhang et al. 2021, "Revisiting few-sample BERT fine-tuning": the top layers of a pretrained
BERT are specialised to its pretraining objectives, and on a few thousand examples a task
learns faster from fresh top layers than from those. As in their code (and transformers'
`BertPreTrainedModel._init_weights`), kernels and embeddings are drawn from a normal
distribution with standard deviation 0.02, biases and LayerNorm offsets set to 0, LayerNorm
scales to 1; the pooler (`pooled_dense`, read by heads on [CLS]) is re-initialised with them.

The values come from NumPy's generator seeded with the run's seed, so that a run is
reproduced exactly on TensorFlow and JAX alike, whatever the backend's own random state.
"""

from __future__ import annotations

import numpy as np

from bertkit.errors import UserError

KEY = "training.reinit_top_layers"
STANDARD_DEVIATION = 0.02  # BERT's initializer_range


def reinitialize_top_layers(backbone, count: int, seed: int, source=None) -> list[str]:
    """Draws the weights of `backbone`'s top `count` transformer layers and pooler afresh.

    Args:
        backbone: a keras-hub `BertBackbone` (its `transformer_layers` and `pooled_dense`).
        count: how many layers, from the top; 0 changes nothing.
        seed: the run's seed: the same seed draws the same weights.
        source: the recipe, named by the error when `count` exceeds the backbone's layers.

    Returns:
        The names of the layers re-initialised, top layers first in order, then the pooler.

    Example:
        >>> import keras_hub
        >>> backbone = keras_hub.models.BertBackbone(vocabulary_size=10, num_layers=2,
        ...     num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=8)
        >>> reinitialize_top_layers(backbone, 1, seed=42)
        ['transformer_layer_1', 'pooled_dense']
        >>> reinitialize_top_layers(backbone, 3, seed=42)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        bertkit.errors.UserError: training.reinit_top_layers: must be at most 2, ...
    """
    layers = list(backbone.transformer_layers)
    if problem := count_problem(count, len(layers)):
        raise UserError(problem, source=source, key=KEY)
    if count == 0:
        return []
    chosen = layers[len(layers) - count :] + [backbone.pooled_dense]
    generator = np.random.default_rng(seed)
    for layer in chosen:
        for variable in layer.weights:
            variable.assign(fresh_values(variable.name, tuple(variable.shape), generator))
    return [layer.name for layer in chosen]


def count_problem(count: int, num_layers: int) -> str | None:
    """What is wrong with re-initialising `count` of `num_layers` layers, or None (the rule
    `reinitialize_top_layers` and `bertkit check` share).

    Example:
        >>> count_problem(7, 6)
        "must be at most 6, the backbone's transformer layers, got 7"
    """
    if count > num_layers:
        return f"must be at most {num_layers}, the backbone's transformer layers, got {count}"
    return None


def fresh_values(name: str, shape: tuple, generator: np.random.Generator) -> np.ndarray:
    """A new value for a weight called `name` (Keras's variable name), as BERT initialises it.

    Example:
        >>> generator = np.random.default_rng(0)
        >>> fresh_values("gamma", (2,), generator).tolist()
        [1.0, 1.0]
        >>> fresh_values("bias", (2,), generator).tolist()
        [0.0, 0.0]
        >>> round(float(fresh_values("kernel", (64, 64), generator).std()), 2)
        0.02
    """
    if name == "gamma":  # LayerNorm scale
        return np.ones(shape, np.float32)
    if name in ("beta", "bias"):  # LayerNorm offset, biases
        return np.zeros(shape, np.float32)
    return generator.normal(0.0, STANDARD_DEVIATION, shape).astype(np.float32)
