"""Recipes: strict schema, errors with file:line:key, overrides, path resolution, no TensorFlow."""

import json
import subprocess
import sys
import textwrap

import pytest

from bertkit.errors import UserError
from bertkit.recipes.recipe import load_recipe, recipe_json_schema
from bertkit.testing import write_tiny_checkpoint


def write(tmp_path, text, name="r.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


GOOD = """
    schema: 1
    task: classification
    backbone: {preset: ../models/tiny, sequence_length: 64}
    data: {train: data/train.tsv, validation: data/dev.tsv, text: sentence}
    training: {epochs: 2, learning_rate: 3e-5}
    output_dir: ../runs/x
"""


def error_of(tmp_path, text, overrides=None):
    with pytest.raises(UserError) as caught:
        load_recipe(write(tmp_path, text), overrides)
    return str(caught.value)


def test_good_recipe_resolves_paths_against_the_recipe_folder(tmp_path):
    (tmp_path / "recipes").mkdir()
    recipe = load_recipe(write(tmp_path / "recipes", GOOD))
    assert recipe.data.train == str(tmp_path / "recipes" / "data" / "train.tsv")
    assert recipe.backbone.preset == str(tmp_path / "models" / "tiny")
    assert recipe.output_dir == str(tmp_path / "runs" / "x")
    assert recipe.training.learning_rate == 3e-5 and recipe.training.batch_size == 32
    assert recipe.data.text == "sentence" and recipe.task_options.labels is None


def test_overrides_are_checked_by_the_same_schema(tmp_path):
    recipe = load_recipe(write(tmp_path, GOOD), ["training.epochs=5", "task.dropout=0.2"])
    assert recipe.training.epochs == 5 and recipe.task_options.dropout == 0.2
    assert error_of(tmp_path, GOOD, ["training.epochs=many"]) == (
        "--set: training.epochs: expected an integer, got 'many'"
    )
    assert error_of(tmp_path, GOOD, ["training.epoch=3"]) == (
        "--set: training.epoch: unknown key 'epoch'; did you mean 'epochs'?"
    )


def test_python_api_sections_merge(tmp_path):
    recipe = load_recipe(write(tmp_path, GOOD), training={"batch_size": 8})
    assert (recipe.training.batch_size, recipe.training.epochs) == (8, 2)


@pytest.mark.parametrize(
    "text, message",
    [
        (
            GOOD.replace("epochs: 2", "epochs: fast"),
            "r.yaml:5: training.epochs: expected an integer, got 'fast'",
        ),
        (
            GOOD.replace("epochs: 2", "epochs: 0"),
            "r.yaml:5: training.epochs: must be at least 1, got 0",
        ),
        (
            GOOD.replace("epochs: 2", "epohcs: 2"),
            "r.yaml:5: training.epohcs: unknown key 'epohcs'; did you mean 'epochs'?",
        ),
        (
            GOOD.replace("task: classification", "task: clasification"),
            "r.yaml:2: task: unknown task 'clasification'; did you mean 'classification'? available: ",
        ),
        (GOOD.replace("schema: 1\n", ""), "schema: missing required key 'schema'"),
        (GOOD.replace("schema: 1", "schema: 7"), "r.yaml:1: schema: unsupported schema 7"),
        (GOOD.replace("train: data/train.tsv, ", ""), "data.train: missing required key 'train'"),
        (GOOD + "    extra: 1\n", "r.yaml:7: extra: unknown key 'extra'"),
        (
            GOOD.replace("task: classification", "task: !!python/object/apply:os.system [ls]"),
            "r.yaml:2: unsupported YAML tag 'tag:yaml.org,2002:python/object/apply:os.system'",
        ),
        (GOOD.replace("epochs: 2,", "epochs: [2,"), "r.yaml:5: invalid YAML"),
        (
            GOOD.replace("mixed_precision", "x").replace("epochs: 2", "mixed_precision: fp8"),
            "training.mixed_precision: expected one of 'bfloat16', 'float16', got 'fp8'",
        ),
    ],
)
def test_errors_name_file_line_and_key(tmp_path, text, message):
    assert message in error_of(tmp_path, text)


def test_missing_recipe_file(tmp_path):
    with pytest.raises(UserError, match="nope.yaml: file not found"):
        load_recipe(tmp_path / "nope.yaml")


def test_python_tag_is_never_executed(tmp_path):
    marker = tmp_path / "executed"
    text = GOOD.replace(
        "task: classification", f"task: !!python/object/apply:os.system ['touch {marker}']"
    )
    with pytest.raises(UserError):
        load_recipe(write(tmp_path, text))
    assert not marker.exists()


def test_json_schema_covers_sections_and_tasks():
    schema = recipe_json_schema()
    assert set(schema["properties"]) == {
        "schema",
        "task",
        "backbone",
        "data",
        "training",
        "output_dir",
        "search",
        "export",
    }
    assert {"const": "classification"} in schema["properties"]["task"]["anyOf"]
    training = schema["properties"]["training"]["properties"]
    assert training["epochs"] == {
        "type": "integer",
        "description": "passes over the training data",
        "minimum": 1,
        "maximum": 10_000,
        "default": 3,
    }


def test_checking_a_recipe_does_not_import_tensorflow(tmp_path):
    path = write(tmp_path, GOOD)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.tsv").write_text("sentence\tlabel\n")
    (tmp_path / "data" / "dev.tsv").write_text("sentence\tlabel\n")
    # a checkpoint check reads (its config, not its weights), as finetune would load it
    write_tiny_checkpoint(tmp_path.parent / "models" / "tiny")
    code = (
        f"import sys, bertkit.cli; bertkit.cli.main(['check', {str(path)!r}]); "
        "print(json.dumps(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True
    ).stdout
    assert "task:\n  name: classification" in out
    assert json.loads(out.strip().splitlines()[-1]) == []


@pytest.mark.parametrize(
    "override, message",
    [
        ("training.seed=-1", "--set: training.seed: must be at least 0, got -1"),
        (
            "training.seed=4294967296",
            "--set: training.seed: must be at most 4294967295, got 4294967296",
        ),
    ],
)
def test_the_seed_is_bounded_by_the_schema(tmp_path, override, message):
    assert error_of(tmp_path, GOOD, [override]) == message


def test_a_searched_seed_is_bounded_too(tmp_path):
    search = GOOD + "    search: {training.seed: {low: 0, high: 4294967296}}\n"
    assert error_of(tmp_path, search).endswith(
        "r.yaml:7: search.training.seed.high: must be at most 4294967295, got 4294967296"
    )
    search = GOOD + "    search: {training.seed: [-3, 1]}\n"
    assert error_of(tmp_path, search).endswith(
        "r.yaml:7: search.training.seed.0: must be at least 0, got -3"
    )


LONG = "9" * 5000


@pytest.mark.parametrize(
    "text, overrides, message",
    [
        (
            GOOD.replace("epochs: 2", f"epochs: {LONG}"),
            None,
            "r.yaml:5: training.epochs: a number of 5000 digits is too long to read (at most 4300)",
        ),
        (
            GOOD,
            [f"training.epochs={LONG}"],
            "--set: training.epochs: a number of 5000 digits is too long to read (at most 4300) "
            "(in '99999",
        ),
        (
            GOOD.replace("epochs: 2", f"epochs: 0x{'f' * 5000}"),
            None,
            "r.yaml:5: training.epochs: must be at most 10000, got an integer of 6021 digits",
        ),
        (
            GOOD.replace("epochs: 2", f"batch_size: 0x{'f' * 5000}"),
            None,
            "r.yaml:5: training.batch_size: must be at most 9223372036854775807, got an integer of "
            "6021 digits",
        ),
        (
            GOOD,
            [f"training.learning_rate=0x{'f' * 5000}"],
            "--set: training.learning_rate: expected a finite number, got an integer of 6021 digits",
        ),
        (
            GOOD,
            [f"data.text=0x{'f' * 5000}"],
            "--set: data.text: expected a string, got an integer of 6021 digits",
        ),
        (
            GOOD.replace("epochs: 2", "epochs: 2001-13-45"),
            None,
            "r.yaml:5: training.epochs: cannot read '2001-13-45': month must be in 1..12",
        ),
    ],
    ids=[
        "decimal",
        "decimal --set",
        "hex",
        "hex unbounded",
        "hex as float",
        "hex as text",
        "bad date",
    ],
)
def test_numbers_too_long_to_read_are_one_line(tmp_path, text, overrides, message):
    assert message in error_of(tmp_path, text, overrides)
