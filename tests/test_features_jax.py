"""Featurize once with TensorFlow, then train from the file on JAX with TensorFlow blocked."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from bertkit.errors import UserError
from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint
from bertkit.training.trainer import featurize

pytest.importorskip("jax", reason="the JAX backend is part of the dev install")

TRAIN_WITHOUT_TENSORFLOW = """
import sys
for name in ("tensorflow", "tensorflow_text"):
    sys.modules[name] = None  # any import of TensorFlow now fails
import bertkit
bertkit.finetune("r.yaml", features="features.npz", verbose=0)
print(sorted(m for m, v in sys.modules.items() if m.startswith("tensorflow") and v is not None))
"""


def test_featurized_training_runs_on_jax_without_tensorflow(tmp_path):
    write_tiny_checkpoint(tmp_path / "ckpt")
    write_sentiment_tsv(tmp_path / "train.tsv", 64, seed=0)
    write_sentiment_tsv(tmp_path / "dev.tsv", 16, seed=1)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "schema": 1,
                "task": "classification",
                "backbone": {"preset": "./ckpt", "sequence_length": 32},
                "data": {"train": "train.tsv", "validation": "dev.tsv", "text": "sentence"},
                "training": {"epochs": 1, "batch_size": 16, "bucket_lengths": [32]},
                "output_dir": "run",
            }
        )
    )
    featurize(recipe, tmp_path / "features.npz")
    (tmp_path / "train.tsv").unlink()  # the data need not be where the features train
    (tmp_path / "dev.tsv").unlink()
    env = {**os.environ, "KERAS_BACKEND": "jax"}
    result = subprocess.run(
        [sys.executable, "-c", TRAIN_WITHOUT_TENSORFLOW],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert set(metrics["final"]["validation"]) == {"accuracy", "macro_f1", "mcc"}
    assert "export needs TensorFlow" in result.stderr


def featurized(tmp_path) -> dict:
    """A tiny classification recipe, featurized into `tmp_path / "f.npz"`."""
    write_tiny_checkpoint(tmp_path / "ckpt")
    write_sentiment_tsv(tmp_path / "train.tsv", 8)
    spec = {
        "schema": 1,
        "task": "classification",
        "backbone": {"preset": str(tmp_path / "ckpt"), "sequence_length": 32},
        "data": {"train": str(tmp_path / "train.tsv"), "text": "sentence"},
        "training": {"epochs": 1},
        "export": {"saved_model": False},
    }
    featurize(spec, tmp_path / "f.npz")
    return spec


def test_features_of_another_recipe_are_refused(tmp_path):
    import bertkit

    spec = featurized(tmp_path)
    spec["backbone"]["sequence_length"] = 64
    with pytest.raises(
        UserError,
        match="f.npz: was made from another recipe "
        r"\(sequence_length differs\)",
    ):
        bertkit.finetune(spec, features=tmp_path / "f.npz", output_dir=tmp_path / "run")


def test_a_features_file_trains_under_other_batch_options(tmp_path):
    # the rows do not depend on batch_size or bucket_lengths: no need to featurize again
    import bertkit

    spec = featurized(tmp_path)
    spec["training"].update(batch_size=4, bucket_lengths=[8])
    bertkit.finetune(spec, features=tmp_path / "f.npz", output_dir=tmp_path / "run", verbose=0)
    described = json.loads((tmp_path / "run" / "model" / "task.json").read_text())
    assert (described["batch_size"], described["bucket_lengths"]) == (4, [8, 32])
    steps = json.loads((tmp_path / "run" / "steps.json").read_text())["steps"]
    assert steps[-1]["step"] == 2  # 8 rows in batches of 4
