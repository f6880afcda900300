"""Running the check's stages: each one a process with its own timeout and log, so that one
failure becomes a row saying why and the others still run.

A stage's figures come from its worker's result line (`protocol.report`) or, for the whole
`bertkit finetune` command, from the run directory it wrote (`finetune_figures`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from protocol import read_result

# log lines that never explain a failure (XLA, absl and Keras chatter)
_NOISE = ("WARNING", "I0000", "W0000", "E0000", "warnings.warn", "Traceback")


@dataclasses.dataclass
class Stage:
    """One row of the table: a command, its time limit, and how to read its figures."""

    key: str
    label: str
    argv: list[str] | None = None
    timeout: float = 60.0
    skip: str | None = None  # why the stage does not run ("torch not installed")
    collect: Callable[[str], dict | None] = read_result  # log text -> figures
    env: dict | None = None  # the runner's unless given


class Runner:
    """Runs stages one after another, each within its timeout and the check's deadline."""

    def __init__(self, logs: Path, env: dict, cwd: Path, deadline: float):
        self.logs, self.env, self.cwd, self.deadline = logs, env, cwd, deadline
        logs.mkdir(parents=True, exist_ok=True)

    def run(self, stage: Stage) -> dict:
        """The stage's record: `status` ("ok", "skipped: ...", "failed ...", "timed out
        ..."), `wall_seconds`, `launched_at` and its figures."""
        if stage.skip:
            return {"status": f"skipped: {stage.skip}"}
        left = self.deadline - time.time()
        if left < 5:
            return {"status": "not run: the check's time budget was spent"}
        timeout = min(stage.timeout, left)
        log = self.logs / f"{stage.key}.log"
        print(f"--- {stage.label}: at most {timeout:.0f} s, log {log}", flush=True)
        launched, started, cpu = time.time(), time.perf_counter(), _children_cpu_seconds()
        code = self._wait(stage, timeout, log)
        record = {
            "wall_seconds": round(time.perf_counter() - started, 2),
            "cpu_seconds": round(_children_cpu_seconds() - cpu, 2),
            "launched_at": launched,
        }
        text = log.read_text(encoding="utf-8", errors="replace")
        return record | _outcome(stage, code, timeout, text)

    def _wait(self, stage: Stage, timeout: float, log: Path) -> int | None:
        """The stage's exit code; None when it ran past `timeout` (then it and any process
        it started are killed)."""
        with log.open("w") as handle:
            process = subprocess.Popen(
                stage.argv,
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=stage.env or self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
            try:
                return process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                return None


def _outcome(stage: Stage, code: int | None, timeout: float, text: str) -> dict:
    """The status and figures of a stage that ended with `code` and wrote `text`."""
    if code is None or code != 0:  # with what the worker reported before, if anything
        partial = _quietly(read_result, text) or {}
        status = (
            f"timed out after {timeout:.0f} s; last: {last_line(text)}"
            if code is None
            else f"failed (exit {code}): {last_line(text)}"
        )
        return partial | {"status": status}
    try:
        figures = stage.collect(text)
    except (OSError, ValueError, KeyError) as error:
        return {"status": f"failed: no figures ({type(error).__name__}: {error})"}
    if figures is None:
        return {"status": f"failed: no result line; last: {last_line(text)}"}
    return {"status": "ok"} | figures


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # the stages that have ended
    return usage.ru_utime + usage.ru_stime


def _quietly(read, text: str) -> dict | None:
    try:
        return read(text)
    except ValueError:  # a result line cut off by the kill
        return None


def last_line(text: str, width: int = 160) -> str:
    """The last line of a log that may say what happened."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line and not line.startswith(_NOISE) and not line.startswith("File "):
            return line[:width]
    return "(no output)"


def finetune_figures(run_dir: Path, features_file: Path) -> Callable[[str], dict]:
    """Reads what `bertkit finetune` recorded: `run.json`'s phases and compilation, the
    final validation metrics, the steps per epoch and the training rows' token lengths."""
    import numpy as np

    def collect(text: str) -> dict:
        record = json.loads((run_dir / "run.json").read_text())
        metrics = json.loads((run_dir / "metrics.json").read_text())
        with np.load(features_file) as features:
            lengths = np.diff(features["train/token_ids/offsets"])
        values, counts = np.unique(lengths, return_counts=True)
        return {
            "phases": record.get("phases", {}),
            "compilation": record.get("compilation"),
            "finetune_called_at": record.get("finetune_called_at"),
            "validation": (metrics.get("final") or {}).get("validation"),
            "steps": steps_per_epoch(run_dir / "steps.json"),
            "train_rows": len(lengths),
            "train_lengths": {str(v): int(c) for v, c in zip(values, counts, strict=True)},
        }

    return collect


def steps_per_epoch(steps_file: Path) -> int | None:
    """From `steps.json`'s last record: its step divided by its share of the epoch."""
    try:
        last = json.loads(steps_file.read_text())["steps"][-1]
        return round(last["step"] / last["progress"])
    except (OSError, ValueError, KeyError, IndexError, ZeroDivisionError, TypeError):
        return None
