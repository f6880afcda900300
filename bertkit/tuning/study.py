"""Where a hyperparameter search's Optuna study lives, and opening it.

The study folder (default `<output_dir>.study/`) holds the trials' run directories and
the report; the storage is SQLite in that folder (`study.db`) unless an RDB URL
(PostgreSQL) is given, which workers on several machines share. Workers send
heartbeats: a trial whose worker died is failed once its heartbeat is stale, and its
parameters are tried again (Optuna's `RetryHeartbeatStaleTrialCallback`). A trial stopped
by SIGTERM is failed and queued again at once (`requeue_preempted`). Either way the trial
that runs it again carries the stopped trial's `run_dir` and continues that run from its
last checkpoint (`bertkit.tuning.tuner.Objective`).

A study continues only the search it began: opening it with a recipe of another task,
monitored metric or direction, or with a `search:` value Optuna cannot continue (a
range's `log`, a range turned into choices, other choices), is refused in one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import sqlite3
import time
import warnings
from pathlib import Path

from bertkit.errors import UserError
from bertkit.recipes.recipe import Recipe


@dataclasses.dataclass(frozen=True)
class StudyPlace:
    """Where a recipe's study lives: its folder, Optuna storage URL and study name."""

    folder: Path
    storage: str
    name: str

    @classmethod
    def of(cls, recipe: Recipe, output_dir=None, storage=None, study_name=None) -> StudyPlace:
        """The place of a recipe's study; `study_name`, when given, is used as it is.

        The default name is the `output_dir`'s name. In the default storage, the study
        folder's own `study.db`, no other folder's study can take it (and studies made
        before keep their name). A shared `storage` holds the studies of many folders, so
        there the name also carries a short hash of the study folder's absolute path:
        `runs/a/model` and `runs/b/model` are two studies. Workers join one study when
        their study folders have the same path, or when they are given one `study_name`.
        """
        folder = Path(output_dir or f"{recipe.output_dir}.study").resolve()
        if folder.exists() and not folder.is_dir():
            raise UserError(
                "is a file; the study folder (--output) must be a folder or new", source=folder
            )
        name = study_name or Path(recipe.output_dir).name
        if storage and not study_name:
            name += "-" + hashlib.sha256(str(folder).encode()).hexdigest()[:8]
        return cls(folder, storage or f"sqlite:///{folder / 'study.db'}", name)


def open_study(place: StudyPlace, base: Recipe, heartbeat_seconds: int | None, *, create: bool):
    """The Optuna study in `place`, created when `create` (direction: the task's `mode`)."""
    import optuna
    import sqlalchemy.exc

    _check_sqlite_file(place.storage)
    try:
        storage = _storage(place, heartbeat_seconds, create)
    except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UserError(f"cannot open the storage: {reason}", source=place.storage) from None
    if not create:
        try:
            return optuna.load_study(study_name=place.name, storage=storage)
        except KeyError:
            raise UserError(
                f"no study '{place.name}' in {place.storage}; run 'bertkit tune' first",
                source=base.source,
            ) from None
    options = base.search.options
    study = optuna.create_study(
        storage=storage,
        study_name=place.name,
        load_if_exists=True,
        direction=_objective(base)["direction"],
        pruner=_pruner(options),
    )
    _check_same_objective(study, place, base)
    _check_same_space(study, base)
    study.sampler = _sampler(options, len(study.get_trials(deepcopy=False)))
    return study


def _objective(base: Recipe) -> dict:
    """What a study's trial values mean: the recipe's task, its metric and direction."""
    from bertkit.training.task_data import make_task

    task = make_task(base)  # an instance: its monitor may follow its options
    return {
        "task": base.task,
        "monitor": task.monitor,
        "direction": "maximize" if task.mode == "max" else "minimize",
    }


def _check_same_objective(study, place: StudyPlace, base: Recipe) -> None:
    """Refuses a study made for another task, metric or direction: its values would not
    compare, and `best/` could link the worst model. Records them in a new study."""
    wanted = _objective(base)
    found = {
        "task": study.user_attrs.get("task"),
        "monitor": study.user_attrs.get("monitor"),
        "direction": study.direction.name.lower(),
    }
    if any(found[key] not in (None, wanted[key]) for key in wanted):  # None: not recorded
        raise UserError(
            f"study '{place.name}' {_described(found)}, and this recipe "
            f"{_described(wanted)}; start a new study with --study NAME or "
            "--output DIR",
            source=base.source,
        )
    for key in ("task", "monitor"):
        if found[key] is None:
            study.set_user_attr(key, wanted[key])


def _described(objective: dict) -> str:
    """ "maximizes accuracy of the classification task" """
    task = f" of the {objective['task']} task" if objective["task"] else ""
    return f"{objective['direction']}s {objective['monitor'] or 'its metric'}{task}"


def _check_same_space(study, base: Recipe) -> None:
    """Refuses a `search:` value that Optuna cannot continue in this study.

    The rule is Optuna's own (its storage applies it to every new parameter): a range
    may move its bounds, but not change `log`, become choices, or change its choices.
    """
    import optuna

    recorded = {}
    for trial in study.get_trials(deepcopy=False):
        for key, distribution in trial.distributions.items():
            recorded.setdefault(key, distribution)
    for dimension in base.search.dimensions:
        old, new = recorded.get(dimension.key), dimension.distribution()
        if old is None:  # not searched before: a new value is fine
            continue
        try:
            optuna.distributions.check_distribution_compatibility(old, new)
        except ValueError:
            raise UserError(
                f"changed since the study began (was {_shown(old)}, now "
                f"{_shown(new)}), and Optuna cannot continue the study with it; "
                "undo the change, or start a new study with --study NAME or "
                "--output DIR",
                source=base.source,
                key=f"search.{dimension.key}",
            ) from None


def _shown(distribution) -> str:
    """A distribution as a recipe writes it: `[16, 32]`, `0.0001..0.01 log`, `1..4 step 1`."""
    if hasattr(distribution, "choices"):
        return str(list(distribution.choices))
    log = " log" if distribution.log else ""
    step = f" step {distribution.step}" if distribution.step is not None else ""
    return f"{distribution.low:g}..{distribution.high:g}{log}{step}"


def _check_sqlite_file(storage: str) -> None:
    """Refuses an SQLite file that holds no Optuna study storage, before Optuna adds its
    tables to it; an empty or new file is fine."""
    import sqlalchemy

    database = (
        sqlalchemy.engine.make_url(storage).database if storage.startswith("sqlite:") else None
    )
    path = Path(database) if database and database != ":memory:" else None
    if path is None or not path.is_file() or path.stat().st_size == 0:
        return
    advice = "move it away, or give --output another folder (or --storage another file)"
    try:  # read-only: the file is left as it is
        uri = f"{path.resolve().as_uri()}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as connection:
            tables = {
                row[0]
                for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
    except sqlite3.Error as error:
        raise UserError(f"is not an SQLite database ({error}); {advice}", source=path) from None
    # Any one of Optuna's tables: workers started together may be creating the others.
    if tables and not tables & {"studies", "trials", "version_info", "alembic_version"}:
        raise UserError(
            f"is an SQLite database, but no Optuna study storage (its tables: "
            f"{', '.join(sorted(tables)[:5])}); {advice}",
            source=path,
        )


def _storage(place: StudyPlace, heartbeat_seconds: int | None, create: bool):
    """Optuna's RDB storage, with heartbeats and a retry of trials failed by a stale one."""
    import optuna
    import sqlalchemy.exc

    engine_kwargs = _engine_options(place, create)
    heartbeat = _heartbeat_options(heartbeat_seconds)
    for attempt in range(3):
        try:
            with quiet_experimental_warnings():
                return optuna.storages.RDBStorage(
                    place.storage, engine_kwargs=engine_kwargs, **heartbeat
                )
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
        return {
            "heartbeat_interval": seconds,
            "grace_period": 2 * seconds,
            "heartbeat_stale_trial_callback": optuna.storages.RetryHeartbeatStaleTrialCallback(
                max_retry=1
            ),
        }


def requeue_preempted(trial) -> None:
    """Fails `trial` (a running `optuna.Trial`, stopped by SIGTERM with its run saved) and
    queues a trial with its parameters and attributes, as Optuna does for a trial whose
    heartbeat went stale, but at once and for every preemption (a spot machine may be
    preempted many times), so the next `tune` continues its run."""
    import optuna

    study = trial.study
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    with quiet_experimental_warnings():
        retry = optuna.storages.RetryHeartbeatStaleTrialCallback()
    retry(study, study.get_trials(deepcopy=False)[trial.number])  # numbers are positions


@contextlib.contextmanager
def quiet_experimental_warnings():
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def _sampler(options, trials_so_far: int):
    """The sampler, seeded from `seed` and the trials already in the study: a resumed or
    extended study draws new values, not its first ones again (same seed and study, same
    values)."""
    import optuna

    seed = options.seed
    if seed is not None:  # (seed, trials so far) -> 0 .. 2**32 - 1, as NumPy's seeds must be
        digest = hashlib.sha256(f"{seed}:{trials_so_far}".encode()).digest()
        seed = int.from_bytes(digest[:4], "big")
    if options.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def _pruner(options):
    import optuna

    if options.pruner == "none":
        return optuna.pruners.NopPruner()
    if options.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner()
    return optuna.pruners.MedianPruner(
        n_startup_trials=options.pruner_startup_trials, n_warmup_steps=options.pruner_warmup_epochs
    )
