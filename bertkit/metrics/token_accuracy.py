"""Training accuracy over the positions the loss learns from, each counted once.

Tagging and the masked LM give Keras per-position sample weights that are 0 on
the positions the loss skips (ignored pieces, unused prediction slots) and
scaled per batch, so that the loss is a mean over the positions it learns from
whatever the padding; a weighted accuracy would count a position of a long
padded batch more than one of a short batch, and the printed figure would
change with the batching, so the weights only tell which positions count.
Targets below 0 (Keras' `ignore_class` convention) are skipped too.
"""

from __future__ import annotations

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="bertkit")
class LabelledTokenAccuracy(keras.metrics.Mean):
    """Share of counted positions whose argmax is the target.

    A position counts when its target is >= 0 and, if sample weights are
    given, its weight is positive.

    Example:
        >>> import numpy as np
        >>> metric = LabelledTokenAccuracy()
        >>> logits = np.array([[[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]]])  # argmax 0, 1, 0
        >>> metric.update_state(np.array([[0, 0, 0]]), logits,
        ...                     sample_weight=np.array([[3.0, 3.0, 0.0]]))
        >>> float(metric.result())  # one right of two labelled; the third is ignored
        0.5
        >>> metric.reset_state()
        >>> metric.update_state(np.array([[0, -1, 0]]), logits)  # the -1 slot is unused
        >>> float(metric.result())
        1.0
    """

    def __init__(self, name="token_accuracy", dtype=None):
        super().__init__(name=name, dtype=dtype)

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = ops.cast(y_true, "int32")
        predicted = ops.cast(ops.argmax(y_pred, axis=-1), "int32")
        counted = ops.greater_equal(y_true, 0)
        if sample_weight is not None:
            counted = ops.logical_and(counted, ops.greater(sample_weight, 0))
        super().update_state(
            ops.cast(ops.equal(predicted, y_true), self.dtype),
            sample_weight=ops.cast(counted, self.dtype),
        )
