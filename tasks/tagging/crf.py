"""The CRF head of tagging (`task.head: crf`): learned transition scores and their loss.

A linear-chain CRF scores a sentence's tag sequence `y` as the sum of each word's
emission (the tagger's logit of its tag) and of the transition scores between
neighbouring tags, from the sentence's start and to its end; training minimizes
the negative log-likelihood `log Z - score(y)` of the gold tags, `Z` summing over
all tag sequences (the forward algorithm). Decoding is the Viterbi search that
constrained decoding already runs (`bertkit_tasks.tagging.decoding.choose_tags`),
with the learned scores added to its transitions.

`TransitionScores` is a layer that holds the scores and passes the logits through
unchanged: the model's output stays the logits (windows, `decode` and the SavedModel
read them as before), and the scores are a weight of the model, so checkpoints,
resume, LoRA (the head trains) and `training.head_learning_rate` treat them as any
head weight. The scores are laid out as the decoding tables are (`[L + 1, L + 1]`,
`[previous, next]`, index `L` the sentence edge: row `L` start scores, column `L`
end scores), so they go to tf-text's Viterbi as they are.

`CrfLoss` reads the layer's scores while Keras computes the loss; Keras' JAX
trainer computes it inside a `StatelessScope` that maps the model's variables to
the values being differentiated, so the gradient reaches them on JAX as on
TensorFlow. A row's sequence is its labelled pieces in order (first pieces: the
targets are `IGNORED` elsewhere): in a window over a long sentence, the window's
first and last labelled words take the start and end scores. Only `keras.ops`.
"""

from __future__ import annotations

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="bertkit")
class TransitionScores(keras.layers.Layer):
    """The CRF's transition scores, `[L + 1, L + 1]` (index `L`: the sentence edge);
    calling it returns the logits unchanged.

    Example:
        >>> import numpy as np
        >>> layer = TransitionScores(3)
        >>> logits = np.ones((1, 2, 3), "float32")
        >>> bool(np.all(keras.ops.convert_to_numpy(layer(logits)) == logits))
        True
        >>> tuple(layer.transitions.shape)
        (4, 4)
    """

    def __init__(self, num_labels: int, **kwargs):
        super().__init__(**kwargs)
        self.num_labels = num_labels
        self.transitions = self.add_weight(  # (L + 1, L + 1); 0: no preference at first
            shape=(num_labels + 1, num_labels + 1),
            initializer="zeros",
            name="transitions",
            dtype="float32",  # summed with float32 emissions; stays float32 under mixed precision
        )

    def call(self, logits):
        return ops.multiply(logits, ops.cast(1, logits.dtype))  # a new tensor, the same values

    def compute_output_spec(self, logits):
        return keras.KerasTensor(logits.shape, logits.dtype)

    def get_config(self):
        return {**super().get_config(), "num_labels": self.num_labels}


def compact_labelled(tags, emissions):
    """Each row's labelled positions (`tags >= 0`) moved to its front, in order.

    Args:
        tags: `(batch, seq)` label ids, negative where a position has no label.
        emissions: `(batch, seq, L)` logits.

    Returns:
        `(tags, emissions, lengths)`: the first two gathered in the new order (the
        tags of the positions past a row's length are negative), lengths `(batch,)`.

    Example:
        >>> import numpy as np
        >>> tags = np.array([[-100, 2, -100, 0, -100]])
        >>> emissions = np.arange(5, dtype="float32").reshape(1, 5, 1)
        >>> compacted, moved, lengths = compact_labelled(tags, emissions)
        >>> keras.ops.convert_to_numpy(compacted)[0, :2].tolist(), int(lengths[0])
        ([2, 0], 2)
        >>> keras.ops.convert_to_numpy(moved)[0, :2, 0].tolist()
        [1.0, 3.0]
    """
    tags = ops.cast(tags, "int32")
    labelled = ops.cast(ops.greater_equal(tags, 0), "int32")  # (batch, seq)
    positions = ops.arange(ops.shape(tags)[1], dtype="int32")[None, :]
    # unlabelled positions sort after every labelled one, each group in order
    order = ops.argsort((1 - labelled) * ops.shape(tags)[1] + positions, axis=1)
    return (
        ops.take_along_axis(tags, order, axis=1),
        ops.take_along_axis(emissions, order[:, :, None], axis=1),
        ops.sum(labelled, axis=1),
    )


def crf_negative_log_likelihood(tags, emissions, transitions):
    """Per row, `-log p(tags)` under the CRF: `log Z - score(tags)` over its labelled positions.

    Args:
        tags: `(batch, seq)` label ids, negative where a position has no label.
        emissions: `(batch, seq, L)` logits.
        transitions: `(L + 1, L + 1)` scores, `[previous, next]`, index `L` the edge.

    Returns:
        `(batch,)` float32; 0 for a row without labels.

    Example:
        >>> import numpy as np
        >>> tags, emissions = np.array([[0, -100, 1]]), np.zeros((1, 3, 2), "float32")
        >>> nll = crf_negative_log_likelihood(tags, emissions, np.zeros((3, 3), "float32"))
        >>> round(float(nll[0]), 4) == round(float(np.log(4)), 4)  # 1 of 2 x 2 sequences
        True
    """
    transitions = ops.cast(transitions, "float32")
    tags, emissions, lengths = compact_labelled(tags, ops.cast(emissions, "float32"))
    edge = ops.shape(transitions)[0] - 1  # L
    valid = ops.arange(ops.shape(tags)[1], dtype="int32")[None, :] < lengths[:, None]
    return ops.where(
        lengths > 0,
        _log_partition(emissions, valid, transitions, edge)
        - _gold_score(tags, emissions, valid, lengths, transitions, edge),
        0.0,
    )


def _gold_score(tags, emissions, valid, lengths, transitions, edge):
    """`(batch,)` score of the compacted `tags`: emissions, start, neighbours, end."""
    tags = ops.where(valid, tags, 0)  # (batch, seq); past the length: any id, masked
    mask = ops.cast(valid, "float32")
    emitted = ops.squeeze(ops.take_along_axis(emissions, tags[:, :, None], axis=2), 2)
    previous = ops.concatenate([ops.full_like(tags[:, :1], edge), tags[:, :-1]], axis=1)
    flat = ops.reshape(transitions, (-1,))
    between = ops.take(flat, previous * (edge + 1) + tags)  # (batch, seq); t = 0: from start
    last = ops.take_along_axis(tags, ops.maximum(lengths - 1, 0)[:, None], axis=1)[:, 0]
    to_end = ops.take(flat, last * (edge + 1) + edge)  # (batch,)
    return ops.sum((emitted + between) * mask, axis=1) + to_end


def _log_partition(emissions, valid, transitions, edge):
    """`(batch,)` `log Z` by the forward algorithm over the compacted positions."""
    between = transitions[:edge, :edge]  # (L, L)
    alpha = transitions[edge, :edge][None, :] + emissions[:, 0]  # (batch, L)

    def step(alpha, inputs):  # inputs: (batch, L + 1), a position's emissions and validity
        scores = ops.logsumexp(alpha[:, :, None] + between[None], axis=1) + inputs[:, :edge]
        return ops.where(inputs[:, edge:] > 0, scores, alpha), None

    # one tensor to scan over: Keras' TensorFlow scan fails on several of unknown length
    steps = ops.concatenate([emissions, ops.cast(valid, "float32")[:, :, None]], axis=2)
    alpha, _ = ops.scan(step, alpha, ops.moveaxis(steps, 1, 0)[1:])  # (seq - 1, batch, L + 1)
    return ops.logsumexp(alpha + transitions[:edge, edge][None, :], axis=1)


class CrfLoss(keras.losses.Loss):
    """The CRF's negative log-likelihood of a batch, with the transitions of `layer`.

    Targets are label ids with `IGNORED` (-100) on the pieces that have no label.
    Each row's NLL is shared out over its labelled positions, so that Keras'
    per-position sample weights (make_batch's, normalized over the batch) make the
    loss the total NLL over the batch's labelled pieces, per labelled piece: a row
    without labels gives 0, and class weights weigh a row by its tags' mean weight.

    Example:
        >>> import numpy as np
        >>> layer = TransitionScores(2)
        >>> tags, logits = np.array([[0, -100, 1]]), np.zeros((1, 3, 2), "float32")
        >>> per_piece = CrfLoss(layer, reduction="none")(tags, logits)
        >>> keras.ops.convert_to_numpy(per_piece).astype(float).round(4).tolist()  # log 4 / 2
        [[0.6931, 0.0, 0.6931]]
    """

    def __init__(self, layer: TransitionScores, name="crf_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        self.layer = layer

    def call(self, y_true, y_pred):
        tags = ops.where(ops.greater_equal(y_true, 0), ops.cast(y_true, "int32"), -1)
        nll = crf_negative_log_likelihood(tags, y_pred, self.layer.transitions)  # (batch,)
        labelled = ops.cast(ops.greater_equal(tags, 0), "float32")  # (batch, seq)
        count = ops.maximum(ops.sum(labelled, axis=1, keepdims=True), 1.0)
        return labelled * nll[:, None] / count
