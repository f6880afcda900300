"""keras-hub `BertBackbone` weights and sizes under Hugging Face BERT's names: the inverse of
keras-hub's converter (`keras_hub/src/utils/transformers/convert_bert.py`), which reads them.

keras-hub keeps a Dense kernel as (in, out) and an attention projection's as (hidden, heads,
head size) or (heads, head size, hidden); a `torch.nn.Linear` weight is (out, in). So a
kernel is flattened to (in, out) and transposed, an attention bias flattened to (hidden,).
Used by the transformers-format export (`bertkit.serving.transformers_export`); reading such
a folder back is keras-hub's converter's job (`bertkit.model.checkpoints`).
"""

from __future__ import annotations

import numpy as np

# keras-hub's attention projections -> Hugging Face module names under `encoder.layer.N.`.
_ATTENTION = {
    "query_dense": "attention.self.query",
    "key_dense": "attention.self.key",
    "value_dense": "attention.self.value",
    "output_dense": "attention.output.dense",
}
# keras-hub's feed-forward layers and layer norms -> Hugging Face module names.
_LAYER_PARTS = {
    "_feedforward_intermediate_dense": "intermediate.dense",
    "_feedforward_output_dense": "output.dense",
    "_self_attention_layer_norm": "attention.output.LayerNorm",
    "_feedforward_layer_norm": "output.LayerNorm",
}


def _array(variable) -> np.ndarray:
    import keras

    return np.ascontiguousarray(keras.ops.convert_to_numpy(variable), dtype=np.float32)


def linear_tensors(layer, name: str) -> dict[str, np.ndarray]:
    """A Dense or EinsumDense layer as `torch.nn.Linear`'s `{name}.weight` (out, in) and
    `{name}.bias` (out,).

    Example:
        >>> import keras
        >>> dense = keras.layers.Dense(3)
        >>> dense.build((None, 2))
        >>> {key: value.shape for key, value in linear_tensors(dense, "classifier").items()}
        {'classifier.weight': (3, 2), 'classifier.bias': (3,)}
    """
    bias = _array(layer.bias).reshape(-1)  # (out,)
    kernel = _array(layer.kernel).reshape(-1, bias.size)  # (in, out)
    return {f"{name}.weight": np.ascontiguousarray(kernel.T), f"{name}.bias": bias}


def _layer_norm_tensors(layer, name: str) -> dict[str, np.ndarray]:
    return {f"{name}.weight": _array(layer.gamma), f"{name}.bias": _array(layer.beta)}


def _pooler_tensors(model) -> dict[str, np.ndarray]:
    """The pooler; zeros for a task model that does not use it (tagging, span QA: Keras
    keeps only the layers on the way to the outputs): transformers' token classification
    and question answering models have no pooler, and the zeros make the folder a complete
    BERT checkpoint that keras-hub's converter reads back (its pooled output is then 0)."""
    if "pooled_dense" in {layer.name for layer in model.layers}:
        return linear_tensors(model.get_layer("pooled_dense"), "pooler.dense")
    hidden = model.get_layer("token_embedding").embeddings.shape[-1]
    zeros = np.zeros((hidden, hidden), np.float32)
    return {"pooler.dense.weight": zeros, "pooler.dense.bias": zeros[0].copy()}


def backbone_tensors(model, num_layers: int, prefix: str = "bert.") -> dict[str, np.ndarray]:
    """The BERT encoder and pooler of `model` (a `BertBackbone`, or a task model built on one,
    whose layers keep the backbone's names) as Hugging Face names, float32.

    Args:
        model: has the layers `token_embedding`, `position_embedding`, `segment_embedding`,
            `embeddings_layer_norm`, `transformer_layer_{i}` and, if it uses the pooler,
            `pooled_dense`.
        num_layers: the number of transformer layers.
        prefix: put before every name (`bert.` in transformers' task models).
    """
    tensors = {
        "embeddings.word_embeddings.weight": _array(model.get_layer("token_embedding").embeddings),
        "embeddings.position_embeddings.weight": _array(
            model.get_layer("position_embedding").position_embeddings
        ),
        "embeddings.token_type_embeddings.weight": _array(
            model.get_layer("segment_embedding").embeddings
        ),
        **_layer_norm_tensors(model.get_layer("embeddings_layer_norm"), "embeddings.LayerNorm"),
        **_pooler_tensors(model),
    }
    for index in range(num_layers):
        block = model.get_layer(f"transformer_layer_{index}")
        for attribute, name in _ATTENTION.items():
            layer = getattr(block._self_attention_layer, attribute)
            tensors.update(linear_tensors(layer, f"encoder.layer.{index}.{name}"))
        for attribute, name in _LAYER_PARTS.items():
            layer = getattr(block, attribute)
            parts = _layer_norm_tensors if name.endswith("LayerNorm") else linear_tensors
            tensors.update(parts(layer, f"encoder.layer.{index}.{name}"))
    return {prefix + name: value for name, value in tensors.items()}


def hf_activation(hidden_act: str) -> str:
    """The `hidden_act` transformers computes as bertkit does: "gelu" is the exact (erf)
    GELU, "gelu_new" the tanh approximation keras-hub's own presets use.

    Example:
        >>> hf_activation("gelu"), hf_activation("gelu_tanh"), hf_activation("gelu_new")
        ('gelu', 'gelu_new', 'gelu_new')
    """
    return "gelu" if hidden_act in ("gelu", "gelu_python") else "gelu_new"


def hf_backbone_config(backbone_config: dict, hidden_act: str, pad_token_id: int) -> dict:
    """A Hugging Face BERT `config.json`'s model sizes from keras-hub's `BertBackbone` config
    (`get_config()`, as a run's `model/backbone.json` keeps it)."""
    return {
        "model_type": "bert",
        "vocab_size": backbone_config["vocabulary_size"],
        "hidden_size": backbone_config["hidden_dim"],
        "num_hidden_layers": backbone_config["num_layers"],
        "num_attention_heads": backbone_config["num_heads"],
        "intermediate_size": backbone_config["intermediate_dim"],
        "hidden_act": hf_activation(hidden_act),
        "max_position_embeddings": backbone_config.get("max_sequence_length", 512),
        "type_vocab_size": backbone_config.get("num_segments", 2),
        # keras-hub has one dropout rate, for hidden states and attention weights alike.
        "hidden_dropout_prob": backbone_config.get("dropout", 0.1),
        "attention_probs_dropout_prob": backbone_config.get("dropout", 0.1),
        "layer_norm_eps": 1e-12,  # keras-hub's BertBackbone's, fixed
        "initializer_range": 0.02,
        "position_embedding_type": "absolute",
        "pad_token_id": pad_token_id,
    }
