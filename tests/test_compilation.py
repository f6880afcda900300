"""Compilation is paid once: a second identical JAX run reads every program from JAX's
persistent compilation cache, and run.json counts the programs a run compiled. And no
step waits on the host: Keras runs the step-end callbacks of a JAX run off the main thread."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint
from bertkit.training.compilation import cache_folder
from bertkit.training.trainer import featurize

pytest.importorskip("jax", reason="the JAX backend is part of the dev install")

TRAIN_ON_JAX = """
import json, sys, threading
for name in ("tensorflow", "tensorflow_text"):
    sys.modules[name] = None  # a JAX-only machine: no TensorFlow, no export
import keras
import bertkit

class StepThreads(keras.callbacks.Callback):
    async_safe = True
    threads = set()
    def on_train_batch_end(self, batch, logs=None):
        self.threads.add(threading.current_thread() is threading.main_thread())

bertkit.finetune("r.yaml", features="features.npz", output_dir=sys.argv[1], verbose=2,
                 callbacks=[StepThreads()])
json.dump(sorted(StepThreads.threads), open(sys.argv[1] + "/step_threads.json", "w"))
"""


def test_a_second_identical_run_compiles_nothing(tmp_path):
    write_tiny_checkpoint(tmp_path / "ckpt", num_layers=1, hidden_size=16, intermediate_size=32)
    write_sentiment_tsv(tmp_path / "train.tsv", 48, seed=0)
    write_sentiment_tsv(tmp_path / "dev.tsv", 16, seed=1)
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({
        "schema": 1, "task": "classification",
        "backbone": {"preset": "./ckpt", "sequence_length": 32},
        "data": {"train": "train.tsv", "validation": "dev.tsv", "text": "sentence"},
        "training": {"epochs": 1, "batch_size": 16}, "output_dir": "run"}))
    featurize(tmp_path / "r.yaml", tmp_path / "features.npz")
    env = {**os.environ, "KERAS_BACKEND": "jax",
           "BERTKIT_COMPILATION_CACHE": str(tmp_path / "xla")}
    records = []
    for run in ("first", "second"):
        result = subprocess.run([sys.executable, "-c", TRAIN_ON_JAX, run], cwd=tmp_path,
                                env=env, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-2000:]
        records.append(json.loads((tmp_path / run / "run.json").read_text())["compilation"])
        assert "programs" in result.stdout.splitlines()[-1]
    first, second = records
    # bertkit's own step callbacks let Keras run every step-end hook on its callback
    # thread: the main thread never waits for a step's logs (no host sync per step)
    assert json.loads((tmp_path / "second" / "step_threads.json").read_text()) == [False]
    assert first["programs"] > 0 and first["from_cache"] == 0
    assert second["programs"] == first["programs"]  # train, evaluate, predict: each shape
    assert second["from_cache"] == second["programs"]  # ... read from the cache
    assert second["seconds"] <= 0.2 * first["seconds"], records
    assert any((tmp_path / "xla").iterdir())


def test_the_cache_folder_setting(monkeypatch, tmp_path):
    monkeypatch.setenv("BERTKIT_CACHE", str(tmp_path))
    monkeypatch.delenv("BERTKIT_COMPILATION_CACHE", raising=False)
    assert cache_folder("auto") == tmp_path / "xla"
    assert cache_folder(str(tmp_path / "mine")) == tmp_path / "mine"
    assert cache_folder("off") is None
    monkeypatch.setenv("BERTKIT_COMPILATION_CACHE", "off")
    assert cache_folder("auto") is None
    assert cache_folder(str(tmp_path / "mine")) == tmp_path / "mine"  # the recipe's wins
