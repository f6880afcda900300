"""The tokenizer's ragged outputs as NumPy rows, for featurization: eager calls on chunks
of texts (`tokenize_in_chunks`), one array per row (`split_rows`), per word
(`split_word_rows`).
"""

from __future__ import annotations

import numpy as np

_CHUNK = 2048  # strings per eager tokenizer call: large enough to amortize op dispatch


def in_chunks(items: list, size: int = _CHUNK):
    """`items` in consecutive slices of at most `size`: the unit of one eager tokenizer call.

    Example:
        >>> [list(chunk) for chunk in in_chunks(list(range(5)), 2)]
        [[0, 1], [2, 3], [4]]
    """
    for start in range(0, len(items), size):
        yield items[start : start + size]


def split_rows(ragged) -> list[np.ndarray]:
    """(batch, (n)) ragged -> one int32 numpy array per row.

    Example:
        >>> import tensorflow as tf
        >>> [row.tolist() for row in split_rows(tf.ragged.constant([[5, 6], [], [7]]))]
        [[5, 6], [], [7]]
    """
    values = ragged.flat_values.numpy().astype(np.int32)
    splits = ragged.row_splits.numpy()
    return [values[a:b] for a, b in zip(splits[:-1], splits[1:], strict=True)]


def split_word_rows(pieces) -> list[tuple[np.ndarray, np.ndarray]]:
    """(batch, (words), (pieces)) ragged -> per row: its piece ids (flat), pieces per word.

    Example:
        >>> import tensorflow as tf
        >>> [(ids.tolist(), lengths.tolist()) for ids, lengths
        ...  in split_word_rows(tf.ragged.constant([[[5, 6], [7]], [], [[8]]]))]
        [([5, 6, 7], [2, 1]), ([], []), ([8], [1])]
    """
    ids = pieces.flat_values.numpy().astype(np.int32)
    lengths = pieces.values.row_lengths().numpy()
    word_splits, piece_splits = pieces.row_splits.numpy(), pieces.values.row_splits.numpy()
    return [
        (ids[piece_splits[a] : piece_splits[b]], lengths[a:b])
        for a, b in zip(word_splits[:-1], word_splits[1:], strict=True)
    ]


def tokenize_in_chunks(tokenize, texts: list[str]) -> list[tuple]:
    """Per text, a tuple of its numpy rows (`split_rows`) of each ragged tensor `tokenize` returns.

    Calls `tokenize` (a `bertkit.model.tokenizer.WordPieceTokenizer` op) eagerly on chunks of texts.

    Example:
        >>> from bertkit.model.tokenizer import WordPieceTokenizer
        >>> tokenizer = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "good"], True)
        >>> [(ids.tolist(), starts.tolist(), ends.tolist()) for ids, starts, ends
        ...  in tokenize_in_chunks(tokenizer.tokenize_with_offsets, ["good", "", "Good good"])]
        [([4], [0], [4]), ([], [], []), ([4, 4], [0, 5], [4, 9])]
    """
    import tensorflow as tf

    rows = []
    for chunk in in_chunks(texts):
        outputs = tokenize(tf.constant(chunk, tf.string))
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        rows += zip(*(split_rows(output) for output in outputs), strict=True)
    return rows
