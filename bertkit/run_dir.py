"""The run directory: what a fine-tuning run writes, and the rules for reusing one.

Layout::

    recipe.yaml          the fully resolved recipe
    run.json             status (running / finished) and the best epoch
    model/               backbone architecture, tokenizer, task.json, model.weights.h5 (best)
    checkpoint/          last finished epoch (weights, optimizer, epoch) for resuming
    metrics.json         metrics per epoch and final evaluation
    logs/                TensorBoard
    report.md, learning_curve.png
    saved_model/         raw-text TensorFlow SavedModel

A finished run is never overwritten without `overwrite=True`; an unfinished run
of the same recipe is resumed; a folder that is not a run directory is never
touched. A run replaced with `overwrite=True` is moved aside to
`.<name>.replaced` until the new run finishes, and moved back if the new run
stops on a user error.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from bertkit.errors import UserError

RUNNING, FINISHED = "running", "finished"


def write_json(path, value) -> None:
    """Writes JSON atomically: a crash never leaves a half-written file."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "w") as file:
        json.dump(value, file, indent=2)
    os.replace(temporary, path)


def read_json(path, what: str = "file"):
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"missing {what}", source=path) from None
    except json.JSONDecodeError as error:
        raise UserError(f"corrupt {what}: {error.msg}", source=path, line=error.lineno) from None


class RunDirectory:
    """Paths inside one run directory."""

    def __init__(self, path):
        self.path = Path(path)
        self.model_dir = self.path / "model"
        self.checkpoint_dir = self.path / "checkpoint"
        self.saved_model_dir = self.path / "saved_model"
        self.logs_dir = self.path / "logs"
        self.run_file = self.path / "run.json"
        self.recipe_file = self.path / "recipe.yaml"
        self.metrics_file = self.path / "metrics.json"
        self.weights_file = self.model_dir / "model.weights.h5"
        self.task_file = self.model_dir / "task.json"

    @classmethod
    def open(cls, path) -> RunDirectory:
        """An existing run directory with a trained model (for evaluate, predict, export)."""
        run = cls(path)
        if not run.path.is_dir():
            raise UserError("run directory not found", source=run.path)
        if not run.task_file.exists() or not run.weights_file.exists():
            raise UserError("not a bertkit run directory with a trained model (no "
                            "model/task.json or model/model.weights.h5)", source=run.path)
        return run

    @property
    def replaced_dir(self) -> Path:
        """Where `overwrite` keeps the previous run until the new one finishes."""
        return self.path.with_name(f".{self.path.name}.replaced")

    def status(self) -> str | None:
        """`running` or `finished`; None when the folder holds no bertkit run."""
        if not self.run_file.is_file() or not self.recipe_file.is_file():
            return None
        try:
            run = json.loads(self.run_file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None
        if not isinstance(run, dict) or run.get("status") not in (RUNNING, FINISHED):
            return None
        return run["status"]

    def prepare(self, recipe_yaml: str, overwrite: bool) -> bool:
        """Creates or checks the directory for a run; returns True when resuming.

        With `overwrite`, a previous run is moved to `replaced_dir`: `drop_replaced`
        deletes it once the new run has finished, `restore_replaced` puts it back.
        """
        if self.path.exists() and not self.path.is_dir():
            raise UserError("output path exists and is not a folder", source=self.path)
        if self.path.is_dir() and any(self.path.iterdir()):
            status = self.status()
            if status is None:
                raise UserError("output folder exists and is not a bertkit run directory; "
                                "choose another output_dir", source=self.path)
            if overwrite:
                self._move_aside()
            elif status == FINISHED:
                raise UserError("holds a finished run; pass --overwrite (overwrite=True) to "
                                "replace it, or choose another output folder", source=self.path)
            elif self.recipe_file.read_text() != recipe_yaml:
                raise UserError("holds an unfinished run of a different recipe; pass "
                                "--overwrite to start over, or choose another output folder",
                                source=self.path)
            else:
                return True
        self.model_dir.mkdir(parents=True, exist_ok=True)
        self.recipe_file.write_text(recipe_yaml)
        self.set_status(RUNNING)
        return False

    def _move_aside(self) -> None:
        if self.replaced_dir.exists():
            # An earlier overwrite was interrupted: the run kept aside is the one to
            # restore; the folder holds that unfinished replacement.
            shutil.rmtree(self.path)
        else:
            os.replace(self.path, self.replaced_dir)

    def restore_replaced(self) -> None:
        """Puts back the run that `overwrite` moved aside (the new run failed)."""
        if self.replaced_dir.is_dir():
            if self.path.exists():
                shutil.rmtree(self.path)
            os.replace(self.replaced_dir, self.path)

    def drop_replaced(self) -> None:
        """Deletes the run that `overwrite` moved aside (the new run finished)."""
        if self.replaced_dir.is_dir():
            shutil.rmtree(self.replaced_dir)

    def set_status(self, status: str, **extra) -> None:
        current = read_json(self.run_file) if self.run_file.exists() else {}
        write_json(self.run_file, {**current, "status": status, **extra})

    def resumed_epoch(self) -> int:
        """Epochs finished before an interruption (0 for a fresh run)."""
        metadata = self.checkpoint_dir / "training_metadata.json"
        return int(read_json(metadata)["epoch"]) if metadata.exists() else 0
