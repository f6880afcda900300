"""SIGTERM is a preemption: the run saves the step it is at, says so in one line, exits 143,
and the same command resumes it mid-epoch to the metrics and weights of an uninterrupted run.

The SIGTERMs here are real signals, sent by a callback at a chosen step (deterministic) or
by this test from outside; kill -9 after a step checkpoint is in tests/test_resume.py.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import yaml

import bertkit
from bertkit.errors import UserError
from bertkit.recipes.recipe import load_recipe
from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint
from bertkit.training import run_steps

STEPS = 15  # an epoch: 60 rows in batches of 4
TIMING = {"train_seconds", "eval_seconds"}


def write_recipe(folder, output: str, **training) -> str:
    path = folder / f"{output}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "schema": 1,
                "task": "classification",
                "backbone": {"preset": "ckpt", "sequence_length": 16},
                "data": {"train": "train.tsv", "validation": "dev.tsv", "text": "sentence"},
                "training": {
                    "epochs": 2,
                    "batch_size": 4,
                    "learning_rate": 3e-3,
                    "batch_order": "random",
                    **training,
                },
                "output_dir": output,
            }
        )
    )
    return str(path)


class SigtermAt(keras.callbacks.Callback):
    """Sends this process SIGTERM as step `step` (1-based) of epoch `epoch` (0-based) ends."""

    def __init__(self, epoch: int, step: int):
        super().__init__()
        self.at = (epoch, step)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch + 1) == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Data, a tiny checkpoint and an uninterrupted run (`reference/`)."""
    folder = tmp_path_factory.mktemp("preemption")
    write_tiny_checkpoint(folder / "ckpt", num_layers=1, hidden_size=16, intermediate_size=32)
    write_sentiment_tsv(folder / "train.tsv", 60, seed=0)
    write_sentiment_tsv(folder / "dev.tsv", 16, seed=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            run_steps, "export_run", lambda run, finetuned, export=None: None
        )  # not compared
        bertkit.finetune(write_recipe(folder, "reference"), verbose=0)
    return folder


def metrics(run) -> dict:
    recorded = json.loads((run / "metrics.json").read_text())
    epochs = [{k: v for k, v in epoch.items() if k not in TIMING} for epoch in recorded["epochs"]]
    return {"epochs": epochs, "final": recorded["final"]}


def weights(run) -> list:
    import h5py

    arrays = []
    with h5py.File(run / "model" / "model.weights.h5") as file:
        file.visititems(
            lambda name, item: arrays.append((name, item[()])) if hasattr(item, "shape") else None
        )
    return arrays


def checkpoint_at(run) -> tuple[int, int]:
    committed = json.loads((run / "checkpoint" / "training_metadata.json").read_text())
    return committed["epoch"], committed["step"]


def test_sigterm_mid_epoch_saves_the_step_and_the_run_resumes_exactly(folder, monkeypatch, capsys):
    from bertkit.cli import main

    monkeypatch.setattr(run_steps, "export_run", lambda run, finetuned, export=None: None)
    monkeypatch.chdir(folder)
    recipe, run = write_recipe(folder, "stopped"), folder / "stopped"
    finetune, handler = bertkit.finetune, signal.getsignal(signal.SIGTERM)

    # the command, stopped as step 7 of epoch 1 ends
    monkeypatch.setattr(
        bertkit,
        "finetune",
        lambda *args, **kwargs: finetune(*args, callbacks=[SigtermAt(0, 7)], **kwargs),
    )
    capsys.readouterr()
    assert main(["finetune", recipe]) == 143
    assert capsys.readouterr().err == (
        "bertkit: stopped by SIGTERM at epoch 1 step 7; run the same command again to resume\n"
    )
    assert checkpoint_at(run) == (0, 7)
    monkeypatch.setattr(bertkit, "finetune", finetune)

    # resumed at that step, stopped again in its second fit (epoch 2); the API raises
    with pytest.raises(bertkit.Preempted) as stopped:
        bertkit.finetune(recipe, verbose=0, callbacks=[SigtermAt(1, 4)])
    assert (str(stopped.value), stopped.value.code) == ("stopped by SIGTERM at epoch 2 step 4", 143)
    assert isinstance(stopped.value, SystemExit)  # `except Exception` does not swallow it
    assert checkpoint_at(run) == (1, 4)
    assert signal.getsignal(signal.SIGTERM) is handler  # the one before comes back

    bertkit.finetune(recipe, verbose=0)
    assert "resuming" in capsys.readouterr().err
    expected, got = metrics(folder / "reference"), metrics(run)
    assert got == expected  # every epoch's loss, accuracy, validation metrics: exactly
    for (name, a), (_, b) in zip(weights(folder / "reference"), weights(run), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=name)
    steps = [json.loads((path / "steps.json").read_text()) for path in (folder / "reference", run)]
    assert steps[0] == steps[1]  # the loss records of the interrupted epochs are kept


def test_sigterm_from_outside_exits_143_with_one_line_and_a_checkpoint(folder):
    recipe = write_recipe(folder, "killed", epochs=30, checkpoint_every_steps=5)
    process = subprocess.Popen(
        [sys.executable, "-m", "bertkit.cli", "finetune", recipe],
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    committed = folder / "killed" / "checkpoint" / "training_metadata.json"
    deadline = time.time() + 120
    while not committed.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 143
    stderr = process.stderr.read()
    assert re.fullmatch(
        r"bertkit: stopped by SIGTERM (at epoch \d+ step \d+|after epoch \d+); "
        r"run the same command again to resume\n",
        stderr,
    ), stderr
    epoch, step = checkpoint_at(folder / "killed")
    assert f"epoch {epoch + 1} step {step}" in stderr or f"after epoch {epoch}" in stderr
    assert json.loads((folder / "killed" / "run.json").read_text())["status"] == "running"


def test_checkpoint_every_minutes_saves_mid_epoch(tmp_path):
    from bertkit.training.checkpointing import RunCheckpoint

    now = [0.0]
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    checkpoint = RunCheckpoint(tmp_path, every_minutes=1.5, clock=lambda: now[0])
    checkpoint.set_model(model)
    checkpoint.set_params({"epochs": 2, "steps": 10})
    checkpoint.on_train_begin()
    checkpoint.on_epoch_begin(0)
    checkpoint.on_train_batch_begin(1)
    now[0] = 91.0
    checkpoint.on_train_batch_begin(2)
    committed = json.loads((tmp_path / "training_metadata.json").read_text())
    assert (committed["epoch"], committed["step"]) == (0, 2)
    checkpoint.on_train_batch_begin(3)  # the minutes count again from that checkpoint
    assert json.loads((tmp_path / "training_metadata.json").read_text())["step"] == 2


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("checkpoint_every_steps=0", "training.checkpoint_every_steps: must be at least 1, got 0"),
        (
            "checkpoint_every_steps=often",
            "training.checkpoint_every_steps: expected an integer, got 'often'",
        ),
        (
            "checkpoint_every_minutes=0",
            "training.checkpoint_every_minutes: must be greater than 0.0, got 0.0",
        ),
        (
            "checkpoint_every=5",
            "training.checkpoint_every: unknown key 'checkpoint_every'; "
            "did you mean 'checkpoint_every_steps'?",
        ),
    ],
)
def test_checkpoint_every_is_checked_with_one_line_naming_the_key(setting, message):
    recipe = {
        "schema": 1,
        "task": "classification",
        "backbone": {"preset": "bert_tiny_en_uncased"},
        "data": {"train": "train.tsv"},
    }
    with pytest.raises(UserError) as error:
        load_recipe(recipe, [f"training.{setting}"])
    assert str(error.value) == f"--set: {message}"


def test_a_job_without_jax_preemption_service_trains_on(monkeypatch):
    # `jax_enable_preemption_service` off: no sync point to ask for, so SIGTERM keeps its
    # default in the job, and training is not stopped by the question
    pytest.importorskip("jax", reason="the JAX backend is part of the dev install")
    from jax.experimental import multihost_utils

    from bertkit.training.preemption import JobSigtermWatch

    asked = []

    def disabled(step):
        asked.append(step)
        raise RuntimeError("Preemption sync manager has not been initialized.")

    monkeypatch.setattr(multihost_utils, "reached_preemption_sync_point", disabled)
    watch = JobSigtermWatch()
    assert [watch.stop_at(step) for step in range(3)] == [False] * 3 and asked == [0]
