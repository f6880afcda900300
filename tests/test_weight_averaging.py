"""Averaging the last epochs' weights (`training.average_last_epochs`): the kept model is
the mean of the weights at the end of the epochs ending at the best one, through a kill and
resume too; with `training.layer_lr_decay` on (docs: training/small-data.md)."""

import contextlib
import io
import json

import keras
import numpy as np
import pytest

import bertkit
from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint
from bertkit.training import run_steps


class Snapshots(keras.callbacks.Callback):
    """The trained weights at each epoch's end ({path: value}); stops (Ctrl-C) before step
    `stop_at` (epoch, step; 0-based)."""

    def __init__(self, stop_at=None):
        super().__init__()
        self.epochs, self.stop_at, self.epoch = [], stop_at, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch, batch) == self.stop_at:
            raise KeyboardInterrupt

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append({v.path: np.array(v.numpy()) for v in floating(self.model)})


def floating(model) -> list:
    return [v for v in model.weights if np.dtype(v.dtype).kind == "f"]


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    folder = tmp_path_factory.mktemp("averaging")
    write_tiny_checkpoint(folder / "ckpt", num_layers=2, hidden_size=16, num_heads=2)
    write_sentiment_tsv(folder / "train.tsv", 32)
    write_sentiment_tsv(folder / "dev.tsv", 16, seed=1)
    return folder, {
        "schema": 1,
        "task": "classification",
        "backbone": {"preset": str(folder / "ckpt"), "sequence_length": 16},
        "data": {
            "train": str(folder / "train.tsv"),
            "validation": str(folder / "dev.tsv"),
            "text": "sentence",
        },
        "training": {
            "epochs": 3,
            "batch_size": 8,
            "learning_rate": 1e-3,
            "average_last_epochs": 2,
            "layer_lr_decay": 0.8,
            "checkpoint_every_steps": 2,
        },
        "export": {"saved_model": False},
    }


@pytest.fixture(scope="module")
def uninterrupted(spec):
    folder, recipe = spec
    snapshots = Snapshots()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run_steps, "export_run", lambda *args, **kwargs: None)
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            finetuned = bertkit.finetune(
                recipe, output_dir=folder / "run", verbose=0, callbacks=[snapshots]
            )
    run = json.loads((folder / "run" / "run.json").read_text())
    return finetuned, snapshots.epochs, run, printed.getvalue()


def test_the_kept_model_is_the_mean_of_the_epochs_ending_at_the_best(uninterrupted):
    finetuned, epochs, run, _ = uninterrupted
    best = run["best_epoch"]
    assert run["averaged_epochs"] == list(range(max(1, best - 1), best + 1))
    kept = {v.path: v.numpy() for v in floating(finetuned.model)}
    assert kept.keys() == epochs[0].keys()
    window = [epochs[epoch - 1] for epoch in run["averaged_epochs"]]
    for path, value in kept.items():
        assert np.allclose(value, np.mean([w[path] for w in window], axis=0), atol=1e-6), path
    if len(window) > 1:  # not the last epoch's weights: the mean differs from each
        moved = [np.abs(kept[path] - window[-1][path]).max() for path in kept]
        assert max(moved) > 1e-4


def test_a_killed_and_resumed_run_averages_as_the_uninterrupted_one(spec, uninterrupted, capsys):
    folder, recipe = spec
    finetuned, _, run, _ = uninterrupted
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run_steps, "export_run", lambda *args, **kwargs: None)
        with pytest.raises(KeyboardInterrupt):  # mid-epoch 3, after a checkpoint of it
            bertkit.finetune(
                recipe, output_dir=folder / "resumed", verbose=0, callbacks=[Snapshots((2, 3))]
            )
        assert sorted(p.name for p in (folder / "resumed/checkpoint/averaged").iterdir()) == [
            "epoch-1.npz",
            "epoch-2.npz",
        ]
        resumed = bertkit.finetune(recipe, output_dir=folder / "resumed", verbose=0)
    assert "resuming" in capsys.readouterr().err
    again = json.loads((folder / "resumed" / "run.json").read_text())
    assert again["averaged_epochs"] == run["averaged_epochs"]
    for mine, theirs in zip(floating(resumed.model), floating(finetuned.model), strict=True):
        assert np.allclose(mine.numpy(), theirs.numpy(), atol=1e-5), mine.path


def test_the_average_is_said_in_one_line(uninterrupted):
    _, _, run, printed = uninterrupted
    best = run["best_epoch"]
    span = f"epochs {best - 1}-{best}" if best > 1 else "epoch 1"
    assert [line for line in printed.splitlines() if "mean of the" in line] == [
        f"the model is the mean of the weights at the end of {span} "
        f"(training.average_last_epochs), ending at the best epoch, {best}"
    ]
