"""Layer-wise learning-rate decay (`training.layer_lr_decay`): each backbone variable's
effective rate after one update, through TensorFlow's fused Adam kernel and through the
`keras.ops` rule JAX runs (docs: training/small-data.md)."""

import keras
import keras_hub
import numpy as np
import pytest

from bertkit.errors import UserError
from bertkit.recipes.recipe import load_recipe
from bertkit.recipes.sections import TrainingConfig
from bertkit.training.optimization import make_optimizer

# the factor of the learning rate each variable should train at, by its path's first part,
# for a 3-layer backbone at decay 0.5 and a head at twice the learning rate
EXPECTED = {
    "transformer_layer_2": 1.0,
    "pooled_dense": 1.0,
    "transformer_layer_1": 0.5,
    "transformer_layer_0": 0.25,
    "token_embedding": 0.125,
    "position_embedding": 0.125,
    "segment_embedding": 0.125,
    "embeddings_layer_norm": 0.125,
    "head": 2.0,
}


def one_update(fused: bool, **training) -> dict:
    """{variable path: its change} after one update from the same weights and gradients."""
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=10,
        num_layers=3,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=8,
    )
    head = keras.Variable(np.ones((8, 2), "float32"), name="head")
    variables = backbone.trainable_variables + [head]
    before = [np.array(v.numpy()) for v in variables]
    config = TrainingConfig(
        epochs=1, warmup_ratio=0.0, learning_rate=1e-2, weight_decay=0.1, **training
    )
    optimizer = make_optimizer(config, 10, head=[head], backbone=backbone)
    optimizer._fused_on_tensorflow = lambda: fused  # False: the rule as JAX runs it
    generator = np.random.default_rng(1)
    optimizer.apply(
        [generator.normal(size=v.shape).astype("float32") for v in variables], variables
    )
    return {v.path: v.numpy() - b for v, b in zip(variables, before, strict=True)}


@pytest.mark.parametrize("fused", [True, False])
def test_each_layer_trains_at_its_rate_after_one_update(fused):
    plain = one_update(fused)
    decayed = one_update(fused, layer_lr_decay=0.5, head_learning_rate=2e-2)
    assert len(plain) == 56  # 5 embedding weights, 3 layers of 16, the pooler's 2, the head
    for path, step in plain.items():
        assert np.abs(step).max() > 1e-3, path  # it was updated
        factor = EXPECTED[path.split("/")[0]]
        # decay included (biases and LayerNorm have none); atol: float32 steps near 1.0
        assert np.allclose(decayed[path], factor * step, rtol=1e-5, atol=3e-7), path


def spec(**training) -> dict:
    return {
        "schema": 1,
        "task": "classification",
        "backbone": {"preset": "bert_tiny_en_uncased"},
        "data": {"train": "train.tsv"},
        "training": training,
    }


@pytest.mark.parametrize(
    "decay, message",
    [
        (0, "training.layer_lr_decay: must be greater than 0"),
        (1.5, "training.layer_lr_decay: must be at most 1.0"),
    ],
)
def test_a_decay_out_of_bounds_is_one_line(decay, message):
    with pytest.raises(UserError, match=message):
        load_recipe(spec(layer_lr_decay=decay))


def test_a_frozen_backbone_refuses_the_decay():
    frozen = {**spec(layer_lr_decay=0.9), "backbone": {"preset": "x", "trainable": False}}
    with pytest.raises(UserError, match="backbone.trainable: false trains no backbone layer"):
        load_recipe(frozen)
    assert load_recipe(spec(layer_lr_decay=0.9)).training.layer_lr_decay == 0.9
