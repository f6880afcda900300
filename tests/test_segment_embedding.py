"""The segment embedding as a sum over rows: keras-hub's outputs and gradients, no scatter."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from bertkit.model.backbone import load_pretrained
from bertkit.model.segment_embedding import looks_up_as_sum, sum_over_rows
from bertkit.testing import write_tiny_checkpoint


def lookups(rows, dtype, seed):
    """The same random table looked up by keras' Embedding and by a sum over rows."""
    rng = np.random.default_rng(seed)
    plain = keras.layers.Embedding(rows, 8, dtype=dtype)
    plain.build()
    plain.embeddings.assign(rng.normal(size=(rows, 8)).astype("float32"))
    fast = keras.layers.Embedding(rows, 8, dtype=dtype)
    fast.build()
    fast.embeddings.assign(plain.embeddings)
    sum_over_rows(fast)
    ids = rng.integers(0, rows, (3, 5)).astype("int32")
    return plain, fast, ids


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("rows", [2, 3])
def test_outputs_are_keras_lookups_bit_for_bit(rows, dtype):
    plain, fast, ids = lookups(rows, dtype, seed=rows)
    assert looks_up_as_sum(fast) and not looks_up_as_sum(plain)
    expected, got = (keras.ops.convert_to_numpy(layer(ids)) for layer in (plain, fast))
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_gradients_are_keras_lookups():
    import tensorflow as tf

    plain, fast, ids = lookups(2, "float32", seed=0)
    weights = np.random.default_rng(1).normal(size=(3, 5, 8)).astype("float32")
    gradients = []
    for layer in (plain, fast):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(ids) * weights)
        gradients.append(tf.convert_to_tensor(tape.gradient(loss, layer.embeddings)).numpy())
    np.testing.assert_allclose(gradients[1], gradients[0], rtol=1e-6, atol=1e-6)


def test_loaded_backbones_use_it_and_larger_tables_keep_keras_lookup(tmp_path):
    loaded = load_pretrained(str(write_tiny_checkpoint(tmp_path / "c")), sequence_length=16)
    assert looks_up_as_sum(loaded.backbone.segment_embedding)
    assert not looks_up_as_sum(loaded.backbone.token_embedding)
    table = keras.layers.Embedding(17, 4)
    sum_over_rows(table)
    assert not looks_up_as_sum(table)


SCATTERS_ON_JAX = """
import sys, jax, keras, numpy as np
from bertkit.model.backbone import load_pretrained
from bertkit.testing import write_tiny_checkpoint
backbone = load_pretrained(str(write_tiny_checkpoint(sys.argv[1])), sequence_length=16).backbone
inputs = {"token_ids": np.ones((2, 16), "int32"), "segment_ids": np.zeros((2, 16), "int32"),
          "padding_mask": np.ones((2, 16), "int32")}
def loss(values):
    out, _ = backbone.stateless_call(values, backbone.non_trainable_variables, inputs)
    return out["sequence_output"].sum()
def scatters():
    grad = jax.jit(jax.grad(loss)).lower([v.value for v in backbone.trainable_variables])
    return grad.as_text().count('"stablehlo.scatter"(')
fast = scatters()
del backbone.segment_embedding.call  # keras-hub's lookup again
print("SCATTERS", fast, scatters())
"""


def test_on_jax_the_segment_table_gradient_is_no_scatter(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", SCATTERS_ON_JAX, str(tmp_path / "checkpoint")],
        capture_output=True,
        text=True,
        env={**os.environ, "KERAS_BACKEND": "jax"},
    )
    found = [line.split() for line in done.stdout.splitlines() if line.startswith("SCATTERS")]
    assert found, done.stderr[-2000:]
    # the token table's scatter-add stays; keras-hub's segment lookup adds a second
    assert found[0][1:] == ["1", "2"]
