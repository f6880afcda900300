"""Training options: mixed precision, accumulation, strategy, early stopping, AdamW decay."""

import json

import keras
import numpy as np
import pytest

import bertkit
from bertkit.errors import UserError
from bertkit.optimization import make_optimizer
from bertkit.recipe import TrainingConfig
from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint


def recipe(tmp_path, **training):
    write_tiny_checkpoint(tmp_path / "ckpt")
    write_sentiment_tsv(tmp_path / "train.tsv", 48)
    return {"schema": 1, "task": "classification",
            "backbone": {"preset": str(tmp_path / "ckpt"), "sequence_length": 32},
            "data": {"train": str(tmp_path / "train.tsv"),
                     "validation": str(tmp_path / "train.tsv"), "text": "sentence"},
            "training": {"epochs": 5, "batch_size": 8, **training}}


def test_bfloat16_accumulation_and_early_stopping(tmp_path):
    spec = recipe(tmp_path, learning_rate=1e-9, mixed_precision="bfloat16",
                  gradient_accumulation_steps=2, early_stopping_patience=1)
    model = bertkit.finetune(spec, output_dir=tmp_path / "run", verbose=0)
    epochs = json.loads((tmp_path / "run" / "metrics.json").read_text())["epochs"]
    assert len(epochs) == 2  # nothing improves with a vanishing learning rate: stop after 1 more
    assert keras.config.dtype_policy().name == "float32"  # the process-wide policy is restored
    assert model.predict(["good film"])[0]["label"] in {"positive", "negative"}


def test_mirrored_strategy_trains(tmp_path):
    spec = recipe(tmp_path, epochs=1, distribution="mirrored")
    bertkit.finetune(spec, output_dir=tmp_path / "run", verbose=0)
    assert (tmp_path / "run" / "saved_model" / "saved_model.pb").exists()
    spec["training"]["gradient_accumulation_steps"] = 2
    with pytest.raises(UserError, match="cannot accumulate gradients under tf.distribute"):
        bertkit.finetune(spec, output_dir=tmp_path / "run2", verbose=0)


def test_adamw_skips_decay_on_biases_and_layer_norm():
    optimizer = make_optimizer(TrainingConfig(epochs=1), steps_per_epoch=10)
    dense = keras.layers.Dense(2)
    norm = keras.layers.LayerNormalization()
    dense.build((None, 2))
    norm.build((None, 2))
    decays = {v.path: optimizer._use_weight_decay(v) for v in dense.weights + norm.weights}
    assert [name.split("/")[-1] for name, decay in decays.items() if decay] == ["kernel"]


def test_schedule_warms_up_then_decays_to_zero():
    optimizer = make_optimizer(TrainingConfig(epochs=2, learning_rate=1.0, warmup_ratio=0.25),
                               steps_per_epoch=10)
    rates = [float(optimizer.learning_rate_schedule(step)) if hasattr(
        optimizer, "learning_rate_schedule") else float(optimizer._learning_rate(step))
             for step in (0, 5, 10, 20)]
    np.testing.assert_allclose(rates, [0.0, 1.0, 2 / 3, 0.0], atol=1e-6)
