"""Span QA's preprocessor: rows `[CLS] question [SEP] window [SEP]`, in Python and TF.

keras-hub's `TextClassifierPreprocessor` keeps `_call_python` and `_call_tf` side
by side over one tokenizer and packer; `SpanQAPreprocessor` does the same for
SQuAD rows. A context longer than the room the question leaves is read in
windows of its word pieces that start every `doc_stride` pieces
(`bertkit.windows`). `featurize` builds the rows with numpy for training,
evaluation and `predict` (`question_window_rows`, one question at a time);
`serve` builds the same rows in TensorFlow ops inside the SavedModel
(`graph_question_windows`), with the same tokenizer, question cut and window
rule, and `graph_answer_text` maps a span's positions in a window back to the
context's text. `bertkit.testing.check_preprocessor` checks that both paths make
the same rows and candidate masks.
"""

from __future__ import annotations

import numpy as np

from bertkit.errors import UserError
from bertkit.task import Features
from bertkit.windows import sliding_windows

_DECODING = ("char_starts", "char_ends", "starts_ok", "ends_ok")  # per-row extras for decode


class SpanQAPreprocessor:
    """Questions and contexts -> one row per window of the context, in Python and in TF.

    Both paths give the rows (`token_ids`, `segment_ids`), the example of each row
    (`example_index`) and, per row, where an answer may start and end
    (`starts_ok`, `ends_ok`: `bertkit_tasks.span_qa.span_decoding.span_candidates`).

    Args:
        tokenizer: a `bertkit.model.tokenizer.WordPieceTokenizer`.
        sequence_length: the longest row.
        max_query_length: question word pieces kept; longer questions are cut.
        doc_stride: word pieces between the starts of consecutive windows.

    Raises:
        UserError: the question leaves no room for the context.

    Example (rows of 7: 2 context pieces a window, the next window 1 piece on):
        >>> import tensorflow as tf
        >>> from bertkit.model.tokenizer import WordPieceTokenizer
        >>> from bertkit_tasks.span_qa.squad import QAExample
        >>> tokenizer = WordPieceTokenizer(
        ...     ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "who", "?", "ann", "met", "bob"], True)
        >>> preprocessor = SpanQAPreprocessor(tokenizer, 7, max_query_length=2, doc_stride=1)
        >>> question = QAExample("q", "Who?", "Ann met Bob", (), (), True)
        >>> features = preprocessor.featurize([question])
        >>> [ids.tolist() for ids in features.columns["token_ids"]]
        [[2, 4, 5, 3, 6, 7, 3], [2, 4, 5, 3, 7, 8, 3]]
        >>> [ok.astype(int).tolist() for ok in features.extras["starts_ok"]]  # "met": row 0
        [[0, 0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 1, 0]]
        >>> served = preprocessor.serve({"question": tf.constant(["Who?"]),
        ...                              "context": tf.constant(["Ann met Bob"])})
        >>> served["token_ids"].to_list() == [[2, 4, 5, 3, 6, 7, 3], [2, 4, 5, 3, 7, 8, 3]]
        True
    """

    def __init__(self, tokenizer, sequence_length: int, max_query_length: int, doc_stride: int):
        if sequence_length - max_query_length - 3 < 1:
            raise UserError(
                f"a question of {max_query_length} word pieces leaves no room for "
                f"the context in {sequence_length}; lower it below "
                f"{sequence_length - 3}",
                key="task.max_query_length",
            )
        self.tokenizer = tokenizer
        self.sequence_length = sequence_length
        self.max_query_length = max_query_length
        self.doc_stride = doc_stride

    # ---- Python: training, evaluation, predict
    def featurize(self, examples: list, training: bool = False) -> Features:
        """Examples (`question`, `context`, answers) -> one row per window.

        Columns: `token_ids`, `segment_ids`, and the targets `start_positions` and
        `end_positions` (the answer's tokens in the row, else 0: [CLS]). In `training`,
        an answerable question none of whose answers covers context tokens has no rows
        (it is not trained on as unanswerable). Without `training`, `Features.extras`
        holds what decoding needs, per row: `char_starts`, `char_ends`, `starts_ok` and
        `ends_ok` (`question_window_rows`).
        """
        from bertkit.model.tokenizer import character_offsets, tokenize_in_chunks
        from bertkit_tasks.span_qa.span_decoding import answer_tokens

        questions = tokenize_in_chunks(self.tokenizer.tokenize, [e.question for e in examples])
        unique = list(dict.fromkeys(e.context for e in examples))
        pieces = tokenize_in_chunks(self.tokenizer.tokenize_with_offsets, unique)
        contexts = {
            text: (ids, *character_offsets(text, starts, ends))
            for text, (ids, starts, ends) in zip(unique, pieces, strict=True)
        }
        rows, example_index = [], []
        for index, (example, (question,)) in enumerate(zip(examples, questions, strict=True)):
            context = contexts[example.context]
            answer = answer_tokens(example, *context[1:])
            if training and answer is None and example.answers:
                continue  # no answer placed in the context: not a question without one
            example_rows = question_window_rows(
                question[: self.max_query_length],
                context,
                answer,
                cls_id=self.tokenizer.cls_id,
                sep_id=self.tokenizer.sep_id,
                sequence_length=self.sequence_length,
                doc_stride=self.doc_stride,
                training=training,
            )
            rows += example_rows
            example_index += [index] * len(example_rows)
        columns = {name: [row[name] for row in rows] for name in ("token_ids", "segment_ids")}
        for name in ("start_positions", "end_positions"):
            columns[name] = np.array([row[name] for row in rows], dtype=np.int32)
        extras = {} if training else {name: [row[name] for row in rows] for name in _DECODING}
        return Features(columns, np.array(example_index, dtype=np.int64), extras=extras)

    # ---- TensorFlow: the SavedModel
    def serve(self, inputs: dict) -> dict:
        """`{"question", "context"}`, (batch,) strings each -> the rows of `featurize`, in TF.

        Returns what `graph_question_windows` does (`token_ids`, `segment_ids`,
        `example_index`, ...), `starts_ok` and `ends_ok` (rows, (tokens)) bool,
        and the context pieces' `byte_starts` and `byte_ends`, (batch, (pieces)),
        for `graph_answer_text`.
        """
        import tensorflow as tf

        from bertkit_tasks.span_qa.span_decoding import batch_span_candidates

        questions = self.tokenizer.tokenize(inputs["question"])[:, : self.max_query_length]
        pieces, byte_starts, byte_ends = self.tokenizer.tokenize_with_offsets(inputs["context"])
        windows = graph_question_windows(
            self.tokenizer, questions, pieces, self.sequence_length, self.doc_stride
        )
        start_ok, end_ok = batch_span_candidates(  # each (rows, longest row)
            windows["questions"],
            windows["tokens"],
            windows["starts"],
            windows["ends"],
            tf.shape(pieces.flat_values, out_type=tf.int64)[0],
        )
        lengths = windows["token_ids"].row_lengths()
        return {
            **windows,
            "byte_starts": byte_starts,
            "byte_ends": byte_ends,
            "starts_ok": tf.RaggedTensor.from_tensor(start_ok, lengths=lengths),
            "ends_ok": tf.RaggedTensor.from_tensor(end_ok, lengths=lengths),
        }


def question_window_rows(
    question,
    context,
    answer,
    *,
    cls_id: int,
    sep_id: int,
    sequence_length: int,
    doc_stride: int,
    training: bool,
) -> list[dict]:
    """The rows of one question, with the answer's positions and what decoding needs.

    Args:
        question: the question's piece ids, already cut to the longest allowed.
        context: `(piece ids, character starts, character ends)` of the context.
        answer: the answer's first and last context piece, or None (no answer).
        cls_id, sep_id: the [CLS] and [SEP] ids.
        sequence_length: the longest row.
        doc_stride: pieces between the starts of consecutive windows.
        training: without it, each row also gets `char_starts`/`char_ends` (per
            position, the context characters it covers, -1 outside the context)
            and `starts_ok`/`ends_ok` (where a span may start and end:
            `bertkit_tasks.span_qa.span_decoding.span_candidates`).

    Returns:
        Per window: `token_ids`, `segment_ids`, and `start_positions` and
        `end_positions`, the answer's positions if it lies whole in the window,
        else 0 ([CLS], the null answer).

    Example:
        >>> context = (np.array([10, 11, 12, 13, 14]), np.arange(5) * 2, np.arange(5) * 2 + 1)
        >>> rows = question_window_rows(np.array([7]), context, (3, 4), cls_id=2, sep_id=3,
        ...                             sequence_length=7, doc_stride=2, training=True)
        >>> [(r["token_ids"].tolist(), r["start_positions"], r["end_positions"]) for r in rows]
        [([2, 7, 3, 10, 11, 12, 3], 0, 0), ([2, 7, 3, 12, 13, 14, 3], 4, 5)]
    """
    from bertkit_tasks.span_qa.span_decoding import span_candidates

    pieces, char_starts, char_ends = context
    offset = len(question) + 2  # [CLS] question [SEP]
    windows = sliding_windows(len(pieces), sequence_length - offset - 1, doc_stride)
    if not training:
        starts_ok, ends_ok = span_candidates(windows, offset, sequence_length)
    rows = []
    for index, (first, last) in enumerate(windows):
        ids = np.concatenate([[cls_id], question, [sep_id], pieces[first:last], [sep_id]]).astype(
            np.int32
        )
        inside = answer is not None and first <= answer[0] and answer[1] < last
        row = {
            "token_ids": ids,
            "segment_ids": (np.arange(len(ids)) >= offset).astype(np.int32),
            "start_positions": offset + answer[0] - first if inside else 0,
            "end_positions": offset + answer[1] - first if inside else 0,
        }
        if not training:
            for name, values in (("char_starts", char_starts), ("char_ends", char_ends)):
                row[name] = np.full(len(ids), -1, dtype=np.int64)
                row[name][offset : offset + last - first] = values[first:last]
            row["starts_ok"] = np.array(starts_ok[index][: len(ids)])
            row["ends_ok"] = np.array(ends_ok[index][: len(ids)])
        rows.append(row)
    return rows


def graph_question_windows(
    tokenizer, questions, pieces, sequence_length: int, doc_stride: int
) -> dict:
    """`question_window_rows` in TensorFlow ops, for a batch of questions and contexts.

    Args:
        tokenizer: a `bertkit.model.tokenizer.WordPieceTokenizer`.
        questions: (batch, (pieces)) question piece ids, already cut.
        pieces: (batch, (pieces)) context piece ids.
        sequence_length: the longest row.
        doc_stride: pieces between the starts of consecutive windows.

    Returns:
        Per window (flat over the batch): `token_ids` and `segment_ids`
        (ragged rows), `example_index` (int64), `starts` and `ends` of its
        context pieces as indices into `pieces.flat_values`, `tokens`
        (windows, (pieces)) the same indices one by one, and `questions`,
        its question's pieces.

    Example:
        >>> import tensorflow as tf
        >>> from bertkit.model.tokenizer import WordPieceTokenizer
        >>> tokenizer = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]"], True)
        >>> rows = graph_question_windows(tokenizer, tf.ragged.constant([[7]], tf.int64),
        ...     tf.ragged.constant([[10, 11, 12, 13, 14]], tf.int64), 7, doc_stride=2)
        >>> rows["token_ids"].to_list()
        [[2, 7, 3, 10, 11, 12, 3], [2, 7, 3, 12, 13, 14, 3]]
    """
    import tensorflow as tf

    from bertkit.windows import batch_sliding_windows

    example_index, starts, ends = batch_sliding_windows(  # context pieces per window
        pieces.row_lengths(), sequence_length - 3 - questions.row_lengths(), doc_stride
    )
    first_piece = tf.gather(pieces.row_splits[:-1], example_index)  # of the window's context
    starts, ends = starts + first_piece, ends + first_piece  # now into pieces.flat_values
    tokens = tf.ragged.range(starts, ends)  # (windows, (pieces))
    window_questions = tf.gather(questions, example_index)
    token_ids, segment_ids = tokenizer.pack(
        [window_questions, tf.gather(pieces.flat_values, tokens)], sequence_length
    )
    return {
        "token_ids": token_ids,
        "segment_ids": segment_ids,
        "example_index": example_index,
        "starts": starts,
        "ends": ends,
        "tokens": tokens,
        "questions": window_questions,
    }


def graph_answer_text(
    contexts, byte_starts, byte_ends, windows: dict, window, start_index, end_index, answered
):
    """(TF) Answers cut from their contexts: text, character start and end ("", 0, 0 if none).

    Args:
        contexts: (examples,) strings.
        byte_starts, byte_ends: (examples, (pieces)) byte offsets of the context pieces.
        windows: the rows of `graph_question_windows` for these contexts.
        window: (examples,) the window each answer was found in (any window where
            not `answered`).
        start_index, end_index: (examples,) the answer's first and last position
            in its window's row.
        answered: (examples,) bool; where False, the answer is empty.

    Example:
        >>> import tensorflow as tf
        >>> from bertkit.model.tokenizer import WordPieceTokenizer
        >>> tokenizer = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]"], True)
        >>> windows = graph_question_windows(tokenizer, tf.ragged.constant([[7]], tf.int64),
        ...     tf.ragged.constant([[10, 11, 12]], tf.int64), 16, doc_stride=8)
        >>> texts, starts, ends = graph_answer_text(  # positions 4-5: [CLS] 7 [SEP] 10 11 12
        ...     tf.constant(["big red car"]), tf.ragged.constant([[0, 4, 8]], tf.int64),
        ...     tf.ragged.constant([[3, 7, 11]], tf.int64), windows, tf.constant([0]),
        ...     tf.constant([4]), tf.constant([5]), tf.constant([True]))
        >>> texts.numpy().tolist(), starts.numpy().tolist(), ends.numpy().tolist()
        ([b'red car'], [4], [11])
    """
    import tensorflow as tf

    from bertkit.model.tokenizer import batch_substrings

    question_pieces = tf.gather(windows["questions"].row_lengths(), window)
    # the context piece that position 0 would hold: [CLS] question [SEP] come first
    piece_of_position_0 = tf.gather(windows["starts"], window) - question_pieces - 2
    byte_start, byte_end = (
        _gather_or_zero(
            offsets.flat_values, piece_of_position_0 + tf.cast(index, tf.int64), answered
        )
        for offsets, index in ((byte_starts, start_index), (byte_ends, end_index))
    )
    return batch_substrings(contexts, byte_start, byte_end)


def _gather_or_zero(values, indices, keep):
    """values[indices] where `keep`, else 0; safe when `values` is empty."""
    import tensorflow as tf

    padded = tf.concat([values, tf.zeros([1], values.dtype)], 0)
    return tf.gather(padded, tf.where(keep, indices, tf.shape(values, out_type=indices.dtype)[0]))
