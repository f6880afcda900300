"""`training.preset: small_data` for every built-in task, explicit keys winning, and the hint
`bertkit check` and `finetune` give a small training set (docs: training/small-data.md)."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

import bertkit
from bertkit.errors import UserError
from bertkit.recipes.presets import SMALL_DATA_EXAMPLES
from bertkit.recipes.recipe import load_recipe
from bertkit.run_dir import RunDirectory
from bertkit.testing import run_bertkit, write_tiny_checkpoint
from bertkit.training import run_steps
from bertkit.training.trainer import _note_small_data

SMALL_DATA = {
    "training.epochs": 10,
    "training.early_stopping_patience": 3,
    "training.head_learning_rate": 1e-3,
    "training.reinit_top_layers": 1,
}
CONLL = "mr O\njohn B-PER\nin O\nparis B-LOC\n\n"


def spec(task="tagging", **training) -> dict:
    return {
        "schema": 1,
        "task": task,
        "backbone": {"preset": "bert_tiny_en_uncased"},
        "data": {"train": "train.txt"},
        "training": training,
    }


@pytest.mark.parametrize(
    "task",
    [
        "classification",
        "embedding",
        "mlm",
        "multi_label",
        "multiple_choice",
        "regression",
        "span_qa",
        "tagging",
    ],
)
def test_the_preset_expands_for_every_task(task):
    recipe = load_recipe(spec(task, preset="small_data"))
    expected = {**SMALL_DATA, **({"task.class_weights": "balanced"} if task == "tagging" else {})}
    assert recipe.preset_values == expected
    assert recipe.training.epochs == 10 and recipe.training.reinit_top_layers == 1
    assert recipe.to_dict()["training"]["head_learning_rate"] == 1e-3  # the resolved recipe


def test_an_explicit_key_wins_over_the_preset():
    recipe = load_recipe(
        {
            **spec(preset="small_data", epochs=4),
            "task": {"name": "tagging", "class_weights": "none"},
        },
        ["training.reinit_top_layers=0"],
    )
    assert (recipe.training.epochs, recipe.training.reinit_top_layers) == (4, 0)
    assert recipe.task_options.class_weights == "none"
    assert recipe.preset_values == {
        "training.early_stopping_patience": 3,
        "training.head_learning_rate": 1e-3,
    }
    assert load_recipe(spec()).preset_values == {}  # no preset, nothing filled


def test_an_unknown_preset_is_one_line_exit_2(tmp_path):
    with pytest.raises(UserError, match="did you mean 'small_data'"):
        load_recipe(spec(preset="smalldata"))
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(spec(preset="tiny")))
    result = run_bertkit("check", path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"bertkit: error: {path}:8: training.preset: unknown preset 'tiny'; available: small_data"
    ]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_checkpoint(
        tmp_path_factory.mktemp("preset") / "ckpt", num_layers=1, hidden_size=16, num_heads=2
    )


def recipe_file(folder, checkpoint, sentences: int, **training):
    (folder / "train.txt").write_text(CONLL * sentences)
    recipe = {**spec(**training), "backbone": {"preset": str(checkpoint), "sequence_length": 16}}
    (folder / "r.yaml").write_text(yaml.safe_dump(recipe))
    return folder / "r.yaml"


@pytest.mark.parametrize(
    "sentences, training, hinted",
    [
        (8, {}, True),
        (8, {"preset": "small_data"}, False),
        (SMALL_DATA_EXAMPLES, {}, False),
    ],
)
def test_check_names_the_preset_to_a_small_training_set(
    tmp_path, checkpoint, sentences, training, hinted
):
    result = run_bertkit("check", recipe_file(tmp_path, checkpoint, sentences, **training))
    assert result.returncode == 0, result.stderr
    assert "small_data" not in result.stderr  # stderr carries only errors and warnings
    notes = [line for line in result.stdout.splitlines() if line.startswith("# small data")]
    assert notes == (
        [
            f"# small data: {sentences} training examples: 'training.preset: small_data' "
            "scored +6.5 test entity F1 over transformers trained as long on WNUT-16 "
            "(42.7 vs 36.2) and +4.5 on CoNLL-2003's first 1,000 sentences (77.4 vs 72.9) "
            "(docs/training/small-data.md)"
        ]
        if hinted
        else []
    )
    assert yaml.safe_load(result.stdout)["training"]["epochs"] == (10 if training else 3)


def test_finetune_records_the_expanded_values_and_hints_without_the_preset(
    tmp_path, checkpoint, capsys, monkeypatch
):
    monkeypatch.setattr(run_steps, "export_run", lambda *args, **kwargs: None)
    recipe = yaml.safe_load(recipe_file(tmp_path, checkpoint, 8).read_text())
    recipe["data"]["validation"] = recipe["data"]["train"] = str(tmp_path / "train.txt")
    recipe["training"] = {"preset": "small_data", "epochs": 1}
    bertkit.finetune(recipe, output_dir=tmp_path / "preset", verbose=0)
    assert "small data:" not in capsys.readouterr().out
    run = json.loads((tmp_path / "preset" / "run.json").read_text())
    filled = {**SMALL_DATA, "task.class_weights": "balanced"}
    del filled["training.epochs"]  # the recipe's own
    assert run["preset"] == {"name": "small_data", "values": filled}
    # the same run's data without the preset: finetune's hint (one run less to train)
    rows = SimpleNamespace(train_features=SimpleNamespace(example_index=np.repeat(range(8), 2)))
    del recipe["training"]["preset"]
    _note_small_data(load_recipe(recipe), rows, RunDirectory(tmp_path / "plain"))
    hint = "small data: 8 training examples: 'training.preset: small_data' scored +6.5"
    assert capsys.readouterr().out.startswith(hint)


@pytest.mark.parametrize("task", ["span_qa", "mlm"])
def test_the_hint_says_where_the_preset_was_not_measured(task):
    from bertkit.recipes.presets import small_data_hint

    recipe = SimpleNamespace(task=task, training=SimpleNamespace(preset=None))
    hint = small_data_hint(recipe, 500)
    assert hint.startswith("small data: 500 training examples: 'training.preset: small_data' ")
    assert f"was not measured on {task}; on tagging it scored +6.5" in hint


def test_the_hint_of_a_classification_run_gives_the_classification_figures():
    from bertkit.recipes.presets import small_data_hint

    recipe = SimpleNamespace(task="classification", training=SimpleNamespace(preset=None))
    hint = small_data_hint(recipe, 1000)
    assert "scored +1.3 accuracy over transformers trained as long on SST-2's first" in hint
    assert "+1.9 on RTE (59.4 vs 57.5)" in hint and "tagging" not in hint
