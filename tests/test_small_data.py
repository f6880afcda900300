"""Small-data options: head learning rate, top-layer re-initialisation, class weights, label
smoothing (README: Small data)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import keras_hub
import numpy as np
import pytest

import bertkit
from bertkit.errors import UserError
from bertkit.losses import SmoothedSparseCrossentropy, sparse_crossentropy
from bertkit.model.reinitialize import reinitialize_top_layers
from bertkit.model.tokenizer import WordPieceTokenizer
from bertkit.recipes.recipe import load_recipe
from bertkit.testing import tiny_vocabulary, write_tiny_checkpoint
from bertkit.training import run_steps
from bertkit.training.optimization import BertAdamW
from bertkit_tasks.tagging import TaggingData, TaggingOptions, TaggingTask

CONLL = "mr O\njohn B-PER\nin O\nparis B-LOC\n\nthe O\nfilm O\nin O\nrome B-LOC\n\n"


def recipe(tmp_path, task=None, **training) -> dict:
    (tmp_path / "train.txt").write_text(CONLL * 8)
    return {
        "schema": 1,
        "task": {"name": "tagging", **(task or {})},
        "backbone": {"preset": str(tmp_path / "ckpt"), "sequence_length": 16},
        "data": {"train": str(tmp_path / "train.txt"), "validation": str(tmp_path / "train.txt")},
        "training": {"epochs": 1, "batch_size": 8, **training},
    }


@pytest.mark.parametrize(
    "section, key, value, message",
    [
        (
            "training",
            "head_learning_rate",
            0,
            "training.head_learning_rate: must be greater than 0",
        ),
        ("training", "reinit_top_layers", -1, "training.reinit_top_layers: must be at least 0"),
        ("task", "label_smoothing", 1.0, "task.label_smoothing: must be less than 1.0, got 1.0"),
        ("task", "class_weights", "inverse", "expected one of 'none', 'balanced', got 'inverse'"),
    ],
)
def test_bad_values_are_one_line_errors(tmp_path, section, key, value, message):
    spec = recipe(tmp_path)
    spec[section][key] = value
    with pytest.raises(UserError, match=message):
        load_recipe(spec)


def test_defaults_are_the_fields(tmp_path):
    resolved = load_recipe(recipe(tmp_path))
    assert (resolved.training.head_learning_rate, resolved.training.reinit_top_layers) == (None, 0)
    assert (resolved.task_options.class_weights, resolved.task_options.label_smoothing) == (
        "none",
        0.0,
    )
    assert type(sparse_crossentropy(0.0)) is keras.losses.SparseCategoricalCrossentropy


@pytest.mark.parametrize("fused", [True, False])
def test_head_variables_train_at_their_own_rate_decay_included(fused):
    head, body, alone = (keras.Variable(np.full(3, 2.0, "float32")) for _ in range(3))
    scaled = BertAdamW(learning_rate=0.01, weight_decay=0.1, epsilon=1e-6)
    scaled.scale_learning_rate([head], 10.0)
    plain = BertAdamW(learning_rate=0.1, weight_decay=0.1, epsilon=1e-6)
    for optimizer in (scaled, plain):
        optimizer._fused_on_tensorflow = lambda fused=fused: fused
    gradients = [keras.ops.convert_to_tensor(np.array([0.5, -1.0, 2.0], "float32"))] * 2
    for _ in range(3):
        scaled.apply(gradients, [head, body])
        plain.apply(gradients[:1], [alone])
    np.testing.assert_allclose(head.numpy(), alone.numpy(), rtol=1e-6)  # 10 x 0.01 = 0.1
    assert abs(2.0 - body.numpy()).max() < abs(2.0 - head.numpy()).min() / 5


def test_the_factor_leaves_the_optimizer_state_as_it_was():
    """Checkpoints hold the same variables: a run saves, restores and resumes as before."""

    def state(factor):
        weights = [keras.Variable(np.ones(2, "float32"), name=name) for name in ("a", "b")]
        optimizer = BertAdamW(learning_rate=0.1)
        if factor:
            optimizer.scale_learning_rate(weights[:1], factor)
        optimizer.build(weights)
        return [(v.path.rsplit("/", 1)[-1], tuple(v.shape)) for v in optimizer.variables]

    assert state(10.0) == state(None)


def test_reinit_draws_the_top_layers_from_the_seed_only():
    def backbone(seed):
        keras.utils.set_random_seed(seed)
        return keras_hub.models.BertBackbone(
            vocabulary_size=20, num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=16
        )

    first, second = backbone(0), backbone(1)  # different pretrained weights
    bottom = [v.numpy().copy() for v in first.transformer_layers[0].weights]
    assert reinitialize_top_layers(first, 1, seed=7) == ["transformer_layer_1", "pooled_dense"]
    reinitialize_top_layers(second, 1, seed=7)
    for layer in ("transformer_layers", "pooled_dense"):
        top = [getattr(b, layer) for b in (first, second)]
        top = [t[-1] if isinstance(t, list) else t for t in top]
        for a, b in zip(top[0].weights, top[1].weights, strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())  # the same seed, the same draw
    for kept, was in zip(first.transformer_layers[0].weights, bottom, strict=True):
        np.testing.assert_array_equal(kept.numpy(), was)
    kernel = first.transformer_layers[1]._feedforward_intermediate_dense.kernel.numpy()
    assert abs(kernel.std() - 0.02) < 0.005
    with pytest.raises(UserError) as error:
        reinitialize_top_layers(first, 3, seed=7, source="r.yaml")
    assert str(error.value) == (
        "r.yaml: training.reinit_top_layers: must be at most 2, the backbone's transformer "
        "layers, got 3"
    )


def test_smoothed_loss_is_keras_categorical_crossentropy_with_smoothing():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 5, 4)).astype("float32")  # (batch, seq, labels)
    labels = rng.integers(0, 4, size=(2, 5))
    weights = rng.uniform(size=(2, 5)).astype("float32")
    ours = SmoothedSparseCrossentropy(0.2)(labels, logits, sample_weight=weights)
    keras_loss = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.2)
    expected = keras_loss(np.eye(4)[labels], logits, sample_weight=weights)
    np.testing.assert_allclose(float(ours), float(expected), rtol=1e-5)


def test_balanced_class_weights_weigh_each_labelled_word(tmp_path):
    (tmp_path / "train.txt").write_text(CONLL)
    task = TaggingTask(
        TaggingOptions(class_weights="balanced"),
        TaggingData(),
        WordPieceTokenizer(tiny_vocabulary(), lowercase=True),
        16,
    )
    examples = task.read(str(tmp_path / "train.txt"))
    task.state = task.fit_state(examples)
    counts = {"O": 5, "B-LOC": 2, "B-PER": 1}  # tags in the order of the state's labels
    weights = dict(zip(task.labels, task.state["class_weights"], strict=True))
    assert sum(counts[tag] * weights[tag] for tag in counts) == pytest.approx(8)  # mean 1
    assert weights["O"] / weights["B-PER"] == pytest.approx(5**-0.5)
    labels = np.array([[-100, 0, 1, 2]])
    batch = {"token_ids": labels, "segment_ids": labels, "padding_mask": labels, "labels": labels}
    _, targets, sample_weights = task.make_batch(batch, training=True, rng=None)
    expected = [0.0] + [task.state["class_weights"][i] for i in (0, 1, 2)]
    np.testing.assert_allclose(sample_weights[0], expected, rtol=1e-6)
    assert targets.tolist() == [[0, 0, 1, 2]]


def test_the_options_train_on_tensorflow_and_the_weights_stay_with_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(run_steps, "export_run", lambda *args, **kwargs: None)  # not needed
    write_tiny_checkpoint(tmp_path / "ckpt", num_layers=1, hidden_size=16, num_heads=2)
    spec = recipe(
        tmp_path,
        task={"class_weights": "balanced", "label_smoothing": 0.1},
        head_learning_rate=1e-3,
        reinit_top_layers=1,
    )
    bertkit.finetune(spec, output_dir=tmp_path / "run", verbose=0)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert np.isfinite(metrics["epochs"][0]["loss"])
    state = bertkit.load(tmp_path / "run").task.state
    assert len(state["class_weights"]) == len(state["labels"]) == 3
    spec["training"]["reinit_top_layers"] = 2
    with pytest.raises(UserError, match="must be at most 1, the backbone's transformer layers"):
        bertkit.finetune(spec, output_dir=tmp_path / "run2", verbose=0)


JAX_CHECK = """
    from types import SimpleNamespace
    import keras, numpy as np
    from bertkit.losses import SmoothedSparseCrossentropy
    from bertkit.model.reinitialize import reinitialize_top_layers
    from bertkit.training.optimization import BertAdamW
    assert keras.backend.backend() == "jax"
    logits, labels = np.log(np.array([[0.5, 0.25, 0.25]], "float32")), np.array([0])
    target = 0.9 * np.eye(3)[0] + 0.1 / 3
    loss = float(SmoothedSparseCrossentropy(0.1)(labels, logits))
    assert abs(loss + (target * np.log([0.5, 0.25, 0.25])).sum()) < 1e-5, loss
    head, body = (keras.Variable(np.ones(1, "float32")) for _ in range(2))
    optimizer = BertAdamW(learning_rate=0.01, weight_decay=0.0, epsilon=1e-6)
    optimizer.scale_learning_rate([head], 10.0)
    optimizer.apply([keras.ops.ones(1)] * 2, [head, body])
    assert np.allclose([head.numpy()[0], body.numpy()[0]], [0.9, 0.99], atol=1e-5)
    layers = [keras.layers.Dense(4, name=f"top_{i}") for i in range(2)]
    for layer in layers:
        layer.build((None, 4))
    backbone = SimpleNamespace(transformer_layers=layers[:1], pooled_dense=layers[1])
    reinitialize_top_layers(backbone, 1, seed=3)
    assert not layers[0].bias.numpy().any() and abs(layers[0].kernel.numpy()).max() < 0.2
    print("ok")
"""


def test_the_keras_ops_pieces_run_on_jax():
    pytest.importorskip("jax")
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(JAX_CHECK)],
        env={**os.environ, "KERAS_BACKEND": "jax"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-2000:]


def test_the_small_data_recipe_loads_with_its_options():
    recipe = load_recipe(Path(__file__).parents[1] / "recipes" / "ner_small_data.yaml")
    training = recipe.training
    assert recipe.task == "tagging" and recipe.task_options.class_weights == "balanced"
    assert (training.epochs, training.early_stopping_patience, training.seeds) == (10, 3, 3)
    assert (training.head_learning_rate, training.reinit_top_layers) == (1e-3, 1)
