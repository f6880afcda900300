"""Every head a built-in task adds starts as transformers starts it: normal(0, 0.02)."""

import keras
import pytest

from bertkit.model.backbone import load_pretrained
from bertkit.recipes.recipe import load_recipe
from bertkit.testing import write_tiny_checkpoint

HEADS = [  # (recipe task, task state, the head's Dense layers)
    ("classification", {"labels": ["neg", "pos"]}, ["classifier"]),
    ("tagging", {"labels": ["O", "B-PER", "I-PER"]}, ["tagger"]),
    ("span_qa", {}, ["span_logits"]),
    ({"name": "mlm", "next_sentence_prediction": True}, {}, ["nsp_head"]),
]


@pytest.fixture(scope="module")
def backbone_source(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("heads") / "checkpoint")


@pytest.mark.parametrize(
    "task, state, layers", HEADS, ids=["classification", "tagging", "span_qa", "mlm"]
)
def test_new_head_layers_start_from_a_normal_of_stddev_0_02(backbone_source, task, state, layers):
    recipe = load_recipe(
        {
            "schema": 1,
            "task": task,
            "data": {"train": "unused.txt"},
            "backbone": {"preset": str(backbone_source), "sequence_length": 16},
        }
    )
    pretrained = load_pretrained(str(backbone_source), sequence_length=16)
    built = recipe.task_class()(
        recipe.task_options, recipe.data, pretrained.tokenizer, 16, state
    ).build_model(pretrained.backbone)
    for name in layers:
        initializer = built.get_layer(name).kernel_initializer
        assert isinstance(initializer, keras.initializers.RandomNormal), (name, initializer)
        assert initializer.get_config()["stddev"] == 0.02
