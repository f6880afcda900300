import keras
import numpy as np

from bertkit.metrics.token_accuracy import LabelledTokenAccuracy


def test_compiled_metric_counts_each_labelled_piece_once_whatever_the_weight_scale():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(8, 6, 4)).astype("float32")  # (batch, seq, hidden)
    labels = rng.integers(0, 3, size=(8, 6))
    labelled = rng.random((8, 6)) < 0.6
    # Two batches of 4 with different per-batch scales, as training's normalized weights give.
    weights = labelled * np.repeat([[1.0], [7.0]], 4, axis=0)
    model = keras.Sequential([keras.Input((6, 4)), keras.layers.Dense(3)])
    model.layers[0].set_weights([rng.normal(size=(4, 3)), np.zeros(3)])  # not Keras' own draw
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=[LabelledTokenAccuracy()],
    )  # as bertkit.training.trainer does
    reported = model.evaluate(
        features, labels, sample_weight=weights, batch_size=4, verbose=0, return_dict=True
    )["token_accuracy"]
    predicted = model.predict(features, verbose=0).argmax(-1)
    expected = (predicted == labels)[labelled].mean()
    assert abs(reported - expected) < 1e-6
    weighted = ((predicted == labels) * weights).sum() / weights.sum()
    assert abs(weighted - expected) > 0.01  # the weights alone would have moved the figure
