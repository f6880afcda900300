"""From start/end logits over doc-stride windows to the n best answer spans.

One decoding rule for evaluation, eager prediction and the exported
SavedModel: `decode_answer_spans` uses TensorFlow ops only, so it runs eagerly
and inside a `tf.function` with unknown batch and sequence sizes.

Unlike Google BERT's `run_squad.py`, which pairs only the 20 best start and
the 20 best end positions, every valid (start, end) pair is scored, so the n
best spans are exact. Windows and the max-context rule come from
`bertkit.windows`; `span_candidates` (and `batch_span_candidates`, its
TensorFlow mirror for SavedModels) turns them into the decoder's masks, and
`answer_char_span` turns a decoded span back into characters of the original
context (answers are cut from the context, never detokenized);
`answer_tokens` goes the other way, from a training answer to its tokens.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from bertkit.windows import max_context_flags, max_context_windows


def decode_answer_spans(
    start_logits: tf.Tensor,
    end_logits: tf.Tensor,
    example_ids: tf.Tensor,
    start_candidates: tf.Tensor,
    end_candidates: tf.Tensor,
    max_answer_length: int = 30,
    n_best_size: int = 20,
) -> dict[str, tf.Tensor]:
    """The `n_best_size` best answer spans of each example, over all its windows.

    A span (window w, start s, end e) is valid when `start_candidates[w, s]`,
    `end_candidates[w, e]` and `0 <= e - s < max_answer_length`; its score is
    `start_logits[w, s] + end_logits[w, e]`. Ties go to the earlier window,
    then start, then end.

    Args:
        start_logits: (windows, seq) float32.
        end_logits: (windows, seq) float32.
        example_ids: (windows,) int32, the example of each window: 0, 0, 1, ...
            non-decreasing, and every example 0..E-1 has at least one window.
        start_candidates: (windows, seq) bool, a context token whose
            max-context window is this one.
        end_candidates: (windows, seq) bool, a context token of this window.
        max_answer_length: longest answer, in tokens.
        n_best_size: spans kept per example.

    Returns:
        `window_index`, `start_index`, `end_index`: (E, n_best_size) int32,
        best first, -1 where an example has fewer valid spans;
        `span_score`: (E, n_best_size) float32, -inf there;
        `null_score`: (E,) float32, min over the example's windows of the [CLS]
        score `start_logits[w, 0] + end_logits[w, 0]` (Google BERT, SQuAD 2.0);
        `null_score_diff`: (E,) `null_score - span_score[:, 0]`, +inf without
        a valid span; predict "no answer" when it exceeds a tuned threshold.

    Example:
        >>> logits = tf.constant([[0.0, 1.0, 5.0, 2.0]])
        >>> context = tf.constant([[False, True, True, True]])
        >>> spans = decode_answer_spans(logits, logits, tf.constant([0]),
        ...                             context, context, n_best_size=2)
        >>> spans["start_index"].numpy().tolist(), spans["end_index"].numpy().tolist()
        ([[2, 2]], [[2, 3]])
        >>> spans["span_score"].numpy().tolist(), spans["null_score_diff"].numpy().tolist()
        ([[10.0, 7.0]], [-10.0])
    """
    if max_answer_length < 1 or n_best_size < 1:
        raise ValueError("max_answer_length and n_best_size must be at least 1")
    scores, span_ids = _best_spans_per_window(
        start_logits, end_logits, start_candidates, end_candidates, max_answer_length, n_best_size
    )
    scores, span_ids = _best_spans_per_example(scores, span_ids, example_ids, n_best_size)
    window, start, end = _unpack_span_ids(span_ids, start_logits, max_answer_length)
    null_score = tf.math.segment_min(start_logits[:, 0] + end_logits[:, 0], example_ids)
    return {
        "window_index": window,
        "start_index": start,
        "end_index": end,
        "span_score": scores,
        "null_score": null_score,
        "null_score_diff": null_score - scores[:, 0],
    }


def decode_answer_rows(
    start_logits: list,
    end_logits: list,
    example_ids,
    start_candidates: list,
    end_candidates: list,
    max_answer_length: int = 30,
    n_best_size: int = 20,
    traced_calls=None,
) -> dict[str, np.ndarray]:
    """`decode_answer_spans` for rows of different lengths, NumPy in and out.

    The rows (one 1-D array each, as `Features` keep them) are padded to the
    longest with zero logits and False candidates. With `traced_calls` (a
    `bertkit.model.traced_calls.TracedCalls`: the task tokenizer's), a repeated decoding
    runs traced where it is on.

    Example:
        >>> spans = decode_answer_rows([np.array([0.0, 1.0, 5.0])], [np.array([0.0, 2.0, 1.0])],
        ...                            [0], [np.array([False, True, True])],
        ...                            [np.array([False, True, True])], n_best_size=1)
        >>> spans["start_index"].tolist(), spans["end_index"].tolist(), spans["span_score"].tolist()
        ([[2]], [[2]], [[6.0]])
    """
    width = max(len(row) for row in start_logits)

    def padded(rows, dtype):  # (rows, width)
        array = np.zeros((len(rows), width), dtype=dtype)
        for i, row in enumerate(rows):
            array[i, : len(row)] = row
        return tf.constant(array)

    tensors = (
        padded(start_logits, np.float32),
        padded(end_logits, np.float32),
        tf.constant(example_ids, tf.int32),
        padded(start_candidates, bool),
        padded(end_candidates, bool),
    )
    decode = lambda rows: decode_answer_spans(*rows, max_answer_length, n_best_size)  # noqa: E731
    if traced_calls is None:
        spans = decode(tensors)
    else:
        name = f"decode_answer_spans({max_answer_length}, {n_best_size})"
        spans = traced_calls(name, decode, tensors)
    return {name: value.numpy() for name, value in spans.items()}


def tuned_null_threshold(
    best_threshold: float, null_score_diffs: list[float], *, answer_none: bool = False
) -> float:
    """The official best-F1 "no answer" threshold, moved halfway to the next `null_score_diff`.

    Every threshold in between gives the same validation F1; the midpoint
    keeps a margin on both sides instead of sitting on one question's score.
    `answer_none`: answering no question scored best. The official search then
    reports its starting threshold, 0.0, which would answer every question whose
    difference is below 0; the threshold returned lies below every difference.

    Example:
        >>> tuned_null_threshold(1.0, [0.5, 1.0, 3.0, 5.0, float("inf")])
        2.0
        >>> tuned_null_threshold(1.0, [0.5, 1.0, float("inf")])
        1.0
        >>> tuned_null_threshold(0.0, [-2.5, 1.0, float("inf")], answer_none=True)
        -3.5
    """
    finite = [diff for diff in null_score_diffs if diff < float("inf")]
    if answer_none:
        return min(finite) - 1.0 if finite else best_threshold
    above = [diff for diff in finite if diff > best_threshold]
    return (best_threshold + min(above)) / 2 if above else best_threshold


def _band_length(start_logits, max_answer_length: int) -> tf.Tensor:
    """Answer lengths worth scoring: no more than the sequence holds."""
    return tf.minimum(max_answer_length, tf.shape(start_logits)[1])


def _best_spans_per_window(start_logits, end_logits, start_ok, end_ok, max_length, n_best):
    """Each window's best spans: scores (W, k) and span ids (W, k) int64.

    Spans are scored in a (W, S, L) band, end = start + offset for offsets
    0..L-1, rather than a (W, S, S) matrix. A span id is
    `(window * S + start) * L + offset`; invalid spans score -inf.
    """
    seq_length = tf.shape(start_logits)[1]
    band_length = _band_length(start_logits, max_length)
    ends = tf.range(seq_length)[:, None] + tf.range(band_length)[None, :]  # (S, L)
    in_sequence = ends < seq_length
    ends = tf.minimum(ends, seq_length - 1)
    valid = start_ok[:, :, None] & tf.gather(end_ok, ends, axis=1) & in_sequence  # (W, S, L)
    scores = start_logits[:, :, None] + tf.gather(end_logits, ends, axis=1)  # (W, S, L)
    scores = tf.where(valid, scores, float("-inf"))
    scores = tf.reshape(scores, [tf.shape(start_logits)[0], -1])  # (W, S * L)
    best = tf.math.top_k(scores, k=tf.minimum(n_best, tf.shape(scores)[1]))  # ties: lower index
    window = tf.range(tf.shape(scores, out_type=tf.int64)[0])[:, None]
    span_ids = window * tf.cast(tf.shape(scores)[1], tf.int64) + tf.cast(best.indices, tf.int64)
    return best.values, span_ids


def _best_spans_per_example(scores, span_ids, example_ids, n_best: int):
    """Merges each example's windows: scores (E, n_best) and span ids (E, n_best), -1 if none.

    Windows stay in order within an example's row, so top_k's lower-index
    tie rule prefers the earlier window.
    """
    per_example = tf.RaggedTensor.from_value_rowids(scores, example_ids)  # (E, (w), k)
    ids_per_example = tf.RaggedTensor.from_value_rowids(span_ids, example_ids)
    scores = per_example.merge_dims(1, 2).to_tensor(default_value=float("-inf"))  # (E, w * k)
    span_ids = ids_per_example.merge_dims(1, 2).to_tensor(default_value=-1)
    # n_best padding columns give top_k enough entries and a static width.
    scores = tf.pad(scores, [[0, 0], [0, n_best]], constant_values=float("-inf"))
    span_ids = tf.pad(span_ids, [[0, 0], [0, n_best]], constant_values=-1)
    best = tf.math.top_k(scores, k=n_best)
    span_ids = tf.gather(span_ids, best.indices, batch_dims=1)
    span_ids = tf.where(tf.math.is_finite(best.values), span_ids, -1)
    return best.values, span_ids


def _unpack_span_ids(span_ids, start_logits, max_length: int):
    """(window, start, end) int32 from span ids; -1 stays -1 in all three."""
    seq_length = tf.cast(tf.shape(start_logits)[1], tf.int64)
    band_length = tf.cast(_band_length(start_logits, max_length), tf.int64)
    offset = span_ids % band_length
    position = span_ids // band_length  # window * S + start
    window, start = position // seq_length, position % seq_length
    found = span_ids >= 0
    return tuple(tf.cast(tf.where(found, x, -1), tf.int32) for x in (window, start, start + offset))


def span_candidates(
    windows: list[tuple[int, int]], context_offset: int, sequence_length: int
) -> tuple[list[list[bool]], list[list[bool]]]:
    """Start and end candidate masks for the windows of one example.

    Window `i` covers context tokens `windows[i]` (from
    `bertkit.windows.sliding_windows`) and places them at sequence positions
    from `context_offset` on (after `[CLS] question [SEP]`). Every context
    token may end a span in each window that holds it; it may start one only
    in the window where it has the most context.

    Example:
        >>> starts, ends = span_candidates([(0, 3), (2, 5)], context_offset=1,
        ...                                sequence_length=5)
        >>> [[int(x) for x in row] for row in starts]
        [[0, 1, 1, 1, 0], [0, 0, 1, 1, 0]]
        >>> [[int(x) for x in row] for row in ends]
        [[0, 1, 1, 1, 0], [0, 1, 1, 1, 0]]
    """
    owners = max_context_windows(windows, windows[-1][1])
    starts, ends = [], []
    for index, (first, last) in enumerate(windows):
        if context_offset + last - first > sequence_length:
            raise ValueError(f"window {index} does not fit in {sequence_length} positions")
        end_row = [False] * sequence_length
        start_row = [False] * sequence_length
        for token in range(first, last):
            end_row[context_offset + token - first] = True
            start_row[context_offset + token - first] = owners[token] == index
        starts.append(start_row)
        ends.append(end_row)
    return starts, ends


def batch_span_candidates(questions, tokens, starts, ends, num_tokens):
    """`span_candidates` in TensorFlow ops, for rows `[CLS] question [SEP] window [SEP]`.

    Args:
        questions: (windows, (question pieces)) ragged, each window's question;
            only their lengths matter.
        tokens: (windows, (tokens)) int64 ragged, each window's context tokens
            `range(starts[w], ends[w])`, as indices into all contexts' tokens.
        starts, ends: (windows,) int64, each window's first and end token.
        num_tokens: how many tokens all contexts hold.

    Returns:
        Start and end candidate masks, each (windows, longest row) bool.

    Example (a 1-piece question, so the context starts at position 3):
        >>> starts, ends = tf.constant([0, 2], tf.int64), tf.constant([3, 5], tf.int64)
        >>> start_ok, end_ok = batch_span_candidates(
        ...     tf.ragged.constant([[9], [9]]), tf.ragged.range(starts, ends), starts, ends, 5)
        >>> python_starts, python_ends = span_candidates([(0, 3), (2, 5)], context_offset=3,
        ...                                              sequence_length=7)
        >>> start_ok.numpy().tolist() == python_starts, end_ok.numpy().tolist() == python_ends
        (True, True)
    """
    import tensorflow_text as tf_text

    def layout(flags):  # ragged (windows, (tokens)) -> (windows, seq) bool
        packed, _ = tf_text.combine_segments(
            [tf.zeros_like(questions), tf.cast(flags, tf.int32)],
            start_of_sequence_id=0,
            end_of_segment_id=0,
        )
        return packed.to_tensor() > 0

    owners = max_context_flags(tokens, starts, ends, num_tokens)
    return layout(owners), layout(tf.ones_like(tokens))


def answer_tokens(example, char_starts, char_ends) -> tuple[int, int] | None:
    """(first, last) context tokens of the example's first placed answer (`answer_starts`
    not -1); None without one.

    Args:
        example: a `bertkit_tasks.span_qa.squad.QAExample` (its `answers` and `answer_starts`).
        char_starts, char_ends: (tokens,) each context token's character span.

    Example:
        >>> from bertkit_tasks.span_qa.squad import QAExample
        >>> example = QAExample("q", "Who?", "Ada wrote", ("wrote",), (4,), False)
        >>> answer_tokens(example, np.array([0, 4]), np.array([3, 9]))
        (1, 1)
    """
    placed = [(s, a) for s, a in zip(example.answer_starts, example.answers, strict=True) if s >= 0]
    if not placed:
        return None
    start, text = placed[0]
    end = start + len(text)
    inside = np.flatnonzero((char_ends > start) & (char_starts < end))
    return (int(inside[0]), int(inside[-1])) if len(inside) else None


def answer_char_span(
    window_token_starts, window_token_ends, start_token: int, end_token: int
) -> tuple[int, int]:
    """Character span `[start_char, end_char)` of a decoded answer in the original context.

    Args:
        window_token_starts: per window position, the character where its token
            starts in the original context; negative for non-context positions.
        window_token_ends: per window position, the character just after its token.
        start_token: first answer position in the window (`start_index`).
        end_token: last answer position in the window (`end_index`), inclusive.

    Example:
        >>> context = "Ada Lovelace wrote it."
        >>> # [CLS] who [SEP] ada love ##lace wrote it . [SEP]
        >>> starts = [-1, -1, -1, 0, 4, 8, 13, 19, 21, -1]
        >>> ends = [-1, -1, -1, 3, 8, 12, 18, 21, 22, -1]
        >>> start_char, end_char = answer_char_span(starts, ends, 3, 5)
        >>> context[start_char:end_char]
        'Ada Lovelace'
    """
    if not 0 <= start_token <= end_token:
        raise ValueError(f"not a span: start {start_token}, end {end_token}")
    start_char, end_char = int(window_token_starts[start_token]), int(window_token_ends[end_token])
    if start_char < 0 or end_char < 0:
        raise ValueError(f"tokens {start_token}..{end_token} are not all in the context")
    return start_char, end_char
