"""A small NumPy reference of the Hugging Face `BertModel` forward pass, for tests.

It reads an HF state dict (name -> array, with or without the `bert.` prefix) and the
config.json dict, and computes in float64, so that converted checkpoints can be checked
against weights that never went through keras-hub or a converter.
"""

from __future__ import annotations

import math

import numpy as np

_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu(x: np.ndarray, hidden_act: str) -> np.ndarray:
    """BERT's GELU: exact (erf) for "gelu", tanh approximation for "gelu_new"/"gelu_pytorch_tanh".

    Example:
        >>> round(float(gelu(np.array(1.0), "gelu")), 6)
        0.841345
        >>> round(float(gelu(np.array(1.0), "gelu_new")), 6)
        0.841192
    """
    if hidden_act == "gelu":
        return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))
    if hidden_act in ("gelu_new", "gelu_pytorch_tanh"):
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    raise ValueError(f"unsupported hidden_act {hidden_act!r}")


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    variance = x.var(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + eps) * weight + bias


def linear(x: np.ndarray, state: dict, name: str) -> np.ndarray:
    """`torch.nn.Linear`: weights are stored (out, in)."""
    return x @ state[f"{name}.weight"].T + state[f"{name}.bias"]


def self_attention(hidden, state, prefix, num_heads, mask_bias) -> np.ndarray:
    batch, seq, width = hidden.shape
    head_dim = width // num_heads

    def heads(name):  # (batch, heads, seq, head_dim)
        projected = linear(hidden, state, f"{prefix}.attention.self.{name}")
        return projected.reshape(batch, seq, num_heads, head_dim).transpose(0, 2, 1, 3)

    query, key, value = heads("query"), heads("key"), heads("value")
    scores = query @ key.transpose(0, 1, 3, 2) / math.sqrt(head_dim) + mask_bias
    scores -= scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores) / np.exp(scores).sum(axis=-1, keepdims=True)  # (b, h, q, k)
    context = (weights @ value).transpose(0, 2, 1, 3).reshape(batch, seq, width)
    return linear(context, state, f"{prefix}.attention.output.dense")


def encoder_layer(hidden, state, index, config, mask_bias) -> np.ndarray:
    prefix, eps = f"encoder.layer.{index}", config.get("layer_norm_eps", 1e-12)
    attended = self_attention(hidden, state, prefix, config["num_attention_heads"], mask_bias)
    hidden = layer_norm(
        hidden + attended,
        state[f"{prefix}.attention.output.LayerNorm.weight"],
        state[f"{prefix}.attention.output.LayerNorm.bias"],
        eps,
    )
    intermediate = gelu(
        linear(hidden, state, f"{prefix}.intermediate.dense"), config.get("hidden_act", "gelu")
    )
    output = linear(intermediate, state, f"{prefix}.output.dense")
    return layer_norm(
        hidden + output,
        state[f"{prefix}.output.LayerNorm.weight"],
        state[f"{prefix}.output.LayerNorm.bias"],
        eps,
    )


def numpy_bert_forward(state, config, token_ids, segment_ids, padding_mask):
    """Runs BertModel: embeddings, `num_hidden_layers` encoder layers and the pooler.

    Args:
        state: HF state dict, name -> array; a `bert.` prefix is ignored, heads are unused.
        config: the HF config.json as a dict.
        token_ids, segment_ids, padding_mask: int arrays of shape (batch, seq);
            padding_mask is 1 for real tokens and 0 for padding.

    Returns:
        `(sequence_output, pooled_output)`: float64 arrays of shape (batch, seq, hidden)
        and (batch, hidden).
    """
    state = {
        name.removeprefix("bert."): np.asarray(value, np.float64) for name, value in state.items()
    }
    token_ids, segment_ids = np.asarray(token_ids), np.asarray(segment_ids)
    positions = np.arange(token_ids.shape[1])
    embedded = (
        state["embeddings.word_embeddings.weight"][token_ids]
        + state["embeddings.position_embeddings.weight"][positions][None]
        + state["embeddings.token_type_embeddings.weight"][segment_ids]
    )
    hidden = layer_norm(
        embedded,
        state["embeddings.LayerNorm.weight"],
        state["embeddings.LayerNorm.bias"],
        config.get("layer_norm_eps", 1e-12),
    )
    # Padding keys get a large negative score: (batch, 1 head, 1 query, seq keys).
    mask_bias = (1.0 - np.asarray(padding_mask, np.float64))[:, None, None, :] * -1e9
    for index in range(config["num_hidden_layers"]):
        hidden = encoder_layer(hidden, state, index, config, mask_bias)
    pooled = np.tanh(linear(hidden[:, 0], state, "pooler.dense"))
    return hidden, pooled
