"""Cross-entropy with label smoothing over integer labels, for the tasks' `loss` methods.

Keras's `SparseCategoricalCrossentropy` has no `label_smoothing` (only the one-hot
`CategoricalCrossentropy` has), and one-hot targets would change what `make_batch` gives.
`SmoothedSparseCrossentropy` is the same loss over integer labels: the target is
`(1 - label_smoothing) * one_hot(label) + label_smoothing / num_classes`, as in Keras's
and PyTorch's `label_smoothing`. It uses `keras.ops` only (TensorFlow and JAX), and gets
sample weights and reduction from `keras.losses.Loss` as Keras's losses do.
"""

from __future__ import annotations

import keras
from keras import ops


def sparse_crossentropy(label_smoothing: float = 0.0) -> keras.losses.Loss:
    """The loss of a head's logits against integer labels: Keras's own without smoothing.

    Example:
        >>> type(sparse_crossentropy()).__name__, type(sparse_crossentropy(0.1)).__name__
        ('SparseCategoricalCrossentropy', 'SmoothedSparseCrossentropy')
    """
    if not label_smoothing:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return SmoothedSparseCrossentropy(label_smoothing)


@keras.saving.register_keras_serializable(package="bertkit")
class SmoothedSparseCrossentropy(keras.losses.Loss):
    """Cross-entropy of logits against integer labels with smoothed targets.

    Per position: `(1 - s) * -log p[label] + s * mean over classes of -log p[class]`.

    Example:
        >>> import numpy as np
        >>> logits = np.log(np.array([[0.5, 0.25, 0.25]], "float32"))  # (batch, classes)
        >>> labels = np.array([0])
        >>> round(float(SmoothedSparseCrossentropy(0.0)(labels, logits)), 4)  # -log 0.5
        0.6931
        >>> target = 0.9 * np.array([1, 0, 0]) + 0.1 / 3
        >>> expected = -(target * np.log([0.5, 0.25, 0.25])).sum()
        >>> bool(np.isclose(float(SmoothedSparseCrossentropy(0.1)(labels, logits)), expected))
        True
    """

    def __init__(self, label_smoothing: float, name="smoothed_sparse_crossentropy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.label_smoothing = label_smoothing

    def call(self, y_true, y_pred):
        log_probabilities = ops.log_softmax(y_pred, axis=-1)  # (..., classes)
        labels = ops.cast(y_true, "int32")
        if len(labels.shape) < len(log_probabilities.shape):  # (...,), not (..., 1)
            labels = ops.expand_dims(labels, -1)  # (..., 1)
        chosen = ops.squeeze(ops.take_along_axis(log_probabilities, labels, axis=-1), -1)
        uniform = ops.mean(log_probabilities, axis=-1)  # (...,)
        return -((1.0 - self.label_smoothing) * chosen + self.label_smoothing * uniform)

    def get_config(self):
        return {**super().get_config(), "label_smoothing": self.label_smoothing}
