"""BERT's feature-based approach: a frozen encoder (`backbone.trainable: false`) trains the head
only, and `backbone.features` feeds the tagging head chosen hidden layers, through predict,
a LoRA-free reload and the SavedModel."""

import numpy as np
import pytest

import bertkit
from bertkit.model.backbone import load_pretrained
from bertkit.recipes.recipe import load_recipe
from bertkit.testing import run_bertkit, serve_in_fresh_process, write_tiny_checkpoint
from bertkit.training.run_steps import build, prepare
from tests.test_tagging import write_conll

SENTENCES = ["mr john visited paris .", "the film was ok"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("feature_based")
    write_tiny_checkpoint(folder / "ckpt", num_layers=3)
    write_conll(folder / "train.conll", 64, seed=0)
    write_conll(folder / "dev.conll", 16, seed=1)
    return folder


def recipe(folder, run="run", saved_model=False, **backbone):
    return {
        "schema": 1,
        "task": "tagging",
        "backbone": {"preset": str(folder / "ckpt"), "sequence_length": 32, **backbone},
        "data": {"train": str(folder / "train.conll"), "validation": str(folder / "dev.conll")},
        "training": {"epochs": 2, "batch_size": 16, "learning_rate": 1e-2},
        "output_dir": str(folder / run),
        "export": {"saved_model": saved_model},
    }


def encoder_weights(model) -> dict:
    return {w.path: np.array(w) for w in model.weights if w.path.startswith("transformer_layer")}


def test_a_frozen_encoder_gets_no_gradients_or_optimizer_state(folder):
    loaded = load_recipe(recipe(folder, trainable=False))
    built = build(loaded, prepare(loaded))
    trainable = {w.path for w in built.trained.trainable_variables}
    assert trainable == {"tagger/kernel", "tagger/bias"}  # the head's only
    slots = [v for v in built.trained.optimizer.variables if "tagger" not in v.path]
    assert all(v.shape == () for v in slots)  # counters and the learning rate; no moments
    dropouts = [
        layer.rate
        for layer in built.data.pretrained.backbone._flatten_layers()
        if hasattr(layer, "rate")
    ]
    assert dropouts and not any(dropouts)


def test_a_frozen_encoder_leaves_the_pretrained_weights_as_they_were(folder):
    model = bertkit.finetune(recipe(folder, "frozen", trainable=False))
    pretrained = load_pretrained(str(folder / "ckpt"), sequence_length=32).backbone
    before, after = encoder_weights(pretrained), encoder_weights(model.model)
    assert before.keys() == after.keys() and len(before) > 10
    assert all(np.array_equal(before[name], after[name]) for name in before)
    tuned = bertkit.finetune(recipe(folder, "tuned"))  # the same run with the encoder trained
    moved = encoder_weights(tuned.model)
    assert not all(np.array_equal(before[name], moved[name]) for name in before)


def test_the_last_layers_concatenated_feed_the_tagging_head(folder):
    model = bertkit.finetune(recipe(folder, "four", True, features={"layers": [-4, -3, -2, -1]}))
    assert model.model.get_layer("tagger").kernel.shape[0] == 4 * 32
    reloaded = bertkit.load(folder / "four")
    predictions = reloaded.predict(SENTENCES)
    assert predictions == model.predict(SENTENCES)
    served = serve_in_fresh_process(folder / "four" / "saved_model", {"text": SENTENCES})
    exported = [
        [(served["entity_text"][i][j], served["entity_type"][i][j]) for j in range(count)]
        for i, count in enumerate(served["entity_count"])
    ]
    expected = [[(e["text"], e["type"]) for e in p["entities"]] for p in predictions]
    assert exported == expected and sum(map(len, expected)) >= 2


def test_averaged_layers_keep_the_hidden_width(folder):
    loaded = load_recipe(recipe(folder, features={"layers": [-2, -1], "combine": "mean"}))
    built = build(loaded, prepare(loaded))
    assert built.model.get_layer("tagger").kernel.shape[0] == 32


@pytest.mark.parametrize(
    "backbone, training, message",
    [
        (
            {"trainable": False},
            {"lora": {}},
            "backbone.trainable: false freezes the whole encoder, LoRA trains part of it: remove training.lora",
        ),
        (
            {"trainable": False},
            {"reinit_top_layers": 1},
            "backbone.trainable: false keeps the encoder as loaded: training.reinit_top_layers would stay random",
        ),
        (
            {"features": {}},
            {"packing": True},
            "backbone.features: packed training reads the last layer only: set training.packing to false",
        ),
        (
            {"features": {"combine": "max"}},
            {},
            "backbone.features.combine: expected one of 'concat', 'mean', got 'max'",
        ),
    ],
)
def test_contradicting_options_are_one_line(tmp_path, folder, backbone, training, message):
    raw = recipe(folder, **backbone)
    raw["training"].update(training)
    path = tmp_path / "r.yaml"
    path.write_text(__import__("json").dumps(raw))
    result = run_bertkit("check", path)
    assert result.returncode == 2
    assert result.stderr.startswith("bertkit: error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1


def test_features_on_a_head_that_reads_the_pooled_output_are_refused(tmp_path, folder):
    (tmp_path / "train.tsv").write_text("sentence\tlabel\na fine film\tpos\ndull\tneg\n")
    raw = recipe(folder, features={"layers": [-1]})
    raw.update(task="classification")
    raw["data"] = {"train": str(tmp_path / "train.tsv"), "text": "sentence"}
    with pytest.raises(bertkit.UserError, match="the classification head does not read"):
        bertkit.finetune(raw)
