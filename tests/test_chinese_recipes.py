"""The Chinese recipes (issue 50, item 6) load with the options they name."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from bertkit.recipes.recipe import load_recipe

RECIPES = Path(__file__).parents[1] / "recipes"


def needs(module: str):
    """Skips until the option the recipe names has landed (its module exists)."""
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None, reason=f"{module} not in this tree yet"
    )


def test_the_classification_recipe_reads_text_and_label_columns_with_a_folder_backbone():
    recipe = load_recipe(RECIPES / "chinese_classification.yaml")
    assert recipe.task == "classification"
    assert (recipe.data.text, recipe.data.label) == ("text", "label")
    assert recipe.backbone.preset == str(RECIPES.parent / "models" / "bert-base-chinese")
    assert recipe.data.train.endswith("data/chinese_classification/train.tsv")


@needs("bertkit_tasks.tagging.spans")
def test_the_cluener_recipe_reads_span_json():
    recipe = load_recipe(RECIPES / "cluener.yaml")
    assert recipe.task == "tagging"
    assert recipe.data.format == "spans"
    assert recipe.task_options.text_words == "auto"


@needs("bertkit_tasks.span_qa.cmrc_eval")
def test_the_cmrc2018_recipe_scores_with_the_cmrc_metric():
    recipe = load_recipe(RECIPES / "cmrc2018.yaml")
    assert recipe.task == "span_qa"
    assert recipe.task_options.metric == "cmrc2018"
    assert recipe.backbone.sequence_length == 512
