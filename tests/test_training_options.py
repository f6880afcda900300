"""Training options: mixed precision, accumulation, strategy, early stopping, AdamW decay."""

import json

import keras
import numpy as np
import pytest

import bertkit
from bertkit.errors import UserError
from bertkit.recipes.recipe import TrainingConfig
from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint
from bertkit.training.callbacks import TrackRun
from bertkit.training.optimization import BertAdamW, make_optimizer
from bertkit.training.validation import ValidationSplit


def recipe(tmp_path, **training):
    write_tiny_checkpoint(tmp_path / "ckpt")
    write_sentiment_tsv(tmp_path / "train.tsv", 48)
    return {
        "schema": 1,
        "task": "classification",
        "backbone": {"preset": str(tmp_path / "ckpt"), "sequence_length": 32},
        "data": {
            "train": str(tmp_path / "train.tsv"),
            "validation": str(tmp_path / "train.tsv"),
            "text": "sentence",
        },
        "training": {"epochs": 5, "batch_size": 8, **training},
        "export": {"saved_model": False},
    }


def test_bfloat16_accumulation_and_early_stopping(tmp_path, monkeypatch):
    spec = recipe(
        tmp_path,
        learning_rate=1e-9,
        mixed_precision="bfloat16",
        gradient_accumulation_steps=2,
        early_stopping_patience=1,
    )
    model = bertkit.finetune(spec, output_dir=tmp_path / "run", verbose=0)
    epochs = json.loads((tmp_path / "run" / "metrics.json").read_text())["epochs"]
    # Nothing improves with a vanishing learning rate, and accuracy stays at the majority
    # class's 0.5: the patience waits for the metric to leave that floor, so all 5 epochs run.
    assert [e["val_accuracy"] for e in epochs] == [0.5] * 5
    assert keras.config.dtype_policy().name == "float32"  # the process-wide policy is restored
    assert model.predict(["good film"])[0]["label"] in {"positive", "negative"}
    monkeypatch.setattr(ValidationSplit, "floor", lambda self: None)  # a task without a floor
    bertkit.finetune(spec, output_dir=tmp_path / "run2", verbose=0)
    epochs = json.loads((tmp_path / "run2" / "metrics.json").read_text())["epochs"]
    assert len(epochs) == 2  # stops after 1 epoch without a better metric


def test_mirrored_strategy_refuses_gradient_accumulation(tmp_path):
    # Training under tf.distribute: tests/test_data_parallel.py (two logical CPUs).
    spec = recipe(tmp_path, epochs=1, distribution="mirrored")
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
    optimizer = make_optimizer(
        TrainingConfig(epochs=2, learning_rate=1.0, warmup_ratio=0.25), steps_per_epoch=10
    )
    rates = [
        float(optimizer.learning_rate_schedule(step))
        if hasattr(optimizer, "learning_rate_schedule")
        else float(optimizer._learning_rate(step))
        for step in (0, 5, 10, 20)
    ]
    np.testing.assert_allclose(rates, [0.0, 1.0, 2 / 3, 0.0], atol=1e-6)


def torch_adamw(weight, gradients, learning_rate, weight_decay, epsilon, beta_1=0.9, beta_2=0.999):
    """PyTorch's AdamW update rule in NumPy (decoupled decay, epsilon after bias correction)."""
    m, v = np.zeros_like(weight), np.zeros_like(weight)
    for step, gradient in enumerate(gradients, start=1):
        weight = weight * (1 - learning_rate * weight_decay)
        m = beta_1 * m + (1 - beta_1) * gradient
        v = beta_2 * v + (1 - beta_2) * gradient**2
        m_hat, v_hat = m / (1 - beta_1**step), v / (1 - beta_2**step)
        weight = weight - learning_rate * m_hat / (np.sqrt(v_hat) + epsilon)
    return weight


def test_adamw_follows_pytorch_epsilon_placement():
    rng = np.random.default_rng(0)
    start = rng.standard_normal(64).astype(np.float32)
    # Gradients near epsilon are where Keras's stock placement differs most.
    gradients = [
        (rng.standard_normal(64) * 10.0 ** rng.integers(-7, 0, 64)).astype(np.float32)
        for _ in range(5)
    ]
    settings = {"learning_rate": 1e-3, "weight_decay": 0.01, "epsilon": 1e-6}
    expected = torch_adamw(start.astype(np.float64), gradients, **settings)

    def trained(optimizer_class):
        weight = keras.Variable(start)
        optimizer = optimizer_class(**settings)
        for gradient in gradients:
            optimizer.apply([keras.ops.convert_to_tensor(gradient)], [weight])
        return weight.numpy()

    np.testing.assert_allclose(trained(BertAdamW), expected, rtol=0, atol=1e-6)  # float32 rounding
    stock_error = np.abs(trained(keras.optimizers.AdamW) - expected).max()
    assert stock_error > 1e-4  # the placement this class exists to change
    assert isinstance(make_optimizer(TrainingConfig(epochs=1), 10), BertAdamW)


def test_adam_epsilon_reaches_the_optimizer():
    assert make_optimizer(TrainingConfig(epochs=1), 10).epsilon == 1e-6  # BERT's value
    optimizer = make_optimizer(TrainingConfig(epochs=1, adam_epsilon=1e-8), 10)
    assert optimizer.epsilon == 1e-8  # transformers' TrainingArguments default


def test_patience_counts_once_the_metric_beats_the_learned_nothing_floor():
    def epochs(*values):
        return [{"epoch": e, "val_f1": v} for e, v in enumerate(values, 1)]

    stuck = epochs(0.0, 0.0, 0.0, 0.0)  # entity F1 0: every word tagged O
    assert TrackRun(None, "val_f1", "max", 3, stuck).patience_ran_out(stuck[-1])
    assert not TrackRun(None, "val_f1", "max", 3, stuck, floor=0.0).patience_ran_out(stuck[-1])
    left = epochs(0.0, 0.0, 0.0, 0.0, 0.2, 0.1, 0.1, 0.1)
    track = TrackRun(None, "val_f1", "max", 3, left, floor=0.0)
    assert not track.patience_ran_out(left[-2]) and track.patience_ran_out(left[-1])
    losses = [{"epoch": e, "val_loss": v} for e, v in enumerate((0.7, 0.7, 0.7), 1)]
    lower = TrackRun(None, "val_loss", "min", 2, losses, floor=0.7)
    assert not lower.patience_ran_out(losses[-1])
    assert TrackRun(None, "val_loss", "min", 2, losses, floor=0.8).patience_ran_out(losses[-1])
