"""BertAdamW's fused TensorFlow kernel makes the same updates as its Keras-ops rule."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from bertkit.optimization import NO_DECAY, BertAdamW

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                                reason="the fused kernel is TensorFlow's")


def train(fused: bool, monkeypatch, steps: int = 6) -> list[np.ndarray]:
    """Updates a dense kernel, a bias (no decay) and an embedding table (sparse
    gradients) in a traced step, with clipping and two accumulated batches an update."""
    monkeypatch.setattr(BertAdamW, "_fused_on_tensorflow", lambda self: fused)
    rng = np.random.default_rng(0)
    weights = [keras.Variable(rng.standard_normal(shape).astype("float32"), name=name)
               for shape, name in (((8, 4), "kernel"), ((4,), "bias"), ((50, 4), "embeddings"))]
    optimizer = BertAdamW(learning_rate=keras.optimizers.schedules.PolynomialDecay(1e-2, 10, 0.0),
                          weight_decay=0.1, epsilon=1e-6, global_clipnorm=1.0,
                          gradient_accumulation_steps=2)
    optimizer.exclude_from_weight_decay(var_names=NO_DECAY)
    optimizer.build(weights)

    @tf.function
    def step(dense, bias, rows, values):
        table = tf.IndexedSlices(values, rows, dense_shape=tf.constant([50, 4], tf.int64))
        optimizer.apply([dense, bias, table], weights)

    for _ in range(steps):
        step(rng.standard_normal((8, 4)).astype("float32") * 3,
             rng.standard_normal(4).astype("float32") * 1e-6,  # near epsilon
             rng.choice(50, 5, replace=False).astype("int64"),
             rng.standard_normal((5, 4)).astype("float32"))
    kernels = [op.type for graph in [step.get_concrete_function(
        tf.TensorSpec((8, 4)), tf.TensorSpec((4,)), tf.TensorSpec((5,), tf.int64),
        tf.TensorSpec((5, 4))).graph] for op in _all_ops(graph)]
    assert ("ResourceApplyAdam" in kernels) == fused  # the fast path really runs
    return [weight.numpy() for weight in weights]


def _all_ops(graph):
    """Operations of `graph` and of the functions it calls (Keras's cond branches)."""
    yield from graph.get_operations()
    for function in graph._functions.values():
        yield from _all_ops(function.graph) if hasattr(function, "graph") else ()


def test_fused_kernel_matches_the_keras_ops_rule(monkeypatch):
    fused, reference = train(True, monkeypatch), train(False, monkeypatch)
    for got, expected in zip(fused, reference, strict=True):
        np.testing.assert_allclose(got, expected, rtol=0, atol=2e-6)
    assert not np.allclose(fused[0], train(False, monkeypatch, steps=4)[0])  # steps tell apart
