"""Overlapping windows over long token sequences, and which window "owns" a token.

Google BERT's `run_squad.py` rule, shared by span QA and tagging: windows of at
most `window_size` tokens start `stride` tokens apart, the last one ends at the
end of the sequence, and a token seen by several windows is scored by the window
where it has the most context on both sides. Tagging cuts windows of word
pieces and keeps the words that fit whole in each (`word_windows`).

Each rule has a TensorFlow mirror for SavedModels (`batch_sliding_windows`,
`max_context_flags`, `windowed_rows`), tested against it; they import
TensorFlow when called, so this module imports without it.
"""

from __future__ import annotations

import numpy as np


def sliding_windows(length: int, window_size: int, stride: int) -> list[tuple[int, int]]:
    """Splits `range(length)` into `(start, end)` windows, end exclusive.

    Example:
        >>> sliding_windows(10, window_size=4, stride=3)
        [(0, 4), (3, 7), (6, 10)]
        >>> sliding_windows(3, window_size=4, stride=2)
        [(0, 3)]
        >>> sliding_windows(0, window_size=4, stride=2)
        [(0, 0)]
    """
    if window_size < 1 or stride < 1:
        raise ValueError("window_size and stride must be positive")
    windows, start = [], 0
    while True:
        end = min(start + window_size, length)
        windows.append((start, end))
        if end >= length:
            return windows
        start += min(stride, end - start)


def context_score(window: tuple[int, int], position: int) -> float:
    """How much context `position` has inside `window` (higher is better).

    min(left, right) context plus a small bonus for longer windows, as in
    Google BERT's `_check_is_max_context`.

    Example:
        >>> context_score((0, 4), 1), context_score((0, 4), 3)
        (1.04, 0.04)
    """
    start, end = window
    left, right = position - start, end - 1 - position
    return min(left, right) + 0.01 * (end - start)


def max_context_windows(windows: list[tuple[int, int]], length: int) -> list[int]:
    """For every position in `range(length)`, the index of the window that owns it.

    Example:
        >>> max_context_windows([(0, 4), (3, 7), (6, 10)], 10)
        [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    """
    owners = []
    for position in range(length):
        candidates = [i for i, (s, e) in enumerate(windows) if s <= position < e]
        owners.append(max(candidates, key=lambda i: (context_score(windows[i], position), -i)))
    return owners


def word_windows(offsets: np.ndarray, window_size: int, stride: int) -> list[tuple[int, int]]:
    """`(first_word, end_word)` windows: the words that fit whole in each window of pieces.

    The piece windows are `sliding_windows(offsets[-1], window_size, stride)`;
    a word that fits in none of them (more than `window_size - stride + 1`
    pieces) belongs to no window.

    Args:
        offsets: (words + 1,) piece offset of each word, then the piece count.

    Example (piece windows (0, 4), (2, 6), (4, 7); the 3-piece word 2 fits only the second):
        >>> word_windows(np.array([0, 2, 3, 6, 7]), window_size=4, stride=2)
        [(0, 2), (1, 3), (3, 4)]
    """
    windows = sliding_windows(int(offsets[-1]), window_size, stride)
    return [
        (
            int(np.searchsorted(offsets[:-1], start, "left")),
            int(np.searchsorted(offsets[1:], end, "right")),
        )
        for start, end in windows
    ]


# ---- TensorFlow mirrors of the rules above, for SavedModels (TensorFlow imported inside)
def batch_sliding_windows(lengths, window_sizes, stride: int):
    """`sliding_windows(lengths[i], window_sizes[i], stride)` for every i, in TensorFlow ops.

    Args:
        lengths: (batch,) int64 sequence lengths.
        window_sizes: (batch,) int64, each at least 1.
        stride: tokens between window starts.

    Returns:
        Per window (flat over the batch): its sequence (int64, non-decreasing),
        its start and its end (exclusive).

    Example:
        >>> import tensorflow as tf
        >>> rows, starts, ends = batch_sliding_windows(
        ...     tf.constant([10, 3], tf.int64), tf.constant([4, 4], tf.int64), stride=3)
        >>> rows.numpy().tolist(), starts.numpy().tolist(), ends.numpy().tolist()
        ([0, 0, 0, 1], [0, 3, 6, 0], [4, 7, 10, 3])
    """
    import tensorflow as tf

    step = tf.minimum(tf.cast(stride, window_sizes.dtype), window_sizes)  # as sliding_windows
    count = _window_counts(lengths, window_sizes, step)  # (batch,)
    rows = tf.repeat(tf.range(tf.size(count, out_type=tf.int64)), count)
    starts = tf.ragged.range(count).flat_values * tf.gather(step, rows)
    ends = tf.minimum(starts + tf.gather(window_sizes, rows), tf.gather(lengths, rows))
    return rows, starts, ends


def max_context_flags(tokens, starts, ends, num_tokens):
    """Ragged bool like `tokens`: is the window the token's max-context window?

    `max_context_windows` in TensorFlow ops, for windows `[starts[w], ends[w])`
    of indices into all sequences' tokens (flat), `tokens` (windows,
    (tokens)) holding each window's indices: the context score times 100, in
    integers; ties go to the earlier window.

    Example (the windows of `max_context_windows`' example):
        >>> import tensorflow as tf
        >>> starts, ends = tf.constant([0, 3, 6], tf.int64), tf.constant([4, 7, 10], tf.int64)
        >>> flags = max_context_flags(tf.ragged.range(starts, ends), starts, ends, 10)
        >>> [[int(flag) for flag in window] for window in flags.to_list()]
        [[1, 1, 1, 1], [0, 1, 1, 1], [0, 1, 1, 1]]
    """
    import tensorflow as tf

    window, token = tokens.value_rowids(), tokens.flat_values
    score = _context_scores(token, tf.gather(starts, window), tf.gather(ends, window))
    best = tf.gather(tf.math.unsorted_segment_max(score, token, num_tokens), token)
    contender = tf.where(score == best, window, tf.size(starts, out_type=tf.int64))
    owner = tf.gather(tf.math.unsorted_segment_min(contender, token, num_tokens), token)
    return tokens.with_flat_values(owner == window)


def windowed_rows(pieces, window_size: int, stride: int, cls_id: int, sep_id: int):
    """The model rows of `word_windows` windows, in TensorFlow ops, and where each word is read.

    Args:
        pieces: (batch, (words), (pieces)) word piece ids.
        window_size, stride: in pieces, as for `word_windows`.
        cls_id, sep_id: the ids that open and close every row.

    Returns:
        The rows `[CLS] pieces [SEP]` of each sequence's windows, in order,
        (batch, (windows), (pieces)); and `read_at`, (batch, (words), 2): for
        each word the row (counted over the whole batch) and the position of its
        first piece in its max-context window (`max_context_windows` over words).

    Example (the words of `word_windows`' example, pieces numbered 10 on):
        >>> import tensorflow as tf
        >>> pieces = tf.ragged.constant([[[10, 11], [12], [13, 14, 15], [16]]])
        >>> rows, read_at = windowed_rows(pieces, 4, 2, cls_id=1, sep_id=2)
        >>> rows.to_list()
        [[[1, 10, 11, 12, 2], [1, 12, 13, 14, 15, 2], [1, 16, 2]]]
        >>> read_at.to_list()
        [[[0, 1], [0, 3], [1, 2], [2, 1]]]
    """
    import tensorflow as tf

    stride = min(stride, window_size)  # as sliding_windows
    lengths = tf.cast(pieces.row_lengths(axis=2), tf.int32).to_tensor()  # (batch, words)
    word_start = tf.cumsum(lengths, axis=1) - lengths
    total = tf.reduce_sum(lengths, axis=1)  # (batch,)
    offsets = tf.concat([word_start, total[:, None]], axis=1)  # (batch, words + 1)
    is_word = tf.sequence_mask(pieces.row_lengths(), tf.shape(lengths)[1])
    count, is_window, first, end = _windows_of_words(offsets, is_word, window_size, stride)
    owner = _max_context_words(first, end, is_word)  # (batch, words)
    rows = _window_rows(pieces, offsets, is_window, first, end, cls_id, sep_id)
    read_at = _read_at(offsets, count, first, owner, is_word, pieces.row_lengths())
    return tf.RaggedTensor.from_row_lengths(rows, tf.cast(count, tf.int64)), read_at


def _windows_of_words(offsets, is_word, window_size: int, stride: int):
    """`word_windows` over a batch: the piece windows `sliding_windows` cuts, then the
    words inside each.

    Args:
        offsets: (batch, words + 1) piece offset of each word, then the piece count.
        is_word: (batch, words) false for the padding words of shorter sequences.

    Returns:
        `count`, (batch,) windows per sequence; and per window slot (batch, windows):
        `is_window`, `first` and `end` word (0 and 0 in a slot that is no window).
    """
    import tensorflow as tf

    largest = tf.int32.max  # padding words: sorted last, in no window
    total = offsets[:, -1]  # (batch,)
    count = _window_counts(total, window_size, stride)
    window = tf.range(tf.reduce_max(count))[None, :]  # (1, windows)
    is_window = window < count[:, None]  # (batch, windows)
    piece_start = tf.broadcast_to(window * stride, tf.shape(is_window))
    piece_end = tf.minimum(piece_start + window_size, total[:, None])
    first = tf.searchsorted(tf.where(is_word, offsets[:, :-1], largest), piece_start, "left")
    end = tf.searchsorted(tf.where(is_word, offsets[:, 1:], largest), piece_end, "right")
    return count, is_window, tf.where(is_window, first, 0), tf.where(is_window, end, 0)


def _max_context_words(first, end, is_word):
    """`max_context_windows` over words: (batch, words) the window that owns each word,
    the lowest window index on ties; for a padding word, any valid index."""
    import tensorflow as tf

    window = tf.range(tf.shape(first)[1])[None, None, :]  # (1, 1, windows)
    word = tf.range(tf.shape(is_word)[1])[None, :, None]  # (1, words, 1)
    f, e = first[:, None, :], end[:, None, :]  # (batch, 1, windows)
    inside = (f <= word) & (word < e)
    score = tf.where(inside, _context_scores(word, f, e), tf.int32.min)
    best = inside & (score == tf.reduce_max(score, axis=2, keepdims=True))
    owner = tf.reduce_min(tf.where(best, window, tf.int32.max), axis=2)
    return tf.where(is_word, owner, 0)


def _window_rows(pieces, offsets, is_window, first, end, cls_id: int, sep_id: int):
    """(rows, (pieces)): `[CLS]` + the pieces of a window's words + `[SEP]`, for the
    windows of every sequence in order."""
    import tensorflow as tf

    sentence = pieces.merge_dims(1, 2)  # (batch, (pieces))
    base = tf.cast(sentence.row_starts(), tf.int32)[:, None]
    starts, ends = (
        tf.boolean_mask(base + tf.gather(offsets, words, batch_dims=1), is_window)
        for words in (first, end)
    )
    rows = tf.gather(sentence.values, tf.ragged.range(starts, ends))  # (rows, (pieces))
    edge = tf.ones([rows.nrows(), 1], rows.dtype)
    return tf.concat(
        [
            tf.RaggedTensor.from_tensor(edge * cls_id),
            rows,
            tf.RaggedTensor.from_tensor(edge * sep_id),
        ],
        axis=1,
    )


def _read_at(offsets, count, first, owner, is_word, words_per_sequence):
    """(batch, (words), 2): each word's row (counted over the whole batch) and the position
    of its first piece in its owner window's row (`[CLS]` is position 0)."""
    import tensorflow as tf

    row_offset = tf.cumsum(count, exclusive=True)[:, None]  # (batch, 1)
    window_start = tf.gather(offsets, tf.gather(first, owner, batch_dims=1), batch_dims=1)
    row = tf.boolean_mask(row_offset + owner, is_word)
    position = tf.boolean_mask(1 + offsets[:, :-1] - window_start, is_word)
    return tf.RaggedTensor.from_row_lengths(tf.stack([row, position], 1), words_per_sequence)


def _context_scores(position, start, end):
    """`context_score` x 100, in integers, for tensors of positions and their windows.

    The one TensorFlow form of the max-context rule (QA windows and tagging's word
    windows); integers keep ties exact, where they go to the earlier window.
    """
    import tensorflow as tf

    return 100 * tf.minimum(position - start, end - 1 - position) + (end - start)


def _window_counts(lengths, window_sizes, steps):
    """Windows `sliding_windows` cuts from each sequence; `steps` at most `window_sizes`."""
    import tensorflow as tf

    return 1 + (tf.maximum(lengths - window_sizes, 0) + steps - 1) // steps
