"""Trials run again: the retry of a trial whose worker was preempted, killed, or only
looked dead (its heartbeat went stale while it ran on), and that worker's side of it.

Optuna's `RetryHeartbeatStaleTrialCallback` (and `study.requeue_preempted`) queue a trial
with the stopped one's parameters and attributes, its `run_dir` included. The retry
continues that run: it resumes from the last checkpoint; if the stopped trial's worker is
in fact still training it (a process stalled past the grace period: swapping, a long
compile holding the interpreter lock), the retry waits for it, then takes its result.
That worker's own trial was failed meanwhile, and Optuna cannot take its result: the
worker says so in a line (`FailedElsewhere`) and goes on.
"""

from __future__ import annotations

import time

from bertkit.errors import UserError
from bertkit.run_dir import FINISHED, LOCK_FILE, RUNNING, RunDirectory, read_json


def stopped_run(trial, poll_seconds: float = 5) -> RunDirectory | None:
    """The unfinished or just finished run of the trial that `trial` retries, if any,
    once no process holds it (see the module docstring)."""
    stopped = trial.user_attrs.get("run_dir")  # a retry carries the stopped trial's
    if not stopped or RunDirectory(stopped).status() not in (RUNNING, FINISHED):
        return None
    run, said = RunDirectory(stopped), False
    while True:
        try:
            with run.lock():
                break
        except UserError:
            if not (run.path / LOCK_FILE).is_file():  # not held: another error of the folder
                raise
            if not said:
                holder = (run.path / LOCK_FILE).read_text().strip()
                print(
                    f"trial {trial.number}: the stopped run {stopped} is still in use by "
                    f"{holder}; waiting for it to end",
                    flush=True,
                )
                said = True
            time.sleep(poll_seconds)
    verb = "taking the result of" if run.status() == FINISHED else "continuing"
    print(f"trial {trial.number}: {verb} the stopped run {stopped}", flush=True)
    return run


def finished_result(stopped: RunDirectory | None) -> tuple[bool, int | None]:
    """(whether the stopped run has finished, the epoch after which it was pruned if it
    was); (False, None) without one."""
    if stopped is None or stopped.status() != FINISHED:
        return False, None
    return True, read_json(stopped.run_file).get("pruned_after_epoch")


class FailedElsewhere(BaseException):
    """This worker's trial ran to its end after another worker had failed it (its
    heartbeat looked stale). Not an `Exception`: `study.optimize` would tell the study
    that the trial failed, and Optuna cannot tell a finished trial anything."""


def check_still_running(trial) -> None:
    """`FailedElsewhere`, saying what becomes of the run, unless `trial` still runs."""
    study, number = trial.study, trial.number
    if study.get_trials(deepcopy=False)[number].state.name == "RUNNING":  # numbers: positions
        return
    retried = any(
        number in other.system_attrs.get("retry_history", [])  # set by Optuna's retry
        for other in study.get_trials(deepcopy=False)
    )
    raise FailedElsewhere(
        f"trial {number}: another worker found its heartbeat stale and failed it; "
        + (
            "the trial queued in its place takes this run's result"
            if retried
            else "its run is kept, and the study goes on without it"
        )
    )
