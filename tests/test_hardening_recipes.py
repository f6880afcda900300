"""Hardening (issue 51): recipes, `--set`, `check` and run directories; every bad input
one line and exit status 2, before the framework loads."""

import pytest
import yaml

from bertkit.errors import UserError
from bertkit.recipes.recipe import load_recipe
from bertkit.testing import run_bertkit, write_sentiment_tsv, write_tiny_checkpoint


def one_line_error(result, message):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr, result.stderr


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny checkpoint (2 layers, 32 wide, 64-wide feed-forward, 128 positions) and data."""
    folder = tmp_path_factory.mktemp("recipes")
    write_tiny_checkpoint(folder / "ckpt")
    write_sentiment_tsv(folder / "train.tsv", 16, seed=0)
    return folder


def write_recipe(folder, name="r.yaml", text=None, **training):
    path = folder / name
    recipe = {
        "schema": 1,
        "task": "classification",
        "backbone": {"preset": "ckpt", "sequence_length": 16},
        "data": {"train": "train.tsv", "text": "sentence"},
        "training": {"epochs": 1, "batch_size": 8, **training},
        "output_dir": "run",
    }
    path.write_text(text if text is not None else yaml.safe_dump(recipe, sort_keys=False))
    return path


# ---- 1, 2: nesting and characters YAML refuses
def test_deep_nesting_in_a_recipe_is_one_line(folder):
    path = write_recipe(folder, text="schema: 1\ntask: classification\nbackbone: " + "[" * 1100)
    result = run_bertkit("check", path, cwd=folder)
    one_line_error(result, "r.yaml:3: invalid YAML: values nested more than 32 levels deep")


def test_deep_nesting_in_a_set_value_names_set(folder):
    path = write_recipe(folder)
    result = run_bertkit("check", path, "--set", "training.epochs=" + "[" * 2000, cwd=folder)
    one_line_error(result, "--set: training.epochs: invalid YAML: values nested more than 32")


@pytest.mark.parametrize(
    "character, named",
    [("\x00", "a NUL byte (U+0000)"), ("\x07", "a control character (U+0007)")],
)
def test_a_control_character_names_line_column_and_character(folder, character, named):
    text = f"schema: 1\ntask: classification\nbackbone: {{preset: ck{character}pt}}\n"
    result = run_bertkit("check", write_recipe(folder, text=text), cwd=folder)
    one_line_error(result, f"r.yaml:3: {named} at column 22")


def test_a_control_character_in_set_is_shown_escaped(folder):
    result = run_bertkit("check", write_recipe(folder), "--set", "output_dir=a\x1bb", cwd=folder)
    one_line_error(result, "--set: output_dir: a control character (U+001B) at column 2")
    assert "'a\\x1bb'" in result.stderr


# ---- 8: keyword arguments and --set keys the file lacks
def test_keyword_arguments_name_themselves(folder):
    with pytest.raises(UserError) as raised:
        load_recipe(write_recipe(folder), called_as="finetune", training={"epochs": "x"})
    assert (
        str(raised.value) == "finetune(training=...): training.epochs: expected an integer, got 'x'"
    )


def test_a_set_key_the_file_lacks_blames_set(folder):
    result = run_bertkit("check", write_recipe(folder), "--set", "foo.bar=1", cwd=folder)
    one_line_error(result, "bertkit: error: --set: foo: unknown key 'foo'")


def test_a_file_key_still_blames_the_file(folder):
    path = write_recipe(folder, text="schema: 1\ntask: classification\nfoo: 1\n")
    result = run_bertkit("check", path, "--set", "training.epochs=1", cwd=folder)
    one_line_error(result, "r.yaml:3: foo: unknown key 'foo'")
