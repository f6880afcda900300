"""BERT's attention: its own dropout rate (`backbone.attention_dropout`) and the fused
computation JAX uses on GPUs, checked against Keras' on the CPU (XLA's implementation)."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import bertkit
from bertkit.errors import UserError
from bertkit.model import attention
from bertkit.model.backbone import load_pretrained
from bertkit.model.packed_backbone import packed_training_model
from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint

ON_JAX = keras.backend.backend() == "jax"
# run in this process under KERAS_BACKEND=jax, else by `test_the_jax_tests_pass_under_jax`
jax_only = pytest.mark.skipif(not ON_JAX, reason="fused attention: JAX (run in a child)")


@pytest.mark.skipif(ON_JAX, reason="the JAX tests run in this process")
def test_the_jax_tests_pass_under_jax():
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
         "-o", "addopts=--import-mode=importlib", __file__, "-k", "not under_jax and not recipe"],
        env={**os.environ, "KERAS_BACKEND": "jax"}, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "8 passed" in done.stdout, done.stdout[-500:]


def projected(seed: int, batch=2, length=6, heads=2, size=4):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(batch, length, heads, size)).astype("float32") for _ in range(3)]


def attention_layer(dropout=0.0):
    layer = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, dropout=dropout)
    layer.build((2, 6, 8), (2, 6, 8))
    return layer


def keras_attention(layer, query, key, value, mask, training=False):
    output, _ = keras.layers.MultiHeadAttention._compute_attention(
        layer, query, key, value, mask, training
    )
    return keras.ops.convert_to_numpy(output)


@jax_only
@pytest.mark.parametrize("training", [False, True])
def test_padding_as_key_counts_gives_keras_outputs(training):
    query, key, value = projected(0)
    lengths = np.array([6, 3])
    mask = (np.arange(6)[None, None, :] < lengths[:, None, None]).astype("int32")  # (2, 1, 6)
    layer = attention_layer()  # dropout 0: fused in training too
    fused, _ = attention.fused_attention(layer, "xla", query, key, value, mask, training)
    expected = keras_attention(layer, query, key, value, mask, training)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(fused), expected, atol=1e-5)


@jax_only
def test_padding_at_the_start_of_a_row_is_kept_at_inference():
    # A caller's mask padded at the start (left padding) cannot go in as key counts:
    # at inference the check sends it in as a mask, and rows padded at the end by counts.
    query, key, value = projected(2, batch=3)
    mask = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])[:, None, :]
    layer = attention_layer()
    expected = keras_attention(layer, query, key, value, mask)
    for rows in ([0, 1], [1, 2]):  # padded at the start: the mask; at the end: key counts
        fused, _ = attention.fused_attention(
            layer, "xla", *(x[rows] for x in (query, key, value)), mask[rows]
        )
        np.testing.assert_allclose(keras.ops.convert_to_numpy(fused), expected[rows], atol=1e-5)


@jax_only
def test_a_block_mask_goes_in_as_a_mask():
    query, key, value = projected(1)
    sequence = np.array([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 0, 0]])  # packed rows, then padding
    mask = (sequence[:, :, None] == sequence[:, None, :]) & (sequence[:, None, :] > 0)
    layer = attention_layer()
    fused, _ = attention.fused_attention(layer, "xla", query, key, value, mask)
    expected = keras_attention(layer, query, key, value, mask)
    seen = sequence > 0  # a padding position sees no key: its output is never read
    np.testing.assert_allclose(keras.ops.convert_to_numpy(fused)[seen], expected[seen], atol=1e-5)


@jax_only
def test_attention_dropout_in_training_keeps_keras_computation(monkeypatch):
    import jax

    def refuse(*args, **kwargs):
        raise AssertionError("the fused kernel has no dropout")

    monkeypatch.setattr(jax.nn, "dot_product_attention", refuse)
    query, key, value = projected(2)
    layer = attention_layer(dropout=0.1)
    output, _ = attention.fused_attention(layer, "xla", query, key, value, None, True)
    assert output.shape == query.shape


@jax_only
def test_a_fused_backbone_and_its_gradients_equal_keras_hubs(tmp_path):
    import jax

    folder = write_tiny_checkpoint(tmp_path / "tiny")
    plain = load_pretrained(str(folder), sequence_length=16).backbone
    fused = load_pretrained(str(folder), sequence_length=16).backbone
    assert not attention.use_fused_attention(fused)  # no GPU here: Keras' computation stays
    assert attention.use_fused_attention(fused, "xla", force=True)
    assert all(attention.fuses(layer._self_attention_layer) for layer in fused.transformer_layers)
    ids = np.array([[2, 5, 6, 7, 3, 0, 0, 0], [2, 8, 3, 0, 0, 0, 0, 0]])
    inputs = {"token_ids": ids, "segment_ids": 0 * ids, "padding_mask": (ids > 0).astype("int32")}

    def loss(backbone):
        frozen = [v.value for v in backbone.non_trainable_variables]

        def of(weights):
            outputs, _ = backbone.stateless_call(weights, frozen, inputs)
            return jax.numpy.sum(outputs["sequence_output"] ** 2)

        return of

    weights = [keras.ops.convert_to_numpy(w) for w in plain.trainable_weights]
    plain_value, plain_grads = jax.value_and_grad(loss(plain))(weights)
    fused_value, fused_grads = jax.value_and_grad(loss(fused))(weights)
    np.testing.assert_allclose(fused_value, plain_value, rtol=1e-5)
    for ours, theirs in zip(fused_grads, plain_grads, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


@jax_only
def test_packed_rows_through_fused_attention_equal_keras(tmp_path):
    folder = write_tiny_checkpoint(tmp_path / "tiny")
    outputs = []
    for fuse in (False, True):
        backbone = load_pretrained(str(folder), sequence_length=16).backbone
        if fuse:
            attention.use_fused_attention(backbone, "xla", force=True)
        head = keras.layers.Dense(3, kernel_initializer="ones")  # the same in both models
        model = keras.Model(backbone.input, head(backbone.output["sequence_output"]))
        packed = packed_training_model(model, backbone)
        inputs = {
            "token_ids": np.array([[2, 5, 3, 2, 6, 7, 3, 0]]),
            "segment_ids": np.zeros((1, 8), "int32"),
            "padding_mask": np.array([[1, 1, 1, 1, 1, 1, 1, 0]]),
            "position_ids": np.array([[0, 1, 2, 0, 1, 2, 3, 0]]),
            "sequence_index": np.array([[1, 1, 1, 2, 2, 2, 2, 0]]),
            "first_token_index": np.array([0, 3]),
        }
        outputs.append(keras.ops.convert_to_numpy(packed(inputs)))
    # the padding position may see no key: its output differs, finite, and is never read
    np.testing.assert_allclose(outputs[1][:, :7], outputs[0][:, :7], atol=1e-5)
    assert np.isfinite(outputs[1]).all()


def test_the_recipe_sets_the_attention_dropout_alone(tmp_path):
    write_tiny_checkpoint(tmp_path / "ckpt")
    write_sentiment_tsv(tmp_path / "train.tsv", 8)
    spec = {
        "schema": 1,
        "task": "classification",
        "backbone": {
            "preset": str(tmp_path / "ckpt"),
            "sequence_length": 16,
            "attention_dropout": 0.0,
        },
        "data": {"train": str(tmp_path / "train.tsv"), "text": "sentence"},
        "training": {"epochs": 1, "batch_size": 4},
        "export": {"saved_model": False},
    }
    from bertkit.recipes.recipe import load_recipe
    from bertkit.training.task_data import TaskData

    backbone = TaskData._backbone(load_recipe(spec), load_pretrained).backbone
    for layer in backbone.transformer_layers:
        assert layer._self_attention_layer.dropout == 0.0
        assert layer._self_attention_layer._dropout_layer.rate == 0.0
        assert layer._self_attention_dropout.rate == 0.1  # the hidden states' stays
    bertkit.finetune(spec, output_dir=tmp_path / "run", verbose=0)
    assert len(json.loads((tmp_path / "run" / "metrics.json").read_text())["epochs"]) == 1
    spec["backbone"]["attention_dropout"] = 1.0
    with pytest.raises(UserError, match=r"backbone.attention_dropout: must be less than 1"):
        load_recipe(spec)


def test_a_recipe_without_a_rate_drops_no_attention_where_fused_attention_trains(
    tmp_path, monkeypatch, capsys
):
    write_tiny_checkpoint(tmp_path / "ckpt")
    spec = {
        "schema": 1,
        "task": "classification",
        "backbone": {"preset": str(tmp_path / "ckpt"), "sequence_length": 16},
        "data": {"train": str(tmp_path / "train.tsv"), "text": "sentence"},
    }
    from bertkit.recipes.recipe import load_recipe
    from bertkit.training.task_data import TaskData

    def rates(spec):
        backbone = TaskData._backbone(load_recipe(spec), load_pretrained).backbone
        return {layer._self_attention_layer.dropout for layer in backbone.transformer_layers}

    assert attention.training_attention_dropout(None) is None  # on this CPU
    assert rates(spec) == {0.1}
    monkeypatch.setattr(attention, "fused_attention_trains", lambda: True)  # as on a GPU
    assert rates(spec) == {0.0}
    assert "attention dropout 0 on this GPU" in capsys.readouterr().out
    spec["backbone"]["attention_dropout"] = 0.1  # the recipe's rate wins
    assert rates(spec) == {0.1}


@jax_only
def test_without_cudnn_the_kernel_is_xlas():
    query, key, value = projected(3)  # float32 on a CPU: cuDNN refuses, XLA computes
    mask = np.ones((2, 1, 6), "int32")
    layer = attention_layer()
    attention.CUDNN_REFUSALS.clear()
    fused, _ = attention.fused_attention(layer, None, query, key, value, mask)
    assert len(attention.CUDNN_REFUSALS) == 1
    expected = keras_attention(layer, query, key, value, mask)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(fused), expected, atol=1e-5)
