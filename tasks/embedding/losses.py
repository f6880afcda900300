"""The bi-encoder's losses, sentence-transformers' two most used, in `keras.ops` only.

Both read the model's output `(batch, texts, dim)`: each row's anchor (text 0), its positive
(text 1) and, with hard negatives, its negative (text 2).

- `MultipleNegativesRankingLoss` (in-batch negatives): each anchor's cross-entropy over the
  scaled cosine similarities to every positive and negative of the batch, its own positive
  the target. It reads the whole batch, so the batch is its set of negatives (see
  `EmbeddingTask.loss_spans_batch`). Its targets are `(batch, 2)`: a key per distinct
  positive text and the row's index in the data, so that each distinct text is one
  candidate (`candidate_mask`): the anchor's own positive text in another row is no
  negative, and a filler row (`bertkit.padding.fill_rows` repeats a row, weight 0) adds none.
- `CosineSimilarityLoss`: the squared difference between the cosine of a row's two texts
  and its gold score, a row's own loss.
"""

from __future__ import annotations

import keras
from keras import ops

from bertkit.model.pooling import l2_normalize

_MASKED = -1e9  # the score of a candidate that is not one


@keras.saving.register_keras_serializable(package="bertkit_embedding")
class MultipleNegativesRankingLoss(keras.losses.Loss):
    """In-batch negatives with a scaled cosine similarity (sentence-transformers' MNRL).

    Example:
        >>> import numpy as np
        >>> vectors = np.array([[[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0], [0.0, 1.0]]], "float32")
        >>> keys = np.array([[0.0, 0.0], [1.0, 1.0]], "float32")  # (positive key, row)
        >>> loss = MultipleNegativesRankingLoss(scale=20.0, reduction=None)
        >>> np.round(np.asarray(loss(keys, vectors)), 6).tolist()  # log(1 + e^-20) each
        [0.0, 0.0]
    """

    def __init__(self, scale: float = 20.0, name="multiple_negatives_ranking", **kwargs):
        super().__init__(name=name, **kwargs)
        self.scale = scale

    def call(self, y_true, y_pred):
        vectors = l2_normalize(ops.cast(y_pred, "float32"))  # (batch, texts, dim)
        texts = vectors.shape[1]
        anchors = vectors[:, 0, :]  # (batch, dim)
        candidates = ops.concatenate([vectors[:, t, :] for t in range(1, texts)], axis=0)
        scores = self.scale * ops.matmul(anchors, ops.transpose(candidates))
        scores = ops.where(candidate_mask(y_true, texts), scores, _MASKED)  # (batch, candidates)
        batch = ops.shape(vectors)[0]
        own = ops.sum(ops.where(ops.eye(batch, dtype="bool"), scores[:, :batch], 0.0), axis=1)
        return ops.logsumexp(scores, axis=1) - own  # (batch,)

    def get_config(self):
        return {**super().get_config(), "scale": self.scale}


def candidate_mask(y_true, texts: int):
    """(batch, (texts - 1) * batch): which positives (then negatives) of the batch each
    anchor is scored against. `y_true` is `(batch, 2)`: (positive text key, data row).

    Its own positive always; each other positive text once (at its first row), unless it
    is the anchor's own text (then it is no negative); each row's negative once however
    often the row comes (a filler row repeats an earlier one).

    Example:
        >>> import numpy as np
        >>> y_true = np.array([[0, 5], [1, 6], [0, 5]], "float32")  # row 3 repeats row 1
        >>> np.asarray(candidate_mask(y_true, 3)).astype(int).tolist()
        [[1, 1, 0, 1, 1, 0], [1, 1, 0, 1, 1, 0], [0, 1, 1, 1, 1, 0]]
    """
    batch = ops.shape(y_true)[0]
    keys, rows = y_true[:, 0], y_true[:, 1]
    diagonal = ops.eye(batch, dtype="bool")
    others = ops.logical_and(ops.not_equal(keys[:, None], keys[None, :]), _first(keys)[None, :])
    positives = ops.logical_or(diagonal, others)
    negatives = ops.broadcast_to(_first(rows)[None, :], (batch, batch))
    return ops.concatenate([positives] + [negatives] * (texts - 2), axis=1)


def _first(values):
    """(batch,): whether no earlier position holds the same value."""
    batch = ops.shape(values)[0]
    earlier = ops.triu(ops.ones((batch, batch)), 1) > 0  # [k, j]: k < j
    same = ops.equal(values[:, None], values[None, :])
    return ops.logical_not(ops.any(ops.logical_and(same, earlier), axis=0))


@keras.saving.register_keras_serializable(package="bertkit_embedding")
class CosineSimilarityLoss(keras.losses.Loss):
    """(cos(text, text_pair) - score)^2 per row (sentence-transformers' CosineSimilarityLoss).

    Example:
        >>> import numpy as np
        >>> vectors = np.array([[[1.0, 0.0], [1.0, 1.0]]], "float32")  # cosine 0.7071
        >>> loss = CosineSimilarityLoss(reduction=None)
        >>> [round(float(v), 4) for v in loss(np.array([0.5], "float32"), vectors)]
        [0.0429]
    """

    def __init__(self, name="cosine_similarity", **kwargs):
        super().__init__(name=name, **kwargs)

    def call(self, y_true, y_pred):
        vectors = l2_normalize(ops.cast(y_pred, "float32"))  # (batch, texts, dim)
        cosine = ops.sum(vectors[:, 0, :] * vectors[:, 1, :], axis=-1)  # (batch,)
        return ops.square(cosine - ops.reshape(y_true, (-1,)))
