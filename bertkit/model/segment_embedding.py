"""BERT's segment (token type) embedding with a gradient that is a sum, not a scatter-add.

keras-hub looks the segment embedding up with `keras.layers.Embedding`, whose gradient adds
every token's gradient into the table row of its segment id. On a GPU, XLA does that with
atomic adds, and BERT's segment table has two rows: every token of a batch adds into row 0
or 1, so the adds serialise. Measured on one H200 (BERT-base, batch 32, mixed bfloat16,
`benchmarks/gpu/profile_step.py`): that one scatter took 62-67 ms of a 98 ms training step at
length 384 and 31 of 42 ms at length 128, more than the twelve encoder layers together.

Written as `sum over rows of (segment_ids == row) * table[row]`, the lookup gives the same
values bit for bit (each output is one row plus zeros), and its gradient is one float32
reduction per row that XLA fuses; no matmul, so no TF32 rounding on GPUs either. Only the
layer's `call` is replaced: its class and weight paths stay keras-hub's.
The token table (30k rows, ids spread out) keeps keras-hub's lookup.

    >>> import numpy as np
    >>> import keras
    >>> layer = keras.layers.Embedding(2, 4)
    >>> ids = np.array([[0, 1, 1]])
    >>> expected = keras.ops.convert_to_numpy(layer(ids))
    >>> sum_over_rows(layer)
    >>> bool((keras.ops.convert_to_numpy(layer(ids)) == expected).all())
    True
"""

from __future__ import annotations

import functools

import keras
from keras import ops

# A lookup as a sum over rows costs rows x tokens x hidden: for a few rows it is free.
MAX_ROWS = 16


def lookup_as_sum(layer, inputs):
    """`layer(inputs)` for a `keras.layers.Embedding` of a few rows, as a sum over its rows
    (same outputs; the gradient has no scatter). Computed in float32, then cast: the same
    values, and the gradient is summed in float32. LoRA is in `layer.embeddings`; a quantized
    layer never gets here (Keras calls its `quantized_call`)."""
    table = ops.cast(layer.embeddings, "float32")
    inputs = ops.cast(inputs, "int32")
    rows = [
        ops.where(ops.expand_dims(ops.equal(inputs, row), -1), table[row], 0)
        for row in range(layer.input_dim)
    ]
    return ops.cast(sum(rows[1:], rows[0]), layer.compute_dtype)


def sum_over_rows(layer) -> None:
    """Makes `layer` (a `keras.layers.Embedding` of at most `MAX_ROWS` rows) look up as
    `lookup_as_sum`, in place. Only its `call` changes: its class, variables and their
    paths in saved weights stay keras-hub's, so checkpoints and presets load as before."""
    if type(layer) is keras.layers.Embedding and layer.input_dim <= MAX_ROWS:
        layer.call = functools.partial(lookup_as_sum, layer)


def looks_up_as_sum(layer) -> bool:
    return getattr(layer.call, "func", None) is lookup_as_sum


def use_sum_over_rows(backbone) -> None:
    """A keras-hub `BertBackbone`'s segment embedding as a sum over its rows (above)."""
    sum_over_rows(backbone.segment_embedding)
