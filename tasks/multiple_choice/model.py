"""The multiple-choice model: keras-hub's `BertBackbone` layers over a row of N packed choices.

The backbone's own layers (same variables, so LoRA, freezing, re-initialising and the
transformers export see the usual backbone) are called as `bertkit.model.packed_backbone` calls
them for packed training: positions restart at each choice, the attention stays inside a
choice, and the pooler reads each choice's `[CLS]` (`bertkit_tasks.multiple_choice.rows`).
Then, as transformers' `BertForMultipleChoice`: dropout, one shared `Dense(1)` (`chooser`) per
choice, and the N scores are the logits of a softmax over the choices.
"""

from __future__ import annotations

import keras
from keras import ops

from bertkit.model.packed_backbone import packed_sequence_output
from bertkit.task import head_initializer

SEQUENCE_INPUTS = ("token_ids", "segment_ids", "padding_mask", "position_ids", "choice_index")


def choice_model(backbone, dropout: float):
    """(batch, N) choice logits from the rows of `ChoiceRows` (its columns as inputs)."""
    inputs = {
        name: keras.Input(shape=(None,), dtype="int32", name=name) for name in SEQUENCE_INPUTS
    }
    inputs["choice_starts"] = keras.Input(shape=(None,), dtype="int32", name="choice_starts")
    # the layer itself is called (its table rows 0..width-1), so that it stays one of the
    # model's layers under its name, where the transformers export looks for it
    take = TakeRows()
    positions_of = lambda tokens: take(backbone.position_embedding(tokens), inputs["position_ids"])  # noqa: E731
    x = packed_sequence_output(backbone, inputs, positions_of, "choice_index")
    pooled = backbone.pooled_dense(ChoiceFirstTokens()(x, inputs["choice_starts"]))
    pooled = keras.layers.Dropout(dropout, name="chooser_dropout")(pooled)
    scores = keras.layers.Dense(1, name="chooser", kernel_initializer=head_initializer())(pooled)
    logits = keras.layers.Reshape((-1,), name="choice_logits")(scores)  # (batch, N)
    return keras.Model(inputs, logits, name="bert_multiple_choice")


class TakeRows(keras.layers.Layer):
    """Rows `index` (batch, width) of the first of a (batch, width, hidden) stack of one table
    (what keras-hub's `PositionEmbedding` returns): each token's position vector."""

    def call(self, table, index):
        return ops.take(table[0], index, axis=0)


class ChoiceFirstTokens(keras.layers.Layer):
    """(batch, N, hidden): the vectors of a (batch, width, hidden) sequence at each row's N
    positions `starts` (batch, N)."""

    def call(self, sequence, starts):
        width, hidden = ops.shape(sequence)[1], ops.shape(sequence)[2]
        flat = ops.reshape(sequence, (-1, hidden))
        starts = ops.clip(starts, 0, width - 1)  # never another row's, nor past the batch
        offsets = ops.expand_dims(ops.arange(ops.shape(starts)[0], dtype=starts.dtype), 1)
        return ops.take(flat, starts + offsets * ops.cast(width, starts.dtype), axis=0)
