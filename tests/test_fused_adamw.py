"""BertAdamW's fused TensorFlow kernel makes the same updates as its Keras-ops rule."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from bertkit.training.optimization import NO_DECAY, BertAdamW

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="the fused kernel is TensorFlow's"
)


def train(
    fused: bool, monkeypatch, accumulation=None, steps: int = 6, sparse: bool = True
) -> list[np.ndarray]:
    """Updates a dense kernel, a bias (no decay) and an embedding table (gradients with
    repeated rows, as `tf.IndexedSlices` or made dense) in a traced step, with clipping,
    `accumulation` batches an update."""
    monkeypatch.setattr(BertAdamW, "_fused_on_tensorflow", lambda self: fused)
    rng = np.random.default_rng(0)
    weights = [
        keras.Variable(rng.standard_normal(shape).astype("float32"), name=name)
        for shape, name in (((8, 4), "kernel"), ((4,), "bias"), ((50, 4), "embeddings"))
    ]
    optimizer = BertAdamW(
        learning_rate=keras.optimizers.schedules.PolynomialDecay(1e-2, 10, 0.0),
        weight_decay=0.1,
        epsilon=1e-6,
        global_clipnorm=1.0,
        gradient_accumulation_steps=accumulation,
    )
    optimizer.exclude_from_weight_decay(var_names=NO_DECAY)
    optimizer.build(weights)

    @tf.function
    def step(dense, bias, rows, values):
        table = tf.IndexedSlices(values, rows, dense_shape=tf.constant([50, 4], tf.int64))
        if not sparse:
            table = tf.convert_to_tensor(table)  # repeated rows summed
        optimizer.apply([dense, bias, table], weights)

    for _ in range(steps):
        step(
            rng.standard_normal((8, 4)).astype("float32") * 3,
            rng.standard_normal(4).astype("float32") * 1e-6,  # near epsilon
            rng.choice(10, 5).astype("int64"),  # rows repeat, as a sentence's tokens do
            rng.standard_normal((5, 4)).astype("float32"),
        )
    kernels = [
        op.type
        for graph in [
            step.get_concrete_function(
                tf.TensorSpec((8, 4)),
                tf.TensorSpec((4,)),
                tf.TensorSpec((5,), tf.int64),
                tf.TensorSpec((5, 4)),
            ).graph
        ]
        for op in _all_ops(graph)
    ]
    assert ("ResourceApplyAdam" in kernels) == fused  # the fast path really runs
    return [weight.numpy() for weight in weights]


def _all_ops(graph):
    """Operations of `graph` and of the functions it calls (Keras's cond branches)."""
    yield from graph.get_operations()
    for function in graph._functions.values():
        yield from _all_ops(function.graph) if hasattr(function, "graph") else ()


@pytest.mark.parametrize("accumulation", [None, 2])
def test_fused_kernel_matches_the_keras_ops_rule(monkeypatch, accumulation):
    fused = train(True, monkeypatch, accumulation)
    # The reference gets the table's gradient dense: Keras' clipping squares a sparse
    # gradient's slices one by one, so repeated rows (a batch's [CLS] and common words)
    # count too little in the global norm (see the next test).
    reference = train(False, monkeypatch, accumulation, sparse=False)
    for got, expected in zip(fused, reference, strict=True):
        np.testing.assert_allclose(got, expected, rtol=0, atol=2e-6)
    fewer_steps = train(False, monkeypatch, accumulation, steps=4, sparse=False)
    assert not np.allclose(fused[0], fewer_steps[0])  # the comparison tells steps apart


def test_clipping_norm_counts_repeated_rows_once_summed():
    """PyTorch clips by the norm of the dense gradient; a row seen twice adds its sum."""
    optimizer = BertAdamW(learning_rate=1e-3, global_clipnorm=1.0)
    optimizer.build([keras.Variable(np.zeros((4, 3), "float32"), name="embeddings")])
    twice = tf.IndexedSlices(tf.ones((2, 3)), tf.constant([1, 1]), tf.constant([4, 3]))
    clipped = tf.convert_to_tensor(optimizer._clip_gradients([twice])[0])
    np.testing.assert_allclose(clipped.numpy()[1], np.full(3, 2 / np.sqrt(12)), rtol=1e-6)
    assert np.linalg.norm(clipped.numpy()) == pytest.approx(1.0)
