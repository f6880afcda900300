"""The run directory: what a fine-tuning run writes, and the rules for reusing one.

Layout::

    recipe.yaml          the fully resolved recipe
    run.json             status (running / finished) and the best epoch
    model/               backbone architecture, tokenizer, task.json, model.weights.h5 (best)
    checkpoint/          last checkpoint (weights, optimizer, epoch and step) for resuming
    metrics.json         metrics per epoch and final evaluation
    steps.json           training loss and learning rate per logged step
    logs/                TensorBoard
    report.md, learning_curve.png, README.md (model card), the task's report files
    saved_model/         raw-text TensorFlow SavedModel
    .lock                held (flock) by the finetune writing the run; names its process

A run directory may come from someone else, so what it holds is data, never a choice
of files: the files it is loaded from must lie inside it (no link out), what bertkit
writes into it replaces links instead of writing through them, and the data files
`model/task.json` names are read by default only for a run that this user's bertkit
wrote (`is_written_here`); another run's are resolved against the run and must stay
inside it.

A finished run is never overwritten without `overwrite=True`; an unfinished run
of the same recipe is resumed; a folder that is not a run directory is never
touched. A run replaced with `overwrite=True` is moved aside to
`.<name>.replaced` until the new run finishes, and moved back if the new run
stops on a user error.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from bertkit.errors import UserError
from bertkit.run_lock import exclusive_lock, outermost_missing

RUNNING, FINISHED = "running", "finished"
LOCK_FILE = ".lock"


def write_json(path, value) -> None:
    """Writes JSON atomically: a crash never leaves a half-written file, and a failed write
    (a full disk) no temporary file; its `OSError` names `path`."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(handle, 0o666 & ~_umask())  # mkstemp's 0600 would hide a shared run
        with os.fdopen(handle, "w") as file:
            json.dump(value, file, indent=2)
        os.replace(temporary, path)
    except OSError as error:
        Path(temporary).unlink(missing_ok=True)
        raise OSError(error.errno, error.strerror, str(path)) from None


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def read_json(path, what: str = "file"):
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"missing {what}", source=path) from None
    except json.JSONDecodeError as error:
        raise UserError(f"corrupt {what}: {error.msg}", source=path, line=error.lineno) from None
    except ValueError as error:  # not UTF-8, or a number of more than 4300 digits
        raise UserError(f"corrupt {what}: {error}", source=path) from None


def user_cache_dir() -> Path:
    """bertkit's cache folder: `$BERTKIT_CACHE`, else `~/.cache/bertkit`."""
    return Path(os.environ.get("BERTKIT_CACHE", Path.home() / ".cache" / "bertkit"))


def _written_record(task_file: Path) -> Path | None:
    """Where the digest of a task description this user's bertkit wrote is recorded."""
    try:
        digest = hashlib.sha256(task_file.read_bytes()).hexdigest()
    except OSError:
        return None
    return user_cache_dir() / "written-runs" / digest


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
        self._made = None  # while `lock` is held: (outermost folder it made, entries before)

    @classmethod
    def open(cls, path) -> RunDirectory:
        """An existing run directory with a trained model (for evaluate, predict, export)."""
        run = cls(path)
        if not run.path.is_dir():
            raise UserError("run directory not found", source=run.path)
        if not run.task_file.exists() or not run.weights_file.exists():
            raise UserError(
                "not a bertkit run directory with a trained model (no "
                "model/task.json or model/model.weights.h5)"
                f"{run.replaced_hint()}",
                source=run.path,
            )
        for entry in [run.model_dir, *run.model_dir.iterdir()]:
            run.inside(entry, entry)
        return run

    def inside(self, path: Path, named, key: str | None = None, hint: str = "") -> Path:
        """`path` resolved, which must lie inside the run (after links); the error names
        `named` (the file, or the `task.json` that names it under `key`)."""
        resolved = Path(path).resolve()
        if not resolved.is_relative_to(self.path.resolve()):
            raise UserError(
                f"leads outside the run directory (to {resolved}); a run "
                f"directory from elsewhere does not choose files to read{hint}",
                source=named,
                key=key,
            )
        return resolved

    def write_task_description(self, description: dict) -> None:
        """Writes `model/task.json` and records it as written by this user's bertkit."""
        write_json(self.task_file, description)
        record = _written_record(self.task_file)
        with contextlib.suppress(OSError):  # no cache folder: data files then need --data
            record.parent.mkdir(parents=True, exist_ok=True)
            record.touch()

    def is_written_here(self) -> bool:
        """Whether this user's bertkit wrote the run's `model/task.json` as it is now."""
        record = _written_record(self.task_file)
        return record is not None and record.exists()

    def data_file(self, value: str, key: str) -> Path:
        """A data file `model/task.json` names (`key`, e.g. `data.validation`).

        Relative names are resolved against the run. A run this user's bertkit wrote
        names the recipe's files, which may lie anywhere; any other run only files
        inside itself.
        """
        path = self.path / value
        if self.is_written_here():
            return path
        return self.inside(path, self.task_file, key, hint="; pass --data FILE")

    def replace_folder(self, name: str, fill) -> Path:
        """Writes `name` in the run afresh: `fill(folder)` writes into a new folder that
        then takes the place of the old one (a link there is replaced, not followed)."""
        target = self.path / name
        fresh = Path(tempfile.mkdtemp(dir=self.path, prefix=f".{name}.new-"))
        try:
            fill(fresh)
            if target.is_symlink() or target.exists():
                old = Path(tempfile.mkdtemp(dir=self.path, prefix=f".{name}.old-"))
                os.replace(target, old / name)
                shutil.rmtree(old)  # removes links without following them
            os.replace(fresh, target)
        finally:
            shutil.rmtree(fresh, ignore_errors=True)
        return target

    @property
    def replaced_dir(self) -> Path:
        """Where `overwrite` keeps the previous run until the new one finishes."""
        return self.path.with_name(f".{self.path.name}.replaced")

    def replaced_hint(self) -> str:
        """For errors about the folder: where an interrupted `overwrite` left the old run."""
        if not self.replaced_dir.is_dir():
            return ""
        return (
            f"; the run it replaces is kept in {self.replaced_dir} (an overwrite was "
            "interrupted: run it again to finish it, or move that folder's files back)"
        )

    def status(self) -> str | None:
        """`running` or `finished`; None when the folder holds no bertkit run.

        A damaged `run.json` beside a `recipe.yaml` is a `UserError` naming the file
        and line: the folder is a run, and `overwrite` does not replace what it cannot read.
        """
        if not self.run_file.is_file() or not self.recipe_file.is_file():
            return None
        run = read_json(self.run_file, "run status file")
        if not isinstance(run, dict) or run.get("status") not in (RUNNING, FINISHED):
            return None
        return run["status"]

    def prepare(self, recipe_yaml: str, overwrite: bool) -> bool:
        """Creates or checks the directory for a run; returns True when resuming.

        With `overwrite`, a previous run is moved to `replaced_dir`: `drop_replaced`
        deletes it once the new run has finished, `restore_replaced` puts it back.
        """
        self._check_is_run_folder()
        if not self.is_empty() and self._resumes(recipe_yaml, overwrite):
            return True
        try:
            self.model_dir.mkdir(parents=True, exist_ok=True)
            self.recipe_file.write_text(recipe_yaml)
            self.set_status(RUNNING)
        except BaseException:
            if not self.replaced_dir.is_dir():  # (a replaced run's hint says where it is)
                self.remove_made()  # a full disk: no half-made run
            raise
        return False

    def _check_is_run_folder(self) -> None:
        """A `UserError` unless the path is absent, an empty folder or a run directory."""
        if self.path.exists() and not self.path.is_dir():
            raise UserError("output path exists and is not a folder", source=self.path)
        if not self.is_empty() and self.status() is None:
            raise UserError(
                "output folder exists and is not a bertkit run directory; "
                f"choose another output_dir{self.replaced_hint()}",
                source=self.path,
            )

    def _resumes(self, recipe_yaml: str, overwrite: bool) -> bool:
        """Whether the run in the folder goes on; with `overwrite`, it is moved aside; a
        finished run or one of another recipe is a `UserError`."""
        if overwrite:
            self._move_aside()
            return False
        if self.status() == FINISHED:
            raise UserError(
                "holds a finished run; pass --overwrite (overwrite=True) to "
                "replace it, or choose another output folder",
                source=self.path,
            )
        if self.recipe_file.read_text() != recipe_yaml:
            raise UserError(
                "holds an unfinished run of a different recipe; pass "
                "--overwrite to start over, or choose another output folder"
                f"{self.replaced_hint()}",
                source=self.path,
            )
        return True

    def _contents(self) -> list[Path]:
        """The folder's entries but the lock file (it stays in place while it is held)."""
        if not self.path.is_dir():
            return []
        return [entry for entry in self.path.iterdir() if entry.name != LOCK_FILE]

    def is_empty(self) -> bool:
        return not self._contents()

    def _clear(self) -> None:
        for entry in self._contents():
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()

    def _move_aside(self) -> None:
        """Moves the run to `replaced_dir`, `run.json` first: while `replaced_dir` exists,
        the folder holds the new run only if it has a `run.json` (see `restore_replaced`)."""
        if self.replaced_dir.exists() and self.status() == FINISHED:
            shutil.rmtree(self.replaced_dir)  # the new run finished; deleting the old stopped
        elif self.replaced_dir.exists():
            # An earlier overwrite was interrupted: the run kept aside is the one to
            # restore; the folder holds that unfinished replacement.
            self._clear()
            return
        self.replaced_dir.mkdir()
        for entry in sorted(self._contents(), key=lambda entry: entry != self.run_file):
            os.replace(entry, self.replaced_dir / entry.name)

    def restore_replaced(self) -> None:
        """Puts back the run that `overwrite` moved aside (the new run failed), `run.json`
        last. A folder without `run.json` holds what an interrupted move left of the old
        run (or the first files of the new one, replaced here): its files are kept."""
        if self.replaced_dir.is_dir():
            if self.run_file.exists():
                self._clear()
            self.path.mkdir(exist_ok=True)
            for entry in sorted(self.replaced_dir.iterdir(), key=lambda e: e.name == "run.json"):
                os.replace(entry, self.path / entry.name)
            self.replaced_dir.rmdir()

    def has_trained(self) -> bool:
        """Whether training has left anything to resume or keep in the folder: a checkpoint
        or metrics, the run's own or those of a run inside it (`seeds/`)."""
        return self.path.is_dir() and any(
            True for name in ("metrics.json", "checkpoint") for _ in self.path.rglob(name)
        )

    def remove_made(self) -> None:
        """Removes what this process added since it took the lock (a run that stopped before
        training): the folders `lock` made, or the entries it found absent. Nothing that was
        there before; nothing when this process holds no lock."""
        if self._made is None:
            return
        made, before = self._made
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
            return
        for entry in [entry for entry in self.path.iterdir() if entry.name not in before]:
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()

    def drop_replaced(self) -> None:
        """Deletes the run that `overwrite` moved aside (the new run finished)."""
        if self.replaced_dir.is_dir():
            shutil.rmtree(self.replaced_dir)

    @contextlib.contextmanager
    def lock(self):
        """Holds an exclusive lock on the run directory (`.lock` inside it) while in use.

        A second process gets a `UserError` naming the holder (pid, host, start time).
        The lock is the kernel's (`flock`): a killed holder releases it, and a stale
        file holds nothing. A folder that is not a run directory gets no lock file.
        """
        self._check_is_run_folder()
        made = outermost_missing(self.path)
        self.path.mkdir(parents=True, exist_ok=True)
        before = {entry.name for entry in self.path.iterdir()}
        with exclusive_lock(self.path / LOCK_FILE, self.path):
            self._made = (made, before)
            try:
                yield self
            finally:
                self._made = None

    def set_status(self, status: str, **extra) -> None:
        current = read_json(self.run_file) if self.run_file.exists() else {}
        write_json(self.run_file, {**current, "status": status, **extra})
