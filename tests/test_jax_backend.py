"""KERAS_BACKEND=jax trains every kind of task straight from its data files.

TensorFlow and tf-text tokenize (and decode tagging and span QA) in the same
process; model, loss and optimizer run on JAX. The run ends complete: its
SavedModel, exported by a TensorFlow child process from the best weights,
answers in a fresh process as the JAX model predicts.

That export is the same `bertkit export` for every task (the task's own export is tested
on TensorFlow in its test file), so only the classification run exports here: each export
is a TensorFlow start-up, a model build and a trace. Tagging and span QA train on one
bucket length for the same reason (each shape is a JAX compilation).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from bertkit.testing import serve_in_fresh_process, write_sentiment_tsv, write_tiny_checkpoint
from tests.test_span_qa import qa_lines, write_lines
from tests.test_tagging import write_conll

pytest.importorskip("jax", reason="the JAX backend is part of the dev install")

INPUTS = {
    "classification": ["a warm and funny film", "dull"],
    "tagging": ["mr john visited paris", "the film was ok"],
    "span_qa": [{"question": "what is it ?", "context": "the film was good and fun"}],
}

TRAIN_ON_JAX = """
import json, sys
import keras
import bertkit
assert keras.backend.backend() == "jax"
from bertkit.training import run_steps
inputs = json.loads(sys.argv[1])
export_run = run_steps.export_run
predictions = {}
for task in inputs:
    run_steps.export_run = export_run if task == "classification" else lambda *args: None
    bertkit.finetune(f"{task}.yaml", verbose=0)
    predictions[task] = bertkit.load(f"{task}_run").predict(inputs[task])
print(json.dumps(predictions))
"""


def recipes(folder) -> dict:
    write_sentiment_tsv(folder / "train.tsv", 48, seed=0)
    write_sentiment_tsv(folder / "dev.tsv", 12, seed=1)
    write_conll(folder / "train.txt", 48, seed=0)
    write_conll(folder / "dev.txt", 12, seed=1)
    write_lines(folder / "train.jsonl", qa_lines(32, seed=1))
    write_lines(folder / "dev.jsonl", qa_lines(9, seed=2))
    common = {"schema": 1, "backbone": {"preset": "./ckpt", "sequence_length": 32}}
    training = {"epochs": 1, "batch_size": 8, "learning_rate": 3e-3}
    packed = {"batch_order": "random", "packing": True}  # (the resume test runs unpacked)
    return {
        "classification": {
            **common,
            "task": "classification",
            "training": packed,
            "data": {"train": "train.tsv", "validation": "dev.tsv", "text": "sentence"},
        },
        "tagging": {
            **common,
            "task": {"name": "tagging", "window_stride": 10},
            "training": {**packed, "bucket_lengths": [32]},
            "data": {"train": "train.txt", "validation": "dev.txt", "scheme": "iob1"},
        },
        "span_qa": {
            **common,
            "task": {"name": "span_qa", "version": "2.0", "max_query_length": 8, "doc_stride": 8},
            # LoRA on JAX (tests/test_lora.py trains it on TensorFlow)
            "training": {"bucket_lengths": [32], "lora": {"rank": 2, "alpha": 4}},
            "data": {"train": "train.jsonl", "validation": "dev.jsonl"},
        },
    }, training


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("jax")
    write_tiny_checkpoint(folder / "ckpt")
    specs, training = recipes(folder)
    for task, spec in specs.items():
        spec = {
            **spec,
            "training": {**training, **spec.get("training", {})},
            "output_dir": f"{task}_run",
        }
        (folder / f"{task}.yaml").write_text(yaml.safe_dump(spec))
    env = {**os.environ, "KERAS_BACKEND": "jax"}
    result = subprocess.run(
        [sys.executable, "-c", TRAIN_ON_JAX, json.dumps(INPUTS)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return folder, json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("task", list(INPUTS))
def test_jax_run_is_complete(runs, task):
    folder, predictions = runs
    run = folder / f"{task}_run"
    metrics = json.loads((run / "metrics.json").read_text())
    assert [epoch["epoch"] for epoch in metrics["epochs"]] == [1]
    assert all(
        f"val_{metrics['monitor'].removeprefix('val_')}" in epoch for epoch in metrics["epochs"]
    )
    assert metrics["final"]["validation"]
    status = json.loads((run / "run.json").read_text())
    assert status["status"] == "finished" and status["best_epoch"] == 1
    assert (run / "model" / "model.weights.h5").is_file()
    assert not (run / "checkpoint").exists()
    assert list((run / "logs").glob("train/events.*"))  # TensorBoard, through tf.summary
    assert (run / "report.md").is_file()
    assert (run / "saved_model" / "saved_model.pb").is_file() == (task == "classification")
    assert len(predictions[task]) == len(INPUTS[task])
    lora = json.loads((run / "model" / "task.json").read_text()).get("lora")
    assert (
        (lora is not None) == (task == "span_qa") == (run / "model" / "lora.weights.h5").is_file()
    )
    if lora:  # the adapters and the head trained, the backbone's own weights did not
        assert 0 < lora["trainable_weights"] < lora["weights"] / 5, lora


def test_the_saved_model_serves_what_jax_predicted(runs):
    folder, predictions = runs
    texts = INPUTS["classification"]
    served = serve_in_fresh_process(folder / "classification_run" / "saved_model", {"text": texts})
    assert served["label"] == [p["label"] for p in predictions["classification"]]
    np.testing.assert_allclose(
        served["score"], [p["score"] for p in predictions["classification"]], atol=1e-4
    )
