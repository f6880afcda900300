"""Fill-mask queries in TensorFlow ops: texts with literal `[MASK]` markers to model inputs.

One path for `predict` and the exported SavedModel, so both read a query the
same way: `"first [SEP] second"` is a pair, each `[MASK]` is one mask piece
whatever surrounds it (WordPiece alone would split it into `[`, `mask`, `]`).
"""

from __future__ import annotations


def encode_queries(tokenizer, texts, sequence_length: int):
    """(batch,) strings -> packed ragged `(token_ids, segment_ids)`, `[MASK]`/`[SEP]` honoured.

    Example:
        >>> import tensorflow as tf
        >>> from bertkit.model.tokenizer import WordPieceTokenizer
        >>> tokenizer = WordPieceTokenizer(
        ...     ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "film", "##s", "!"],
        ...     lowercase=True)
        >>> ids, segments = encode_queries(tokenizer, tf.constant(["Good [MASK]!",
        ...                                                        "good [SEP] [MASK] films"]), 16)
        >>> ids.to_list(), segments.to_list()
        ([[2, 5, 4, 8, 3], [2, 5, 3, 4, 6, 7, 3]], [[0, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1, 1]])
    """
    import tensorflow as tf

    halves = tf.strings.split(texts, sep="[SEP]", maxsplit=1).to_tensor("", shape=[None, 2])
    first, second = (tokenize_masked(tokenizer, halves[:, i]) for i in (0, 1))
    # One packing for all rows, so a single text is cut one token earlier than need be.
    token_ids, segment_ids = tokenizer.pack([first, second], sequence_length)
    # Without a pair this is [CLS] A [SEP] [SEP]: drop the empty second segment's [SEP].
    keep = token_ids.row_lengths() - tf.cast(second.row_lengths() == 0, tf.int64)
    kept = tf.ragged.range(token_ids.row_lengths()) < tf.expand_dims(keep, 1)
    return tf.ragged.boolean_mask(token_ids, kept), tf.ragged.boolean_mask(segment_ids, kept)


def tokenize_masked(tokenizer, texts):
    """(batch,) strings -> (batch, (pieces)) ids, each literal "[MASK]" one mask id."""
    import tensorflow as tf

    parts = tf.strings.split(texts, sep="[MASK]")  # (batch, (masks + 1))
    pieces = tokenizer.tokenize(parts.flat_values)  # (parts, (pieces))
    mask = tf.fill([pieces.nrows(), 1], tokenizer.mask_id)
    with_mask = tf.concat([pieces, tf.RaggedTensor.from_tensor(mask)], axis=1)
    joined = tf.RaggedTensor.from_row_splits(with_mask, parts.row_splits).merge_dims(1, 2)
    return joined[:, :-1]  # no [MASK] after the last part


def mask_positions(token_ids, mask_id: int):
    """(batch, (pieces)) ids -> (batch, (masks)) int32 positions of their mask pieces.

    Example:
        >>> import tensorflow as tf
        >>> mask_positions(tf.ragged.constant([[2, 4, 5, 4, 3], [2, 3]]), 4).to_list()
        [[1, 3], []]
    """
    import tensorflow as tf

    positions = tf.ragged.range(tf.cast(token_ids.row_lengths(), tf.int32))
    return tf.ragged.boolean_mask(positions, tf.equal(token_ids, mask_id))
