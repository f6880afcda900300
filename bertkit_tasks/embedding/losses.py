"""The bi-encoder's losses, sentence-transformers' two most used, in `keras.ops` only.

Both read the model's output `(batch, texts, dim)`: each row's anchor (text 0), its positive
(text 1) and, with hard negatives, its negative (text 2).

- `MultipleNegativesRankingLoss` (in-batch negatives): each anchor's cross-entropy over the
  scaled cosine similarities to every positive and negative of the batch, its own positive
  the target. It reads the whole batch, so the batch is its set of negatives (see
  `EmbeddingTask.loss_spans_batch`). Its targets are `(batch, 2)`: a key per distinct
  positive text and the row's index in the data. Another row with the same positive text,
  or a filler row (`bertkit.padding.fill_rows` repeats a row, weight 0), is no negative:
  the first is masked out as a candidate, the second's negative counts once.
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
        batch, texts = ops.shape(vectors)[0], vectors.shape[1]
        anchors = vectors[:, 0, :]  # (batch, dim)
        candidates = ops.concatenate([vectors[:, t, :] for t in range(1, texts)], axis=0)
        scores = self.scale * ops.matmul(
            anchors, ops.transpose(candidates)
        )  # (batch, (texts-1)*batch)
        keys, rows = y_true[:, 0], y_true[:, 1]
        diagonal = ops.eye(batch, dtype="bool")
        other_positive = ops.not_equal(keys[:, None], keys[None, :])  # (batch, batch)
        valid = [ops.logical_or(diagonal, other_positive)]
        repeated = ops.logical_and(  # row j repeats an earlier row k < j (a filler row)
            ops.equal(rows[:, None], rows[None, :]), ops.triu(ops.ones((batch, batch)), 1) > 0
        )
        first_of_its_row = ops.logical_not(ops.any(repeated, axis=0))  # (batch,) over j
        valid += [ops.broadcast_to(first_of_its_row[None, :], (batch, batch))] * (texts - 2)
        scores = ops.where(ops.concatenate(valid, axis=1), scores, _MASKED)
        own = ops.sum(ops.where(diagonal, scores[:, :batch], 0.0), axis=1)  # (batch,)
        return ops.logsumexp(scores, axis=1) - own

    def get_config(self):
        return {**super().get_config(), "scale": self.scale}


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
