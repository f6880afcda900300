"""Tagging's preprocessor: sentences -> model rows over windows of words, in Python and TF.

keras-hub's `TextClassifierPreprocessor` keeps `_call_python` and `_call_tf` side
by side over one tokenizer and packer; `TaggingPreprocessor` does the same for
tagging. `featurize` (numpy: training, evaluation, `predict`) and `serve`
(TensorFlow ops: the SavedModel) share the tokenizer, its special tokens, the
window size, the stride, the pieces a word keeps and one window rule
(`bertkit.windows.word_windows`, mirrored in the graph by `windowed_rows`);
`bertkit.testing.check_preprocessor` checks that both make the same rows.

Words and word pieces. Each word is tokenized on its own (`tokenize_words`); its
label goes on its first word piece and its other pieces get the label -100,
which the loss ignores (with `label_all_subtokens`, every piece gets the word's
label). A word's prediction is always read from its first piece. A word without
pieces (control characters) becomes `[UNK]`, so no word is lost.

Long sentences. With `W = sequence_length - 2` pieces per model row, windows of
W pieces start every `window_stride` pieces (default `W // 2`); each window
holds the words that fit in it whole. A word is read in the window where it has
the most context, counted in words (`bertkit.windows.max_context_windows`). So
that every word fits whole in some window, a word keeps at most `W - stride + 1`
pieces (64 at sequence length 128): only its first piece carries its label.

Raw text. Its words are made by the task's rule (`text_words`, see
`bertkit_tasks.tagging.text_words`): BERT's basic tokenization (split at
whitespace and around punctuation and CJK characters), or one word a
character; both paths call `text_word_pieces`. Their character offsets come from
the byte offsets. A list of words keeps its words.
"""

from __future__ import annotations

import numpy as np

from bertkit.errors import UserError
from bertkit.task import Features
from bertkit.windows import max_context_windows, word_windows
from bertkit_tasks.tagging.text_words import text_word_pieces
from bertkit_tasks.tagging.word_pieces import sentence_word_pieces

IGNORED = -100  # label of the pieces the loss skips


class TaggingPreprocessor:
    """Sentences -> rows `[CLS] pieces [SEP]`, one per window of words, in Python and in TF.

    Both paths give the rows (`token_ids`, `segment_ids`), the sentence of each
    row (`example_index`) and `read_at`: per sentence, (words, 2), each word's
    row and the position of its first piece in the window that reads it.

    Args:
        tokenizer: a `bertkit.model.tokenizer.WordPieceTokenizer`.
        sequence_length: the longest row, in word pieces.
        window_stride: pieces between the starts of windows; None: half of
            `sequence_length - 2`.
        label_all_subtokens: label every piece of a word, not only its first.
        text_words: how a raw text becomes words: "bert" or "characters".

    Example (windows of 3 pieces every 2: "yorker" has 2 pieces, "." starts row 1):
        >>> from types import SimpleNamespace
        >>> import tensorflow as tf
        >>> from bertkit.model.tokenizer import WordPieceTokenizer
        >>> tokenizer = WordPieceTokenizer(
        ...     ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "new", "york", "##er", "."], True)
        >>> preprocessor = TaggingPreprocessor(tokenizer, sequence_length=5, window_stride=2)
        >>> features = preprocessor.featurize([SimpleNamespace(text="New Yorker.")])
        >>> [ids.tolist() for ids in features.columns["token_ids"]]
        [[2, 4, 5, 6, 3], [2, 7, 3]]
        >>> features.extras["read_at"][0].tolist()
        [[0, 1], [0, 2], [1, 1]]
        >>> served = preprocessor.serve({"text": tf.constant(["New Yorker."])})
        >>> served["token_ids"].to_list(), served["read_at"].to_list()
        ([[2, 4, 5, 6, 3], [2, 7, 3]], [[[0, 1], [0, 2], [1, 1]]])
    """

    def __init__(
        self,
        tokenizer,
        sequence_length: int,
        window_stride: int | None = None,
        label_all_subtokens: bool = False,
        text_words: str = "bert",
    ):
        self.tokenizer = tokenizer
        self.window_size = sequence_length - 2  # pieces between [CLS] and [SEP]
        self.stride = window_stride or max(1, self.window_size // 2)
        if self.stride > self.window_size:
            raise UserError(
                f"must be at most sequence_length - 2 = {self.window_size}, got {self.stride}",
                key="task.window_stride",
            )
        self.max_word_pieces = self.window_size - self.stride + 1
        self.label_all_subtokens = label_all_subtokens
        self.text_words = text_words

    # ---- Python: training, evaluation, predict
    def featurize(self, examples: list, labels: list | None = None) -> Features:
        """Examples (with `words` or `text`) -> `Features`, with a `labels` column.

        Args:
            examples: objects with `words` (a list of strings) or `text` (a string).
            labels: per example, its words' label ids, or None for no labels
                (every piece gets `IGNORED`); default: no labels at all.

        `Features.extras` holds `read_at` and `char_offsets` (per example, a
        (2, words) array of character starts and ends for a text, None for words).
        """
        return self.rows(self.word_pieces(examples), labels)

    def word_pieces(self, examples: list) -> list[tuple]:
        """Per example: (piece ids, pieces per word, (2, words) character offsets or None),
        by `bertkit_tasks.tagging.word_pieces.sentence_word_pieces`."""
        return sentence_word_pieces(self.tokenizer, examples, self.max_word_pieces, self.text_words)

    def rows(self, word_pieces: list, labels: list | None = None) -> Features:
        """`word_pieces` (as `word_pieces` gives them) and their words' labels -> `Features`."""
        labels = [None] * len(word_pieces) if labels is None else labels
        token_ids, row_labels, example_index, read_at, char_offsets = [], [], [], [], []
        for index, ((pieces, lengths, chars), word_labels) in enumerate(
            zip(word_pieces, labels, strict=True)
        ):
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # (words + 1,)
            windows = word_windows(offsets, self.window_size, self.stride)
            piece_labels = self.piece_labels(word_labels, lengths)
            read_at.append(_read_at(windows, offsets, first_row=len(token_ids)))
            for first, end in windows:
                span = slice(offsets[first], offsets[end])
                token_ids.append(
                    np.concatenate(
                        [[self.tokenizer.cls_id], pieces[span], [self.tokenizer.sep_id]]
                    ).astype(np.int32)
                )
                row_labels.append(np.concatenate([[IGNORED], piece_labels[span], [IGNORED]]))
                example_index.append(index)
            char_offsets.append(chars)
        columns = {
            "token_ids": token_ids,
            "segment_ids": [np.zeros_like(t) for t in token_ids],
            "labels": row_labels,
        }
        return Features(
            columns,
            np.array(example_index),
            pad_values={"labels": IGNORED},
            extras={"read_at": read_at, "char_offsets": char_offsets},
        )

    def piece_labels(self, word_labels, lengths: np.ndarray) -> np.ndarray:
        """(pieces,) label ids: a word's label on its first piece (or all), else `IGNORED`.

        Example:
            >>> preprocessor = TaggingPreprocessor(None, sequence_length=8)
            >>> preprocessor.piece_labels([4, 0], np.array([2, 1])).tolist()
            [4, -100, 0]
        """
        if word_labels is None:
            return np.full(int(lengths.sum()), IGNORED, dtype=np.int32)
        labels = []
        for label, count in zip(word_labels, lengths, strict=True):
            rest = label if self.label_all_subtokens else IGNORED
            labels += [label] + [rest] * (int(count) - 1)
        return np.array(labels, dtype=np.int32)

    # ---- TensorFlow: the SavedModel
    def serve(self, inputs: dict) -> dict:
        """`{"text": (batch,) strings}` -> the rows of `featurize`, in TensorFlow ops.

        Returns `token_ids` and `segment_ids`, (rows, (pieces)) ragged,
        `example_index` (rows,), `read_at` (batch, (words), 2), and the words'
        `byte_starts` and `byte_ends`, (batch, (words)), for cutting entities.
        """
        import tensorflow as tf

        from bertkit.windows import windowed_rows

        pieces, byte_starts, byte_ends = text_word_pieces(
            self.tokenizer, inputs["text"], self.text_words, self.max_word_pieces
        )
        rows, read_at = windowed_rows(
            pieces, self.window_size, self.stride, self.tokenizer.cls_id, self.tokenizer.sep_id
        )
        token_ids = rows.merge_dims(0, 1)  # (rows, (pieces)), every sentence's windows in order
        return {
            "token_ids": token_ids,
            "segment_ids": tf.zeros_like(token_ids),
            "example_index": rows.value_rowids(),
            "read_at": read_at,
            "byte_starts": byte_starts,
            "byte_ends": byte_ends,
        }


def _read_at(windows: list[tuple[int, int]], offsets: np.ndarray, first_row: int) -> np.ndarray:
    """(words, 2): each word's row and the position of its first piece in its max-context
    window; the sentence's rows start at `first_row`."""
    owner = np.array(max_context_windows(windows, len(offsets) - 1), dtype=np.int64)
    window_start = offsets[np.array([windows[w][0] for w in owner], dtype=np.int64)]
    return np.stack([first_row + owner, 1 + offsets[:-1] - window_start], axis=1)
