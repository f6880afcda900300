"""The end of a run reuses the best epoch's validation outputs, traces its training step once
and times its phases."""

import json

import pytest
import tensorflow as tf

import bertkit
import bertkit.serving.inference
from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint
from bertkit.training.phases import Phases
from bertkit.training.validation import ValidationSplit

EPOCHS = 3


def test_final_metrics_are_the_best_epochs_without_evaluating_again(tmp_path, monkeypatch):
    write_tiny_checkpoint(tmp_path / "ckpt")
    write_sentiment_tsv(tmp_path / "train.tsv", 96, seed=0)
    write_sentiment_tsv(tmp_path / "dev.tsv", 40, seed=1)
    calls = []
    predict_rows = bertkit.serving.inference.predict_rows

    def counted(task, model, features, *args):
        calls.append(len(features))
        return predict_rows(task, model, features, *args)

    monkeypatch.setattr(bertkit.serving.inference, "predict_rows", counted)
    recipe = {
        "schema": 1,
        "task": "classification",
        "backbone": {"preset": str(tmp_path / "ckpt"), "sequence_length": 32},
        "data": {
            "train": str(tmp_path / "train.tsv"),
            "validation": str(tmp_path / "dev.tsv"),
            "text": "sentence",
        },
        "training": {"epochs": EPOCHS, "batch_size": 16, "learning_rate": 3e-3},
    }
    created_in_a_trace = []

    def creator(next_creator, **kwargs):
        if tf.inside_function():
            created_in_a_trace.append(kwargs.get("name"))
        return next_creator(**kwargs)

    with tf.variable_creator_scope(creator):
        bertkit.finetune(recipe, output_dir=tmp_path / "run", verbose=0)

    assert calls == [40] * EPOCHS  # one validation prediction per epoch, none at the end
    # a variable made while the step is traced (the optimizer's) makes TensorFlow trace it twice
    assert created_in_a_trace == []
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    best = metrics["epochs"][run["best_epoch"] - 1]
    final = metrics["final"]["validation"]
    assert {f"val_{name}": value for name, value in final.items()} == pytest.approx(
        {name: value for name, value in best.items() if name.startswith("val_")}
    )
    phases = run["phases"]
    for name in (
        "read",
        "load_backbone",
        "featurize",
        "build_model",
        "first_step",
        "train_steps",
        "evaluation",
        "fit_overhead",
        "final_evaluation",
        "report",
        "export",
        "total",
    ):
        assert phases[name] >= 0, name
    assert sum(v for k, v in phases.items() if k != "total") <= phases["total"] + 0.01


class _Predicted:
    """A `ValidationSplit` whose model outputs are a counter: each prediction differs."""

    def __init__(self):
        self.validation = ValidationSplit(None, [], None, 8, (8,), Phases())
        self.count = 0
        self.validation.outputs = self.outputs
        self.validation.decode = lambda outputs: [outputs]
        self.validation.task = type("Task", (), {"evaluate": lambda _, e, p: {"n": p[0]["n"]}})()

    def outputs(self, model):
        self.count += 1
        return {"n": self.count}


def test_the_best_epochs_outputs_are_kept_and_predicted_again_only_when_missing():
    predicted = _Predicted()
    validation = predicted.validation
    validation.evaluate(None)
    validation.keep_latest(1)  # epoch 1 is the best so far
    validation.evaluate(None)  # epoch 2 is not
    assert validation.best_outputs(1, None) == ({"n": 1}, [{"n": 1}])
    assert predicted.count == 2
    # a resumed run whose best epoch (here 3) came before the interruption: predict again
    assert validation.best_outputs(3, None) == ({"n": 3}, [{"n": 3}])
    assert predicted.count == 3
