"""Long documents in classification (`task.long_text: windows`): windows of word pieces.

A text longer than a model row is not cut at `sequence_length`: its word pieces are split into
overlapping windows, the rule span QA and tagging use (`bertkit.windows.sliding_windows`:
`W = sequence_length - 2` pieces a window, a new window every `window_stride` pieces, the last
one ending at the text's end), and each window becomes a row `[CLS] pieces [SEP]`. Every row is
trained on its document's label, so a row's loss reads that row only (the task contract), and
the document's logits are the mean or the maximum of its windows' logits (`document_logits`),
in `decode` and in the SavedModel's graph (`document_logits_tf`).

`DocumentWindows` makes the rows in both paths, numpy (`featurize`: training, evaluation,
`predict`) and TensorFlow (`serve`: the SavedModel), over one tokenizer and one window rule;
`bertkit.testing.check_preprocessor` checks that they agree.
"""

from __future__ import annotations

import numpy as np

from bertkit.errors import UserError
from bertkit.model.token_rows import in_chunks, split_rows
from bertkit.task import Features
from bertkit.windows import batch_sliding_windows, sliding_windows


class DocumentWindows:
    """Texts -> rows `[CLS] pieces [SEP]`, one per window of word pieces, in Python and TF.

    Args:
        tokenizer: a `bertkit.model.tokenizer.WordPieceTokenizer`.
        sequence_length: the longest row, in word pieces.
        window_stride: pieces between the starts of windows; None: half of
            `sequence_length - 2`.
        max_windows: the most windows a document may need (None: no limit); a longer
            document is refused, naming its file, line and `text_key`.
        text_key: the recipe key of the text column, named in that refusal.

    Example (windows of 3 pieces every 2 over 5 pieces: 3 rows):
        >>> from bertkit.model.tokenizer import WordPieceTokenizer
        >>> from types import SimpleNamespace
        >>> tokenizer = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "b", "c",
        ...                                 "d", "e"], lowercase=True)
        >>> windows = DocumentWindows(tokenizer, sequence_length=5, window_stride=2)
        >>> features = windows.featurize([SimpleNamespace(text="a b c d e")])
        >>> [row.tolist() for row in features.columns["token_ids"]]
        [[2, 4, 5, 6, 3], [2, 6, 7, 8, 3]]
        >>> features.example_index.tolist()
        [0, 0]
    """

    def __init__(
        self,
        tokenizer,
        sequence_length: int,
        window_stride: int | None = None,
        max_windows: int | None = None,
        text_key: str = "data.text",
    ):
        self.tokenizer, self.window_size = tokenizer, sequence_length - 2
        self.stride = window_stride or max(1, self.window_size // 2)
        if self.stride > self.window_size:
            raise UserError(
                f"must be at most sequence_length - 2 = {self.window_size}, got {self.stride}",
                key="task.window_stride",
            )
        self.max_windows, self.text_key = max_windows, text_key

    def featurize(self, examples: list) -> Features:
        """The rows of every example's windows, in order, with `example_index`."""
        cls_id, sep_id = self.tokenizer.cls_id, self.tokenizer.sep_id
        rows, example_index = [], []
        pieces_of = self._pieces(examples)
        for index, (example, pieces) in enumerate(zip(examples, pieces_of, strict=True)):
            windows = sliding_windows(len(pieces), self.window_size, self.stride)
            self._check_count(example, len(windows))
            for start, end in windows:
                rows.append(np.concatenate([[cls_id], pieces[start:end], [sep_id]]))
                example_index.append(index)
        token_ids = [row.astype(np.int32) for row in rows]
        return Features(
            {"token_ids": token_ids, "segment_ids": [np.zeros_like(row) for row in token_ids]},
            example_index=np.array(example_index, dtype=np.int64),
        )

    def check_input(self, example) -> None:
        """Refuses one input (`predict`, `serve`) that needs more than `max_windows` windows:
        an error of its own, where `featurize` would refuse the whole batch."""
        if self.max_windows is not None:
            count = len(
                sliding_windows(len(self._pieces([example])[0]), self.window_size, self.stride)
            )
            self._check_count(example, count)

    def _pieces(self, examples: list) -> list[np.ndarray]:
        import tensorflow as tf

        pieces = []
        for chunk in in_chunks([example.text for example in examples]):
            pieces += split_rows(self.tokenizer.tokenize(tf.constant(chunk)))
        return pieces

    def _check_count(self, example, count: int) -> None:
        if self.max_windows is not None and count > self.max_windows:
            raise UserError(
                f"the text needs {count} windows of {self.window_size} word pieces, more "
                f"than task.max_windows = {self.max_windows}",
                source=getattr(example, "source", None),
                line=getattr(example, "line", None),
                key=self.text_key,
            )

    def serve(self, inputs: dict) -> dict:
        """The rows of `featurize`, in TensorFlow ops, from the signature's `text` strings:
        `token_ids` and `segment_ids` (rows, (pieces)) ragged, `example_index` (rows,)."""
        import tensorflow as tf

        pieces = self.tokenizer.tokenize(inputs["text"])  # (batch, (pieces))
        lengths = tf.cast(pieces.row_lengths(), tf.int64)
        sizes = tf.fill(tf.shape(lengths), tf.constant(self.window_size, tf.int64))
        document, starts, ends = batch_sliding_windows(lengths, sizes, self.stride)
        if self.max_windows is not None:
            counts = tf.math.bincount(tf.cast(document, tf.int32), dtype=tf.int64)
            tf.debugging.assert_less_equal(
                counts,
                tf.constant(self.max_windows, tf.int64),
                message=f"a text needs more windows than task.max_windows = {self.max_windows}",
            )
        first = tf.gather(tf.cast(pieces.row_starts(), tf.int64), document)
        window_pieces = tf.gather(pieces.values, tf.ragged.range(first + starts, first + ends))
        edge = tf.ones([window_pieces.nrows(), 1], window_pieces.dtype)
        token_ids = tf.concat(
            [
                tf.RaggedTensor.from_tensor(edge * self.tokenizer.cls_id),
                window_pieces,
                tf.RaggedTensor.from_tensor(edge * self.tokenizer.sep_id),
            ],
            axis=1,
        )
        return {
            "token_ids": token_ids,
            "segment_ids": tf.zeros_like(token_ids),
            "example_index": document,
        }


def document_logits(logits: np.ndarray, example_index: np.ndarray, count: int, how: str):
    """(count, labels): each example's logits from its rows' (`how`: "mean" or "max").

    Example:
        >>> logits = np.array([[1.0, 0.0], [3.0, -2.0], [0.0, 5.0]])
        >>> document_logits(logits, np.array([0, 0, 1]), 2, "mean").tolist()
        [[2.0, -1.0], [0.0, 5.0]]
        >>> document_logits(logits, np.array([0, 0, 1]), 2, "max").tolist()
        [[3.0, 0.0], [0.0, 5.0]]
    """
    if how == "max":
        combined = np.full((count, logits.shape[1]), -np.inf)
        np.maximum.at(combined, example_index, logits)
        return combined
    combined = np.zeros((count, logits.shape[1]))
    np.add.at(combined, example_index, logits)
    return combined / np.bincount(example_index, minlength=count)[:, None]


def document_logits_tf(logits, example_index, count, how: str):
    """`document_logits` in TensorFlow ops, for the SavedModel."""
    import tensorflow as tf

    combine = tf.math.unsorted_segment_max if how == "max" else tf.math.unsorted_segment_mean
    return combine(logits, example_index, count)
