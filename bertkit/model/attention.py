"""BERT's self-attention: its own dropout rate, and one fused kernel on GPUs.

keras-hub's `BertBackbone` has one dropout rate for hidden states and attention
probabilities alike; Hugging Face's BERT config has two (`hidden_dropout_prob`,
`attention_probs_dropout_prob`). `set_attention_dropout` sets the second
(`backbone.attention_dropout`; left null, `training_attention_dropout` makes it 0 where
the fused kernel below trains, else keeps the one rate).

Keras' `MultiHeadAttention` computes attention unfused (the scores materialised, masked,
soft-maxed, dropped out, multiplied) whenever its dropout rate is above 0, at inference
too; and with keras-hub BERT's padding mask, shaped `(batch, 1, keys)`, its fused path
falls back on GPUs as well (cuDNN takes no mask broadcast over the queries: "Bias must
have same seq length as QKV"). `use_fused_attention` gives each encoder layer
`fused_attention` instead, on JAX with a GPU: `jax.nn.dot_product_attention` (cuDNN's
flash attention where cuDNN takes the call: bfloat16 or float16 on an Ampere or newer
GPU; else XLA's), with padding given as each row's key count (padding at the end of
each row: bertkit's batches always; a caller's inputs at inference are checked), wherever
no dropout applies: at inference, and in training with `attention_dropout: 0` (the
default there). In training with attention dropout above 0 it keeps Keras' computation.
Only the layers' attention computation changes: classes, variables and weight paths stay
keras-hub's. `tests/test_attention.py` checks the outputs and gradients
against Keras' computation (XLA's implementation, on the CPU).

    >>> from bertkit.testing import write_tiny_checkpoint
    >>> import tempfile
    >>> from bertkit.model.backbone import load_pretrained
    >>> folder = write_tiny_checkpoint(tempfile.mkdtemp())
    >>> backbone = load_pretrained(str(folder), sequence_length=16).backbone
    >>> set_attention_dropout(backbone, 0.0)
    >>> [layer._self_attention_layer.dropout for layer in backbone.transformer_layers]
    [0.0, 0.0]
"""

from __future__ import annotations

import functools

import keras
from keras import ops

# why cuDNN refused each traced call that then took XLA's kernel (the benchmarks print it)
CUDNN_REFUSALS: list[str] = []


def set_attention_dropout(backbone, rate: float | None) -> None:
    """The attention-probability dropout of every encoder layer of `backbone` (keras-hub's
    `BertBackbone`); None keeps the backbone's one rate."""
    if rate is None:
        return
    for layer in backbone.transformer_layers:
        attention = layer._self_attention_layer
        attention._dropout = rate  # read when the step is traced
        attention._dropout_layer.rate = rate


def fused_attention_trains() -> bool:
    """Whether this process trains with `fused_attention` where attention dropout is 0:
    on JAX with a GPU."""
    if keras.backend.backend() != "jax":
        return False
    import jax

    return jax.devices()[0].platform == "gpu"


def training_attention_dropout(rate: float | None) -> float | None:
    """The attention dropout a run trains with: `rate` (`backbone.attention_dropout`);
    when that is None, 0 where `fused_attention_trains()`, else None (the backbone's
    one rate, 0.1 for BERT).

    Why 0 on a GPU: the fused kernel made a BERT-base step at length 384 1.37x faster
    on an H200 (27.4 against 37.5 ms), and the learning curves with attention dropout 0
    lost nothing against 0.1 (README, "Attention dropout").

        >>> training_attention_dropout(0.1), training_attention_dropout(None)
        (0.1, None)
    """
    if rate is None and fused_attention_trains():
        return 0.0
    return rate


def use_fused_attention(backbone, implementation: str | None = None, *, force=False) -> bool:
    """Gives every encoder layer of `backbone` `fused_attention`, on JAX with a GPU (or
    wherever with `force`, as the tests do on a CPU with `implementation="xla"`).
    `implementation`: `jax.nn.dot_product_attention`'s; None: cuDNN where it takes the
    call, else XLA's (jax's own None means XLA's). Returns whether it did."""
    if keras.backend.backend() != "jax" or not (force or fused_attention_trains()):
        return False
    for layer in backbone.transformer_layers:
        attention = layer._self_attention_layer
        if not fuses(attention):
            attention._compute_attention = functools.partial(
                fused_attention, attention, implementation
            )
    return True


def fuses(attention) -> bool:
    return getattr(attention._compute_attention, "func", None) is fused_attention


def fused_attention(
    layer,
    implementation,
    query,
    key,
    value,
    attention_mask=None,
    training=None,
    return_attention_scores=False,
    use_causal_mask=False,
):
    """`keras.layers.MultiHeadAttention._compute_attention` of `layer` in one
    `jax.nn.dot_product_attention` where no dropout applies (see the module docstring).

    A `(batch, 1, keys)` mask is BERT's padding mask: it goes in as each row's key count,
    which cuDNN takes, where the padding is at the end of each row. Training batches are
    bertkit's own, padded at the end; at inference (a caller's inputs) a check picks the
    key counts where that holds and the mask as a mask elsewhere. Any other mask (the
    block-diagonal one of packed rows) goes in as a mask.
    """
    dropping = training and layer._dropout > 0
    if dropping or return_attention_scores or use_causal_mask or len(query.shape) != 4:
        keras_computation = type(layer)._compute_attention
        return keras_computation(
            layer, query, key, value, attention_mask, training, return_attention_scores,
            use_causal_mask=use_causal_mask,
        )  # fmt: skip
    attend = functools.partial(
        dot_product_attention, query, key, value, layer._inverse_sqrt_key_dim
    )
    if attention_mask is None:
        return attend(implementation), None
    mask = ops.cast(attention_mask, "bool")
    if mask.shape[-2] != 1:
        return attend(implementation, mask=mask_seen_by_every_query(mask)), None
    return padded_attention(attend, implementation, mask[:, 0, :], training), None


def padded_attention(attend, implementation, padding, training):
    """`attend` with the `(batch, keys)` `padding` mask as each row's key count; at
    inference (not in training, whose batches are bertkit's) only where every row's
    padding is at its end, else as a mask (XLA's kernel)."""
    counts = ops.sum(ops.cast(padding, "int32"), axis=-1)
    # a row of padding only sees one key: none could give NaN (its output is never read)
    at_least_one = ops.maximum(counts, 1)
    by_counts = functools.partial(attend, implementation, key_value_seq_lengths=at_least_one)
    if training:
        return by_counts()
    at_end = ops.arange(padding.shape[-1])[None, :] < counts[:, None]
    as_mask = functools.partial(attend, "xla", mask=mask_seen_by_every_query(padding[:, None]))
    return ops.cond(ops.all(ops.equal(padding, at_end)), by_counts, as_mask)


def dot_product_attention(query, key, value, scale, implementation, **masking):
    """`jax.nn.dot_product_attention`; `implementation` None: cuDNN where it takes the
    call (as Keras' JAX backend does: it refuses when traced), else XLA's."""
    import jax

    if implementation is None:
        try:
            return jax.nn.dot_product_attention(
                query, key, value, scale=scale, implementation="cudnn", **masking
            )
        except Exception as error:  # noqa: BLE001 (float32, an old GPU or cuDNN, a shape)
            CUDNN_REFUSALS.append(f"{type(error).__name__}: {error}"[:300])
            implementation = "xla"
    return jax.nn.dot_product_attention(
        query, key, value, scale=scale, implementation=implementation, **masking
    )


def mask_seen_by_every_query(mask):
    """A `(batch, queries or 1, keys)` boolean mask as `jax.nn.dot_product_attention` takes
    it, `(batch, heads: broadcast, queries, keys)`. A query that may see no key (a
    padding position of packed rows) sees them all instead: its output is never read,
    and a softmax over nothing could give NaN, which a weight of 0 does not cancel."""
    mask = ops.logical_or(mask, ops.logical_not(ops.any(mask, axis=-1, keepdims=True)))
    return mask[:, None, :, :]
