"""The `search:` section: parsed by the recipe's strict schema, each mistake one line."""

import json
import textwrap

import optuna
import pytest

from bertkit import cli
from bertkit.errors import UserError
from bertkit.recipes.recipe import load_recipe, recipe_json_schema
from bertkit.testing import write_tiny_checkpoint

RECIPE = """
    schema: 1
    task: classification
    backbone: {preset: tiny}
    data: {train: train.tsv, validation: dev.tsv}
    output_dir: runs/x
    search:
      trials: 12
      training.learning_rate: {low: 1.0e-5, high: 1.0e-4, log: true}
      training.batch_size: [16, 32]
      training.epochs: [2, 3, 4]
      task.dropout: {low: 0.0, high: 0.3}
"""


def write(tmp_path, text):
    path = tmp_path / "r.yaml"
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def test_the_issue_example_parses_into_a_space(tmp_path):
    space = load_recipe(write(tmp_path, RECIPE)).search
    assert space.options.trials == 12 and space.options.pruner == "median"
    rate, batch, epochs, dropout = space.dimensions
    assert (rate.low, rate.high, rate.log, rate.integer) == (1e-5, 1e-4, True, False)
    assert batch.choices == (16, 32) and epochs.choices == (2, 3, 4)
    assert (dropout.low, dropout.high, dropout.log) == (0.0, 0.3, False)


def test_suggested_values_set_a_trial_recipe_as_set_does(tmp_path):
    path = write(tmp_path, RECIPE)
    space = load_recipe(path).search
    trial = optuna.trial.FixedTrial(
        {
            "training.learning_rate": 2e-5,
            "training.batch_size": 16,
            "training.epochs": 4,
            "task.dropout": 0.25,
        }
    )
    recipe = load_recipe(path, space.overrides(space.suggest(trial)))
    assert (
        recipe.training.learning_rate,
        recipe.training.batch_size,
        recipe.training.epochs,
        recipe.task_options.dropout,
    ) == (2e-5, 16, 4, 0.25)


def test_a_key_may_name_a_value_of_a_nested_section(tmp_path):
    # training.lora.rank: LoRA's rank, searched on a recipe without LoRA, turns it on with
    # the section's other values at their defaults (as `--set training.lora.rank=4` does)
    path = write(tmp_path, RECIPE.replace(RATE, "training.lora.rank: {low: 2, high: 16}"))
    space = load_recipe(path).search
    (rank,) = [d for d in space.dimensions if d.key == "training.lora.rank"]
    assert (rank.low, rank.high, rank.integer) == (2, 16, True)
    trial = optuna.trial.FixedTrial(
        {
            "training.lora.rank": 4,
            "training.batch_size": 16,
            "training.epochs": 2,
            "task.dropout": 0.1,
        }
    )
    lora = load_recipe(path, space.overrides(space.suggest(trial))).training.lora
    assert (lora.rank, lora.alpha, lora.targets) == (4, 16.0, ("query", "value"))


def test_integer_ranges_are_suggested_as_integers(tmp_path):
    text = RECIPE.replace("[2, 3, 4]", "{low: 1, high: 5}")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    values = load_recipe(write(tmp_path, text)).search.suggest(study.ask())
    assert isinstance(values["training.epochs"], int) and 1 <= values["training.epochs"] <= 5


def test_a_dimension_names_the_distribution_a_study_records(tmp_path):
    text = RECIPE.replace("[2, 3, 4]", "{low: 1, high: 5}")
    space = load_recipe(write(tmp_path, text)).search
    trial = optuna.create_study().ask()
    space.suggest(trial)
    assert {d.key: d.distribution() for d in space.dimensions} == trial.distributions


def replace_line(old, new):
    assert old in RECIPE
    return RECIPE.replace(old, new)


RATE = "training.learning_rate: {low: 1.0e-5, high: 1.0e-4, log: true}"


@pytest.mark.parametrize(
    "text, message",
    [
        (
            replace_line("training.learning_rate", "training.learning_rat"),
            "r.yaml:8: search.training.learning_rat: unknown key 'training.learning_rat'; "
            "did you mean 'training.learning_rate'?",
        ),
        (
            replace_line("trials: 12", "trails: 12"),
            "r.yaml:7: search.trails: unknown key 'trails'; did you mean 'trials'?",
        ),
        (
            replace_line("trials: 12", "trials: 0"),
            "r.yaml:7: search.trials: must be at least 1, got 0",
        ),
        # the sampler's seed is bounded as training.seed is (issue 28)
        (
            replace_line("trials: 12", "seed: -1"),
            "r.yaml:7: search.seed: must be at least 0, got -1",
        ),
        (
            replace_line("trials: 12", "seed: 4294967296"),
            "r.yaml:7: search.seed: must be at most 4294967295, got 4294967296",
        ),
        (
            replace_line(RATE, "data.train: [a.tsv, b.tsv]"),
            "r.yaml:8: search.data.train: cannot search 'data' values; searchable sections: "
            "training, task, backbone",
        ),
        (
            replace_line(RATE, "training.mixed_precision: {low: 1, high: 2}"),
            "r.yaml:8: search.training.mixed_precision: a range needs a numeric value, and "
            "training.mixed_precision is not a number; give a list of choices",
        ),
        (
            replace_line("low: 1.0e-5", "low: fast"),
            "r.yaml:8: search.training.learning_rate.low: expected a number, got 'fast'",
        ),
        (
            replace_line("[16, 32]", "[16, big]"),
            "r.yaml:9: search.training.batch_size.1: expected an integer, got 'big'",
        ),
        (
            replace_line("[16, 32]", "[16, 0]"),
            "r.yaml:9: search.training.batch_size.1: must be at least 1, got 0",
        ),
        (
            replace_line("[2, 3, 4]", "[]"),
            "r.yaml:10: search.training.epochs: expected at least one choice, got an empty list",
        ),
        (
            replace_line("[2, 3, 4]", "[[2, 3]]"),
            "r.yaml:10: search.training.epochs.0: choices are numbers, strings, true/false or null, "
            "got a list",
        ),
        (
            replace_line("[2, 3, 4]", "{low: 1, high: 2.5}"),
            "r.yaml:10: search.training.epochs.high: expected an integer, got 2.5",
        ),
        (
            replace_line("[2, 3, 4]", "{low: 0, high: 3}"),
            "r.yaml:10: search.training.epochs.low: must be at least 1, got 0",
        ),
        (
            replace_line("[2, 3, 4]", "3"),
            "r.yaml:10: search.training.epochs: expected a range {low: ..., high: ...} or a list of "
            "choices, got 3",
        ),
        (
            replace_line("low: 0.0, high: 0.3", "low: 0.3, high: 0.1"),
            "r.yaml:11: search.task.dropout: low must be less than high, got 0.3 and 0.1",
        ),
        (
            replace_line("low: 0.0, high: 0.3", "low: 0.0, high: 0.3, log: true"),
            "r.yaml:11: search.task.dropout.low: a log range needs low > 0, got 0.0",
        ),
        (
            replace_line("high: 0.3", "high: 0.3, lg: true"),
            "r.yaml:11: search.task.dropout.lg: unknown key 'lg'; did you mean 'log'?",
        ),
        (
            replace_line(RATE, "training.lora.rnak: [4, 8]"),
            "r.yaml:8: search.training.lora.rnak: unknown key 'training.lora.rnak'; "
            "did you mean 'training.lora.rank'?",
        ),
        (
            replace_line(RATE, "training.lora.rank: [4, 0]"),
            "r.yaml:8: search.training.lora.rank.1: must be at least 1, got 0",
        ),
        (
            replace_line(RATE, "training.epochs.low: [1, 2]"),
            "r.yaml:8: search.training.epochs.low: training.epochs is a value, not a section "
            "of values",
        ),
        (
            replace_line("task.dropout", "task.droput"),
            "r.yaml:11: search.task.droput: unknown key 'task.droput'; did you mean 'task.dropout'?",
        ),
        (
            "\n".join(RECIPE.splitlines()[:8]).replace(f"      {RATE}", "") + "\n",
            "r.yaml:6: search: names no recipe value to search",
        ),
        (
            RECIPE.split("search:")[0] + "search: [1, 2]\n",
            "r.yaml:6: search: expected a mapping, got a list",
        ),
    ],
)
def test_bad_search_sections_are_one_line_errors(tmp_path, monkeypatch, text, message):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, text)
    with pytest.raises(UserError) as caught:
        load_recipe("r.yaml")
    assert str(caught.value).startswith(message), str(caught.value)


def test_check_reports_a_bad_search_section_in_one_line_exit_2(tmp_path, capsys):
    path = write(tmp_path, replace_line("[16, 32]", "[16, big]"))
    assert cli.main(["check", str(path)]) == 2
    error = capsys.readouterr().err
    assert error == (
        f"bertkit: error: {path}:9: search.training.batch_size.1: expected an integer, got 'big'\n"
    )


def test_check_prints_the_resolved_search_section(tmp_path, capsys):
    for name in ("train.tsv", "dev.tsv"):
        (tmp_path / name).write_text("sentence\tlabel\n")
    write_tiny_checkpoint(tmp_path / "tiny")  # check reads its config, as finetune would
    assert cli.main(["check", str(write(tmp_path, RECIPE))]) == 0
    out = capsys.readouterr().out
    assert "search:\n  trials: 12\n" in out and "  training.batch_size:\n  - 16\n  - 32\n" in out


def test_schema_describes_the_search_section():
    search = recipe_json_schema()["properties"]["search"]
    assert search["properties"]["trials"]["minimum"] == 1
    (pattern,) = search["patternProperties"]
    assert "training" in pattern and search["additionalProperties"] is False
    json.dumps(search)  # plain JSON
