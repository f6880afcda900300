"""A run killed mid-epoch resumes from its last checkpoint and ends as an uninterrupted run
(LoRA's too).

The runs here checkpoint every 5 steps too (`training.checkpoint_every_steps`): the kill
(the run's own, before a chosen step: tests/signal_at_step.py) comes after a step
checkpoint of epoch 2, and the resumed run starts in the middle of it.
SIGTERM: tests/test_preemption.py.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint
from tests.test_long_documents import write_documents
from tests.test_multiple_choice import CSQA_KEYS, questions, write_questions
from tests.test_regression import write_scored_tsv

# task -> (the recipe's task, its data keys, the files' suffix, what writes count rows)
TASKS = {
    "classification": ("classification", {"text": "sentence"}, "tsv", write_sentiment_tsv),
    "regression": ("regression", {"text": "sentence", "label": "score"}, "tsv", write_scored_tsv),
    "windows": (
        {"name": "classification", "long_text": "windows", "window_stride": 4},
        {},
        "tsv",
        write_documents,
    ),
    "multiple_choice": (
        "multiple_choice",
        CSQA_KEYS,
        "jsonl",
        lambda path, count, seed: write_questions(path, questions(count, seed)),
    ),
}


def write_recipe(tmp_path, output, task="classification", **training):
    path = tmp_path / f"{output}.yaml"
    name, keys, suffix, _ = TASKS[task]
    path.write_text(
        yaml.safe_dump(
            {
                "schema": 1,
                "task": name,
                # windows: 14 pieces every 4 over texts of 17-21 (2-3 windows)
                "backbone": {"preset": "ckpt", "sequence_length": 16 if task == "windows" else 32},
                "data": {"train": f"train.{suffix}", "validation": f"dev.{suffix}", **keys},
                "training": {"epochs": 3, "batch_size": 4, "learning_rate": 1e-3, **training},
                "export": {"saved_model": False},  # (a JAX run's is a TensorFlow child process)
                "output_dir": output,
            }
        )
    )
    return path


SIGNAL_AT_STEP = Path(__file__).with_name("signal_at_step.py")


def finetune(recipe, kill_at: tuple[int, int] | None = None, env=None):
    """`bertkit finetune recipe`, killed (-9) before step `kill_at` (epoch, step; 0-based)."""
    env = dict(env or os.environ)
    if kill_at:
        env["BERTKIT_TEST_SIGNAL"] = "SIGKILL,{},{}".format(*kill_at)
    return subprocess.Popen(
        [sys.executable, str(SIGNAL_AT_STEP), "finetune", str(recipe)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_kill_9_mid_epoch_then_resume_gives_the_same_metrics(tmp_path):
    # Packed batches: the backup holds the packed training model's optimizer, the best
    # weights the task model's (the JAX run below covers unpacked batches). LoRA: the
    # resumed run trains on from the adapters' saved factors (Keras' own LoRA saving would
    # merge them into the kernel and start them afresh at zero).
    kill_9_mid_epoch_then_resume(
        tmp_path,
        training={
            "batch_order": "random",
            "packing": True,
            "lora": {"rank": 4, "alpha": 8, "targets": ["query", "value", "intermediate"]},
            "learning_rate": 1e-2,  # (at 1e-3 the frozen tiny backbone learns nothing)
        },
    )


def test_kill_9_mid_epoch_then_resume_on_jax(tmp_path):
    pytest.importorskip("jax", reason="the JAX backend is part of the dev install")
    kill_9_mid_epoch_then_resume(tmp_path, env={**os.environ, "KERAS_BACKEND": "jax"})


def test_kill_9_mid_epoch_then_resume_a_regression(tmp_path):
    # the target statistics come from the training data again, and the scores match
    kill_9_mid_epoch_then_resume(tmp_path, task="regression")


def test_kill_9_mid_epoch_then_resume_long_documents_in_windows(tmp_path):
    kill_9_mid_epoch_then_resume(tmp_path, task="windows")


def test_kill_9_mid_epoch_then_resume_a_multiple_choice_run_with_lora(tmp_path):
    lora = {"rank": 4, "alpha": 8, "targets": ["query", "value"]}
    kill_9_mid_epoch_then_resume(tmp_path, task="multiple_choice", training={"lora": lora})


def kill_9_mid_epoch_then_resume(tmp_path, training=None, env=None, task="classification"):
    # 15 steps an epoch (60 rows, batches of 4), a checkpoint every 5: killed before step
    # 13 of epoch 2, the run resumes after its step 10 and does steps 11-13 again
    training = {"checkpoint_every_steps": 5, **(training or {})}
    write_tiny_checkpoint(tmp_path / "ckpt")
    _, _, suffix, write_rows = TASKS[task]
    write_rows(tmp_path / f"train.{suffix}", 60, seed=0)
    write_rows(tmp_path / f"dev.{suffix}", 40, seed=1)
    reference = finetune(write_recipe(tmp_path, "uninterrupted", task, **training), env=env)

    interrupted_recipe = write_recipe(tmp_path, "interrupted", task, **training)
    killed = finetune(interrupted_recipe, kill_at=(1, 12), env=env)
    assert killed.wait(timeout=240) == -signal.SIGKILL, killed.stderr.read()[-3000:]
    status = json.loads((tmp_path / "interrupted" / "run.json").read_text())["status"]
    assert status == "running"

    resumed = finetune(interrupted_recipe, env=env)
    assert resumed.wait(timeout=240) == 0, resumed.stderr.read()
    assert "resuming" in (err := resumed.stderr.read()) and " at epoch 2 step 10" in err, err
    assert reference.wait(timeout=240) == 0

    def final(name):
        return json.loads((tmp_path / name / "metrics.json").read_text())

    expected, got = final("uninterrupted"), final("interrupted")
    assert [e["epoch"] for e in got["epochs"]] == [1, 2, 3]
    for a, b in zip(expected["epochs"], got["epochs"], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)
        assert any(key.startswith("val_") for key in a)
        for key in (key for key in a if key.startswith("val_")):
            assert a[key] == pytest.approx(b[key]), key
    assert got["final"]["validation"] == pytest.approx(expected["final"]["validation"])

    def step_losses(name):
        steps = json.loads((tmp_path / name / "steps.json").read_text())["steps"]
        return [step["loss"] for step in steps]

    # step by step: an epoch's mean would hide a resumed run that trains differently (LoRA
    # factors started afresh change the loss from step 27 on by about 1e-3)
    assert step_losses("interrupted") == pytest.approx(step_losses("uninterrupted"), rel=1e-5)
    assert (tmp_path / "interrupted" / "model" / "model.weights.h5").is_file()
    if "lora" in training:
        assert (tmp_path / "interrupted" / "model" / "lora.weights.h5").is_file()
    assert not (tmp_path / "interrupted" / "saved_model").exists()  # export.saved_model: false


def test_checkpoint_files_are_replaced_whole(tmp_path, monkeypatch):
    import keras

    from bertkit.training.callbacks import save_weights_atomically

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    target = tmp_path / "model.weights.h5"
    save_weights_atomically(model, target)
    before = target.read_bytes()

    def killed_mid_write(model, path, *args, **kwargs):
        Path(path).write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(keras.saving, "save_weights", killed_mid_write)
    with pytest.raises(KeyboardInterrupt):
        save_weights_atomically(model, target)
    assert target.read_bytes() == before  # the last good checkpoint is untouched


def tiny_model():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def weights_of(model):
    import keras

    return [keras.ops.convert_to_numpy(w) for w in model.weights]


def test_checkpoint_weights_and_position_are_committed_together(tmp_path, monkeypatch):
    from bertkit.training import checkpointing

    def restored():
        fresh = tiny_model()
        restore = checkpointing.RunCheckpoint(tmp_path / "checkpoint")
        restore.set_model(fresh)
        restore.on_train_begin()
        return restore.position, weights_of(fresh)

    trained = tiny_model()
    backup = checkpointing.RunCheckpoint(tmp_path / "checkpoint")
    backup.set_model(trained)
    backup.on_epoch_end(0)
    after_epoch_1 = weights_of(trained)
    trained.layers[0].kernel.assign(trained.layers[0].kernel + 1.0)  # epoch 2 trains

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpointing, "write_json", killed)  # killed before epoch 2's commit
    with pytest.raises(KeyboardInterrupt):
        backup.on_epoch_end(1)
    monkeypatch.undo()
    position, got = restored()
    assert position == (1, 0)
    for a, b in zip(got, after_epoch_1, strict=True):
        np.testing.assert_array_equal(a, b)

    backup.on_epoch_end(1)  # committed this time; the older weights file is removed
    position, got = restored()
    assert position == (2, 0) and np.array_equal(got[0], weights_of(trained)[0])
    assert [p.name for p in (tmp_path / "checkpoint").glob("*.weights.h5")] == [
        "epoch-2-step-0.weights.h5"
    ]


def test_the_last_epoch_is_not_backed_up(tmp_path):
    from bertkit.training.checkpointing import RunCheckpoint

    backup = RunCheckpoint(tmp_path / "checkpoint")
    backup.set_model(tiny_model())
    backup.set_params({"epochs": 2})
    backup.on_epoch_end(0)
    assert [p.name for p in (tmp_path / "checkpoint").glob("*.weights.h5")] == [
        "epoch-1-step-0.weights.h5"
    ]
    backup.on_epoch_end(1)  # training ends here: the run then records itself trained
    assert [p.name for p in (tmp_path / "checkpoint").glob("*.weights.h5")] == [
        "epoch-1-step-0.weights.h5"
    ]
