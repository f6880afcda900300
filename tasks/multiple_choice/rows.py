"""Multiple choice's model rows: one row a question, its choices side by side, in Python and TF.

transformers' `BertForMultipleChoice` scores `[CLS] question [SEP] choice [SEP]` once per
choice, flattening the choices into the batch, and softmaxes the N scores. bertkit keeps the
task contract (a row's loss reads that row only: `bertkit.task`) by laying an example's N
sequences end to end in one row, as packing lays rows: each choice's word pieces get
positions from 0 (`position_ids`), its number 1..N (`choice_index`, which makes the attention
block-diagonal: a choice never sees another), and the row records where each choice's `[CLS]`
is (`choice_starts`, N per row). The encoder computes for each choice exactly what it computes
for that sequence alone, and no row pads its shorter choices to its longest.

Each sequence gets `sequence_length // N` word pieces, question and choice cut longest first as
a text pair always is (`WordPieceTokenizer.pack`), so that a row is at most `sequence_length`
long: the recipe's `sequence_length` is the budget of a whole question with its choices.
`ChoiceRows` makes the rows in numpy (`featurize`: training, evaluation, `predict`) and in
TensorFlow ops (`serve`: the SavedModel); `bertkit.testing.check_preprocessor` checks that
both agree.
"""

from __future__ import annotations

import numpy as np

from bertkit.errors import UserError
from bertkit.task import Features


class ChoiceRows:
    """Questions with N choices -> one row each of N packed `[CLS] question [SEP] choice [SEP]`.

    Args:
        tokenizer: a `bertkit.model.tokenizer.WordPieceTokenizer`.
        sequence_length: the longest row, in word pieces: N sequences of at most
            `sequence_length // N` each.
        num_choices: N, the choices of every question.

    Example (2 choices in rows of at most 16: each sequence at most 8 pieces):
        >>> from bertkit.model.tokenizer import WordPieceTokenizer
        >>> from types import SimpleNamespace
        >>> tokenizer = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "where", "is",
        ...                                 "ice", "oven", "freezer"], lowercase=True)
        >>> rows = ChoiceRows(tokenizer, sequence_length=16, num_choices=2)
        >>> features = rows.featurize([SimpleNamespace(question="where is ice",
        ...                                            choices=("freezer", "oven"))])
        >>> features.columns["token_ids"][0].tolist()
        [2, 4, 5, 6, 3, 8, 3, 2, 4, 5, 6, 3, 7, 3]
        >>> features.columns["choice_index"][0].tolist()
        [1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2]
        >>> features.columns["choice_starts"].tolist()
        [[0, 7]]
    """

    def __init__(self, tokenizer, sequence_length: int, num_choices: int):
        self.tokenizer, self.num_choices = tokenizer, num_choices
        self.choice_length = sequence_length // num_choices
        if self.choice_length < 4:  # [CLS] question [SEP] choice [SEP]: a piece of each
            raise UserError(
                f"{num_choices} choices of at least 4 word pieces each need a sequence_length "
                f"of at least {4 * num_choices}, got {sequence_length}",
                key="backbone.sequence_length",
            )

    def featurize(self, examples: list) -> Features:
        """One row per example, with `position_ids`, `choice_index` and `choice_starts`."""
        n = self.num_choices
        questions = [example.question for example in examples for _ in range(n)]
        choices = [choice for example in examples for choice in example.choices]
        ids, segments = self.tokenizer.encode(
            questions, choices, sequence_length=self.choice_length
        )
        columns = {name: [] for name in ("token_ids", "segment_ids", "position_ids")}
        columns["choice_index"] = []
        starts = np.zeros((len(examples), n), np.int32)
        for row in range(len(examples)):
            pieces = ids[row * n : (row + 1) * n]
            lengths = [len(sequence) for sequence in pieces]
            starts[row] = np.cumsum([0, *lengths[:-1]])
            columns["token_ids"].append(np.concatenate(pieces))
            columns["segment_ids"].append(np.concatenate(segments[row * n : (row + 1) * n]))
            columns["position_ids"].append(np.concatenate([np.arange(k) for k in lengths]))
            columns["choice_index"].append(np.repeat(np.arange(1, n + 1), lengths))
        for name in ("position_ids", "choice_index"):
            columns[name] = [values.astype(np.int32) for values in columns[name]]
        columns["choice_starts"] = starts
        return Features(columns, example_index=np.arange(len(examples)))

    def serve(self, inputs: dict) -> dict:
        """The rows of `featurize`, in TensorFlow ops, from the signature's `question` and
        `choice_0` ... `choice_{N-1}` strings, each (batch,): the sequence columns (batch,
        (pieces)) ragged, `choice_starts` (batch, N), `example_index` (batch,), and
        `choices` (batch, N), the texts."""
        import tensorflow as tf

        n = self.num_choices
        batch = tf.shape(inputs["question"], out_type=tf.int64)[0]
        questions = tf.repeat(inputs["question"], n)  # (batch * N,)
        tokenize = self.tokenizer.tokenize
        choices = tf.stack([inputs[name] for name in choice_names(n)], axis=1)
        flat_choices = tf.reshape(choices, [-1])
        ids, segments = self.tokenizer.pack(
            [tokenize(questions), tokenize(flat_choices)], self.choice_length
        )
        lengths = ids.row_lengths()  # (batch * N,)
        number = tf.tile(tf.range(1, n + 1, dtype=ids.dtype), [batch])
        row_lengths = tf.reduce_sum(tf.reshape(lengths, [-1, n]), axis=1)  # (batch,)
        per_row = lambda values: tf.RaggedTensor.from_row_lengths(values, row_lengths)  # noqa: E731
        positions = tf.ragged.range(tf.cast(lengths, ids.dtype)).flat_values
        starts = tf.cumsum(tf.reshape(lengths, [-1, n]), axis=1, exclusive=True)
        return {
            "token_ids": per_row(ids.flat_values),
            "segment_ids": per_row(segments.flat_values),
            "position_ids": per_row(positions),
            "choice_index": per_row(tf.repeat(number, lengths)),
            "choice_starts": tf.cast(starts, tf.int32),
            "example_index": tf.range(batch),
            "choices": choices,
        }


def choice_names(count: int) -> list[str]:
    """The SavedModel's inputs of the choices.

    Example:
        >>> choice_names(3)
        ['choice_0', 'choice_1', 'choice_2']
    """
    return [f"choice_{index}" for index in range(count)]
