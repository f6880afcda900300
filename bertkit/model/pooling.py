"""Sentence vectors from token vectors: the poolings of sentence-transformers' `Pooling`.

Each pooling reads `(batch, seq, hidden)` token vectors and a `(batch, seq)` padding mask
(1 for a real token) and gives `(batch, hidden)`; several are concatenated in
sentence-transformers' order (cls, max, mean, mean_sqrt_len), so that a folder declaring
several modes gets the vector `SentenceTransformer.encode` gives. `keras.ops` only: the same
code runs in `bertkit embed`, in training and inside an exported SavedModel.
"""

from __future__ import annotations

POOLINGS = ("cls", "max", "mean", "mean_sqrt_len")  # sentence-transformers' concat order
_MASKED_MAX = -1e9  # sentence-transformers' fill for padding before max pooling


def pool(token_vectors, padding_mask, poolings):
    """Pools token vectors into one vector per text (several poolings: concatenated).

    Example:
        >>> import numpy as np
        >>> vectors = np.array([[[1.0, 4.0], [3.0, 0.0], [9.0, 9.0]]], "float32")
        >>> mask = np.array([[1, 1, 0]], "int32")  # the third token is padding
        >>> np.asarray(pool(vectors, mask, ["mean"])).tolist()
        [[2.0, 2.0]]
        >>> np.asarray(pool(vectors, mask, ["cls", "max"])).tolist()
        [[1.0, 4.0, 3.0, 4.0]]
    """
    from keras import ops

    mask = ops.cast(ops.expand_dims(padding_mask, -1), token_vectors.dtype)  # (batch, seq, 1)
    counts = ops.maximum(ops.sum(mask, axis=1), 1e-9)  # (batch, 1), as sentence-transformers
    pooled = {
        "cls": lambda: token_vectors[:, 0, :],
        "max": lambda: ops.max(ops.where(mask > 0, token_vectors, _MASKED_MAX), axis=1),
        "mean": lambda: ops.sum(token_vectors * mask, axis=1) / counts,
        "mean_sqrt_len": lambda: ops.sum(token_vectors * mask, axis=1) / ops.sqrt(counts),
    }
    ordered = [name for name in POOLINGS if name in poolings]
    parts = [pooled[name]() for name in ordered]
    return parts[0] if len(parts) == 1 else ops.concatenate(parts, axis=-1)


def l2_normalize(vectors):
    """Each vector divided by its length (sentence-transformers' `Normalize`, eps 1e-12).

    Example:
        >>> import numpy as np
        >>> np.asarray(l2_normalize(np.array([[3.0, 4.0]], "float32"))).tolist()
        [[0.6000000238418579, 0.800000011920929]]
    """
    from keras import ops

    norms = ops.sqrt(ops.sum(ops.square(vectors), axis=-1, keepdims=True))
    return vectors / ops.maximum(norms, 1e-12)


def combine_layers(hidden_states: list, combine: str):
    """Chosen hidden layers as one `(batch, seq, hidden')` tensor: `concat` (BERT's
    feature-based CoNLL setting, last four layers: hidden' = 4 * hidden) or `mean`.

    Example:
        >>> import numpy as np
        >>> a, b = np.ones((1, 2, 3), "float32"), np.zeros((1, 2, 3), "float32")
        >>> tuple(combine_layers([a, b], "concat").shape)
        (1, 2, 6)
        >>> float(combine_layers([a, b], "mean")[0, 0, 0])
        0.5
    """
    from keras import ops

    if len(hidden_states) == 1:
        return hidden_states[0]
    if combine == "concat":
        return ops.concatenate(hidden_states, axis=-1)
    return ops.mean(ops.stack(hidden_states, axis=0), axis=0)
