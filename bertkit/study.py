"""Where a hyperparameter search's Optuna study lives, and opening it.

The study folder (default `<output_dir>.study/`) holds the trials' run directories and
the report; the storage is SQLite in that folder (`study.db`) unless an RDB URL
(PostgreSQL) is given, which workers on several machines share. Workers send
heartbeats: a trial whose worker died is failed once its heartbeat is stale, and its
parameters are tried again (Optuna's `RetryHeartbeatStaleTrialCallback`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import warnings
from pathlib import Path

from bertkit.errors import UserError
from bertkit.recipe import Recipe


@dataclasses.dataclass(frozen=True)
class StudyPlace:
    """Where a recipe's study lives: its folder, Optuna storage URL and study name."""

    folder: Path
    storage: str
    name: str

    @classmethod
    def of(cls, recipe: Recipe, output_dir=None, storage=None, study_name=None) -> StudyPlace:
        folder = Path(output_dir or f"{recipe.output_dir}.study").resolve()
        storage = storage or f"sqlite:///{folder / 'study.db'}"
        name = study_name or Path(recipe.output_dir).name
        return cls(folder, storage, name)


def open_study(place: StudyPlace, base: Recipe, heartbeat_seconds: int | None, *,
               create: bool):
    """The Optuna study in `place`, created when `create` (direction: the task's `mode`)."""
    import optuna
    import sqlalchemy.exc

    try:
        storage = _storage(place, heartbeat_seconds, create)
    except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UserError(f"cannot open the storage: {reason}", source=place.storage) from None
    if not create:
        try:
            return optuna.load_study(study_name=place.name, storage=storage)
        except KeyError:
            raise UserError(f"no study '{place.name}' in {place.storage}; run "
                            "'bertkit tune' first", source=base.source) from None
    options = base.search.options
    study = optuna.create_study(
        storage=storage, study_name=place.name, load_if_exists=True,
        direction="maximize" if base.task_class().mode == "max" else "minimize",
        sampler=_sampler(options), pruner=_pruner(options))
    study.set_user_attr("monitor", base.task_class().monitor)
    return study


def _storage(place: StudyPlace, heartbeat_seconds: int | None, create: bool):
    """Optuna's RDB storage, with heartbeats and a retry of trials failed by a stale one."""
    import optuna
    import sqlalchemy.exc

    engine_kwargs = _engine_options(place, create)
    heartbeat = _heartbeat_options(heartbeat_seconds)
    for attempt in range(3):
        try:
            with quiet_experimental_warnings():
                return optuna.storages.RDBStorage(place.storage, engine_kwargs=engine_kwargs,
                                                  **heartbeat)
        except sqlalchemy.exc.DBAPIError:
            # Workers started together race to create the tables ("table studies already
            # exists"); the next attempt finds them made.
            if attempt == 2:
                raise
            time.sleep(1 + attempt)


def _engine_options(place: StudyPlace, create: bool) -> dict:
    if not place.storage.startswith("sqlite:"):
        return {}
    if create:
        place.folder.mkdir(parents=True, exist_ok=True)
    elif not place.folder.joinpath("study.db").exists():
        raise UserError("no study here; run 'bertkit tune' first", source=place.folder)
    # Several workers write one SQLite file: wait for its lock rather than fail at once.
    return {"connect_args": {"timeout": 60}}


def _heartbeat_options(seconds: int | None) -> dict:
    """A trial silent for 2 x `seconds` is failed, and its parameters tried once more."""
    import optuna

    if seconds is None:  # only reading the study (the report)
        return {}
    with quiet_experimental_warnings():  # heartbeats are "experimental" since Optuna 2.9
        return {"heartbeat_interval": seconds, "grace_period": 2 * seconds,
                "heartbeat_stale_trial_callback":
                    optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1)}


@contextlib.contextmanager
def quiet_experimental_warnings():
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def _sampler(options):
    import optuna

    if options.sampler == "random":
        return optuna.samplers.RandomSampler(seed=options.seed)
    return optuna.samplers.TPESampler(seed=options.seed)


def _pruner(options):
    import optuna

    if options.pruner == "none":
        return optuna.pruners.NopPruner()
    if options.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=options.pruner_startup_trials,
                                       n_warmup_steps=options.pruner_warmup_epochs)
