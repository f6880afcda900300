"""The packed forward pass: a task's model on keras-hub's `BertBackbone`, taking packed rows.

keras-hub's backbone takes one sequence a row; `bertkit.batching.packing` lays several rows end to
end in one. This module calls the backbone's own layers (same variables) with the three
inputs packing adds, so training can run packed while evaluation and export use the
task's model as it is (`tests/test_packing.py` checks the outputs against it).
"""

from __future__ import annotations

import keras
from keras import ops


def packed_training_model(model, backbone):
    """`model` (a task's model on keras-hub's `BertBackbone`) taking packed rows.

    The same layers and weights; the embeddings take `position_ids`, each encoder
    layer a block-diagonal attention mask made from `sequence_index`, and the
    pooler reads each row's first token at `first_token_index`, so that
    `pooled_output` has one vector per row of the batch (not per packed row).
    The head's layers (`model` from the backbone's outputs on) are called as they are.
    """
    names = ("token_ids", "segment_ids", "padding_mask", "position_ids", "sequence_index")
    inputs = {name: keras.Input(shape=(None,), dtype="int32", name=name) for name in names}
    inputs["first_token_index"] = keras.Input(shape=(), dtype="int32", name="first_token_index")
    positions = PositionsById(backbone.position_embedding)
    x = packed_sequence_output(
        backbone, inputs, lambda tokens: positions(inputs["position_ids"]), "sequence_index"
    )
    head_inputs, head_outputs = [backbone.output["sequence_output"]], [x]
    if backbone.pooled_dense in model.layers:  # the head reads [CLS] (else no pooler)
        head_inputs.append(backbone.output["pooled_output"])
        head_outputs.append(backbone.pooled_dense(FirstTokens()(x, inputs["first_token_index"])))
    head = keras.Model(head_inputs, model.output, name=f"{model.name}_head")
    outputs = head(head_outputs)
    return keras.Model(inputs, outputs, name=f"{model.name}_packed")


def packed_sequence_output(backbone, inputs: dict, positions_of, sequence_index: str):
    """The backbone's encoder over packed rows, with its own layers: `inputs`' `token_ids`,
    `segment_ids` and `padding_mask`, each token's position vector `positions_of(token
    embeddings)`, and attention only inside a sequence (`inputs[sequence_index]`: 1, 2, ...
    per sequence, 0 for padding). Packed training and multiple choice's rows of choices
    (`bertkit_tasks.multiple_choice.model`) both read it."""
    tokens = backbone.token_embedding(inputs["token_ids"])
    segments = backbone.segment_embedding(inputs["segment_ids"])
    x = backbone.embeddings_add((tokens, positions_of(tokens), segments))
    x = backbone.embeddings_layer_norm(x)
    x = backbone.embeddings_dropout(x)
    mask = SameSequenceMask()(inputs[sequence_index])
    for layer in backbone.transformer_layers:
        x = layer(x, padding_mask=inputs["padding_mask"], attention_mask=mask)
    return x


class PositionsById(keras.layers.Layer):
    """keras-hub's `PositionEmbedding` weights looked up at given positions (it only
    embeds positions 0, 1, ... of each row)."""

    def __init__(self, position_embedding, **kwargs):
        super().__init__(**kwargs)
        self.position_embedding = position_embedding  # tracked: its weights are trained

    def get_config(self):
        return {
            **super().get_config(),
            "position_embedding": keras.saving.serialize_keras_object(self.position_embedding),
        }

    @classmethod
    def from_config(cls, config):
        embedding = keras.saving.deserialize_keras_object(config.pop("position_embedding"))
        return cls(embedding, **config)

    def call(self, position_ids):
        table = self.position_embedding.position_embeddings
        return ops.cast(ops.take(table, position_ids, axis=0), self.compute_dtype)


class SameSequenceMask(keras.layers.Layer):
    """(batch, width, width) attention mask: query and key in the same packed row's
    sequence, and the key not padding."""

    def call(self, sequence_index):
        same = ops.equal(ops.expand_dims(sequence_index, 2), ops.expand_dims(sequence_index, 1))
        return ops.logical_and(same, ops.expand_dims(ops.greater(sequence_index, 0), 1))


class FirstTokens(keras.layers.Layer):
    """The vectors at flat positions `index` of a (batch, width, hidden) tensor."""

    def call(self, sequence, index):
        flat = ops.reshape(sequence, (-1, ops.shape(sequence)[-1]))
        return ops.take(flat, index, axis=0)
