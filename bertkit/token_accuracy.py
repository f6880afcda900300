"""Training accuracy over the word pieces the loss learns from, each counted once.

Tagging gives Keras per-position sample weights that are 0 on ignored pieces
and scaled per batch, so that the loss is a mean over labelled pieces whatever
the padding. Keras hands metrics the same weights; a weighted accuracy would
then count a piece of a long padded batch more than one of a short batch, and
the printed figure would change with the batching. This metric uses the
weights only to tell which pieces are labelled.
"""

from __future__ import annotations

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="bertkit")
class LabelledTokenAccuracy(keras.metrics.Mean):
    """Share of positions with a positive sample weight whose argmax is the label.

    Example:
        >>> import numpy as np
        >>> metric = LabelledTokenAccuracy()
        >>> logits = np.array([[[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]]])  # argmax 0, 1, 0
        >>> metric.update_state(np.array([[0, 0, 0]]), logits,
        ...                     sample_weight=np.array([[3.0, 3.0, 0.0]]))
        >>> float(metric.result())  # one right of two labelled; the third is ignored
        0.5
    """

    def __init__(self, name="token_accuracy", dtype=None):
        super().__init__(name=name, dtype=dtype)

    def update_state(self, y_true, y_pred, sample_weight=None):
        predicted = ops.cast(ops.argmax(y_pred, axis=-1), "int32")
        correct = ops.cast(ops.equal(predicted, ops.cast(y_true, "int32")), self.dtype)
        labelled = None if sample_weight is None else ops.cast(
            ops.greater(sample_weight, 0), self.dtype)
        super().update_state(correct, sample_weight=labelled)
