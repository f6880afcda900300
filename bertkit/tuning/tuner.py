"""`tune`: a hyperparameter search over a recipe's `search:` section, with Optuna.

Each trial is an ordinary `finetune` run of the recipe with the trial's values set
as `--set` would set them, in `<study folder>/trial-NNNN/`. The objective is the
task's `monitor` metric on the validation split (maximized or minimized by its
`mode`); every epoch's value is reported to Optuna, whose pruner may stop a trial
that falls behind. With `training.seeds > 1` it is the mean over a trial's seeds, and
the trial runs them all (unpruned). The study lives in an Optuna storage: SQLite in
the study folder by default, or any RDB URL (PostgreSQL) shared by workers on several
machines. Any number of processes may call `tune` on one storage: together they finish the
requested number of trials. Workers send heartbeats (every `heartbeat_seconds`), so a trial
whose worker was killed (a kill -9 included) is failed once its heartbeat is older than twice
that, and continued from its last checkpoint by the next worker (at once after a SIGTERM; a
stalled worker: `bertkit.tuning.retries`): an interrupted search resumes when `tune` is called.

Layout of the study folder (default `<output_dir>.study/`)::

    study.db                      the Optuna storage (unless --storage names another)
    trial-0000/ ... trial-NNNN/   one run directory per trial; run.json says if pruned
    best -> trial-NNNN            the best trial so far (its saved_model/ is the one to ship)
    report.md, optimization_history.png, param_importances.png

Example (a tiny random backbone and generated data; skipped in the test run, which
covers it in tests/test_tune.py, because each trial takes seconds):
    >>> import tempfile
    >>> from pathlib import Path
    >>> from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = write_tiny_checkpoint(folder / "tiny")
    >>> _ = write_sentiment_tsv(folder / "train.tsv", 64)
    >>> _ = write_sentiment_tsv(folder / "dev.tsv", 16, seed=1)
    >>> study = tune({"schema": 1, "task": "classification",
    ...     "backbone": {"preset": str(folder / "tiny"), "sequence_length": 32},
    ...     "data": {"train": str(folder / "train.tsv"), "text": "sentence",
    ...              "validation": str(folder / "dev.tsv")},
    ...     "training": {"epochs": 1, "batch_size": 16},
    ...     "output_dir": str(folder / "run"),
    ...     "search": {"trials": 2, "training.learning_rate": [1e-4, 1e-3]}},
    ...     verbose=0)  # doctest: +SKIP
    trial 0: learning_rate=0.0001
    ...
    study report written to ...
    >>> [(t.number, t.state.name) for t in study.trials]  # doctest: +SKIP
    [(0, 'COMPLETE'), (1, 'COMPLETE')]
    >>> sorted(p.name for p in (folder / "run.study").iterdir())  # doctest: +SKIP
    ['best', 'optimization_history.png', 'param_importances.png', 'report.md', 'study.db',
     'trial-0000', 'trial-0001']
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from bertkit.errors import UserError
from bertkit.recipes.preflight import check_run
from bertkit.recipes.recipe import Recipe, load_recipe
from bertkit.run_dir import FINISHED, RunDirectory, read_json
from bertkit.task import Task
from bertkit.training.preemption import Preempted
from bertkit.training.task_data import make_task
from bertkit.tuning import retries
from bertkit.tuning.study import (
    StudyPlace,
    open_study,
    quiet_experimental_warnings,
    requeue_preempted,
)

INSTALL_HINT = 'hyperparameter search needs Optuna: pip install "bertkit[tune]"'
_FINISHED_STATES = ("COMPLETE", "PRUNED")


def tune(
    recipe,
    *,
    trials: int | None = None,
    timeout: float | None = None,
    storage: str | None = None,
    study_name: str | None = None,
    output_dir=None,
    overrides=None,
    heartbeat_seconds: int = 60,
    verbose: int | None = None,
):
    """Runs a hyperparameter search over the recipe's `search:` section; returns the study.

    Runs trials until the study has `trials` finished (complete or pruned) trials, or
    `timeout` seconds have passed; then writes the report. Several workers, resuming after
    a kill, and an example: see the module's docstring.

    Args:
        recipe: a recipe file path or mapping with a `search:` section.
        trials: finished trials to reach (default: `search.trials`).
        timeout: seconds after which no new trial starts (default: `search.timeout`).
        storage: an Optuna RDB URL (default: SQLite in the study folder).
        study_name: default: the name of the recipe's `output_dir` (with a `storage`, also
            a short hash of the study folder's absolute path; see `StudyPlace.of`).
        output_dir: the study folder (default: `<output_dir>.study`).
        overrides: `--set`-style strings applied to every trial's recipe.
        heartbeat_seconds: how often a worker tells the storage its trial is alive.
        verbose: Keras progress output of each trial (see `finetune`).
    """
    base = _checked_search_recipe(recipe, overrides)
    place = StudyPlace.of(base, output_dir, storage, study_name)
    study = _start_study(place, base, heartbeat_seconds, shared=bool(storage))
    target = trials or base.search.options.trials
    objective = Objective(recipe, list(overrides or []), base, place.folder, target, verbose)
    seconds = timeout or base.search.options.timeout
    deadline = seconds and time.monotonic() + seconds
    run_trials(study, objective, deadline, poll_seconds=min(heartbeat_seconds, 10))
    write_study_report(study, place.folder)
    return study


def _checked_search_recipe(recipe, overrides) -> Recipe:
    """The recipe with its `search:` section, once Optuna is there and the recipe's files
    are: a missing file or validation split fails once here, not every trial."""
    require_optuna()
    base = load_search_recipe(recipe, overrides)
    check_search(base)
    return base


def _start_study(place: StudyPlace, base: Recipe, heartbeat_seconds: int, shared: bool):
    """Opens (or creates) the study; on a shared storage, says how others join it."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # a line per trial is printed here
    study = open_study(place, base, heartbeat_seconds, create=True)
    if shared:  # workers elsewhere join this study by its name
        print(f"study '{place.name}' (other workers join it with --study {place.name})", flush=True)
    return study


def report(recipe, *, storage=None, study_name=None, output_dir=None, overrides=None):
    """Writes the report of a recipe's study (`bertkit tune --report`); returns its path."""
    require_optuna()
    base = load_search_recipe(recipe, overrides)
    place = StudyPlace.of(base, output_dir, storage, study_name)
    return write_study_report(open_study(place, base, None, create=False), place.folder)


def require_optuna():
    try:
        import optuna
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    return optuna


def load_search_recipe(recipe, overrides=None) -> Recipe:
    base = load_recipe(recipe, overrides)
    if base.search is None:
        raise UserError(
            "has no 'search' section; add one, e.g. 'search: {trials: 8, "
            "training.learning_rate: {low: 1.0e-5, high: 1.0e-4, log: true}}'",
            source=base.source,
        )
    return base


def check_search(recipe: Recipe) -> None:
    """Checks that a search over `recipe` can start (`bertkit check` runs it too).

    Its files must exist, and trials are scored on a validation split: `data.validation`,
    or part of `data.train` that the task holds out (MLM holds out documents; the
    training file is then read to see that some are). Without one, every trial would
    train in full and then fail.
    """
    check_run(recipe)  # what `finetune` checks before a trial trains
    if recipe.data.validation:
        return
    task_class = recipe.task_class()
    message = (
        "hyperparameter search scores trials on a validation split, and the "
        f"{recipe.task} task held none out of data.train"
    )
    if task_class.split_validation is Task.split_validation:  # it never holds any out
        raise UserError(
            f"{message}; add data.validation", source=recipe.source, key="data.validation"
        )
    reader = task_class(recipe.task_options, recipe.data, None, recipe.backbone.sequence_length)
    train = reader.read(recipe.data.train)
    if not reader.split_validation(train)[1]:
        raise UserError(
            f"{message} ({len(train)} examples, too few to hold some out); add data.validation",
            source=recipe.source,
            key="data.validation",
        )


def run_trials(
    study, objective: Objective, deadline: float | None, poll_seconds: float = 10
) -> None:
    """Runs trials until `objective.target` are finished; one worker's loop among any number.

    Trials running elsewhere count as started: a worker waits for the last ones rather
    than overshoot, and if one of them belongs to a killed worker, its heartbeat goes
    stale, Optuna fails it and this worker runs it again.
    """
    import optuna

    target, failures_in_a_row, waiting_said = objective.target, 0, False
    while True:
        with quiet_experimental_warnings():
            optuna.storages.fail_stale_trials(study)
        finished, running = count_trials(study)
        if finished >= target or (deadline and time.monotonic() >= deadline):
            return
        if finished + running >= target:
            if not waiting_said:
                print(
                    f"{finished} of {target} trials finished; waiting for the {running} "
                    "running (in other workers, or in a killed one until its heartbeat "
                    "is stale)",
                    flush=True,
                )
                waiting_said = True
            time.sleep(poll_seconds)
            continue
        try:
            study.optimize(objective, n_trials=1, catch=(UserError,))
        except retries.FailedElsewhere as stale:
            print(stale, flush=True)
        failures_in_a_row = failures_in_a_row + 1 if objective.last_error else 0
        if failures_in_a_row >= 3:
            raise UserError(f"3 trials in a row failed; the last: {objective.last_error}")


def count_trials(study, before: int | None = None) -> tuple[int, int]:
    """(finished, running) trials of a study (numbered below `before`, if given);
    finished are complete or pruned."""
    states = [
        trial.state.name
        for trial in study.get_trials(deepcopy=False)
        if before is None or trial.number < before
    ]
    return sum(s in _FINISHED_STATES for s in states), states.count("RUNNING")


class SurplusTrial(UserError):
    """Two workers counted at the same moment and both started the last trial: the one
    with the higher number steps back (Optuna marks it failed; the report leaves it out)."""


class Objective:
    """One trial: the recipe with the trial's values, fine-tuned into `trial-NNNN/`.

    Returns the final validation value of the task's monitored metric (the best
    epoch's, as `finetune` keeps it). A pruned trial is a finished run too (its best
    epoch so far, exported); its `run.json` says `"pruned_after_epoch": N`.
    """

    def __init__(
        self, recipe, overrides: list, base: Recipe, folder: Path, target: int, verbose=None
    ):
        self.recipe, self.overrides, self.space = recipe, overrides, base.search
        self.folder, self.target, self.verbose = folder, target, verbose
        self.monitor = make_task(base).monitor  # an instance's: it may follow the options
        self.last_error = None

    def __call__(self, trial):
        self.last_error = None
        if sum(count_trials(trial.study, before=trial.number)) >= self.target:
            trial.set_user_attr("surplus", True)
            raise SurplusTrial(f"trial {trial.number} is not needed")
        try:
            return self._trial(trial)
        except Preempted:
            requeue_preempted(trial)
            raise
        except UserError as error:  # each counts toward `run_trials`' 3 failures in a row
            self.last_error = error
            trial.set_user_attr("error", str(error))
            print(f"trial {trial.number} failed: {error}", flush=True)
            raise

    def _trial(self, trial) -> float:
        """Runs the trial; its value, or `optuna.TrialPruned`."""
        import optuna

        values = self.space.suggest(trial)
        stopped = retries.stopped_run(trial)
        run = stopped or RunDirectory(self.folder / f"trial-{trial.number:04d}")
        trial.set_user_attr("run_dir", str(run.path))
        trial.set_user_attr("worker", f"{os.uname().nodename}:{os.getpid()}")
        print(f"trial {trial.number}: {_shown(values)}", flush=True)
        finished, pruned_after = retries.finished_result(stopped)
        if not finished:
            pruned_after = self._finetune(trial, values, run)
        value = self._final_value(run)
        retries.check_still_running(trial)
        if pruned_after is not None:
            run.set_status(FINISHED, pruned_after_epoch=pruned_after)
            print(
                f"trial {trial.number} pruned after epoch {pruned_after}: "
                f"{self.monitor} {value:.4f}",
                flush=True,
            )
            raise optuna.TrialPruned(f"pruned after epoch {pruned_after}")
        print(f"trial {trial.number}: {self.monitor} {value:.4f}", flush=True)
        return value

    def _finetune(self, trial, values: dict, run: RunDirectory) -> int | None:
        """Fine-tunes the trial's recipe; the epoch after which it was pruned, if it was."""
        from bertkit.training.trainer import finetune
        from bertkit.tuning.pruning import ReportToTrial

        recipe = load_recipe(self.recipe, [*self.overrides, *self.space.overrides(values)])
        reporter = ReportToTrial(trial, f"val_{self.monitor}")
        # A UserError (e.g. a learning rate at which training diverged) fails the trial.
        # With training.seeds > 1 the trial runs all its seeds: their epochs are not reported.
        finetune(
            dataclasses.replace(recipe, search=None),
            output_dir=run.path,
            callbacks=[reporter] if recipe.training.seeds == 1 else [],
            verbose=self.verbose,
        )
        return reporter.pruned_after

    def _final_value(self, run: RunDirectory) -> float:
        metrics = read_json(run.metrics_file)
        final = metrics.get("mean") or metrics.get("final", {})  # seeds > 1: scored by the mean
        if self.monitor not in final.get("validation", {}):
            raise UserError(
                "hyperparameter search scores trials on a validation split, and "
                "this trial's run had none; add data.validation",
                key="data.validation",
            )
        return float(final["validation"][self.monitor])


def _shown(values: dict) -> str:
    return ", ".join(
        f"{key.split('.')[-1]}={value:.3g}"
        if isinstance(value, float)
        else f"{key.split('.')[-1]}={value}"
        for key, value in values.items()
    )


def write_study_report(study, folder: Path) -> Path:
    from bertkit.tuning.tune_report import write_tune_report

    path = write_tune_report(study, folder)
    print(f"study report written to {path}")
    return path
