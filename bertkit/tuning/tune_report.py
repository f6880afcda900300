"""The report of a hyperparameter search: `report.md` with the best trial, every trial,
and Optuna's matplotlib plots of the optimization history and parameter importances."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from bertkit.report import markdown_table, pyplot

HISTORY_PNG, IMPORTANCES_PNG = "optimization_history.png", "param_importances.png"


def write_tune_report(study, folder) -> Path:
    """Writes `report.md` and its PNGs into the study folder and points `best` at the
    best trial's run directory; returns the report's path.

    Example (a study of made-up trials, no training):
        >>> import optuna, tempfile
        >>> optuna.logging.set_verbosity(optuna.logging.ERROR)
        >>> study = optuna.create_study(direction="maximize")
        >>> study.set_user_attr("monitor", "accuracy")
        >>> study.optimize(lambda t: 1 - (t.suggest_float("training.learning_rate",
        ...                               1e-5, 1e-3, log=True) - 1e-4) ** 2, n_trials=3)
        >>> path = write_tune_report(study, tempfile.mkdtemp())
        >>> "## Trials" in path.read_text(), path.with_name(HISTORY_PNG).exists()
        (True, True)
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)  # a worker of a shared study may have none yet
    trials = [
        trial for trial in study.get_trials(deepcopy=False) if not trial.user_attrs.get("surplus")
    ]  # see `bertkit.tuning.tuner.SurplusTrial`
    monitor = study.user_attrs.get("monitor", "value")
    best = _best_trial(study)
    sections = [
        f"# Hyperparameter search: {study.study_name}",
        _summary(trials),
        _best_section(best, monitor, folder, study.direction.name.lower()),
        "## Trials",
        _trials_table(trials, monitor, best),
        _plots(study, folder),
    ]
    if best is not None:
        _point_best(folder, best)
    path = folder / "report.md"
    temporary = folder / ".report.md.partial"  # several workers may write it at once
    temporary.write_text("\n\n".join(s for s in sections if s) + "\n")
    os.replace(temporary, path)
    return path


def _best_trial(study):
    try:
        return study.best_trial
    except ValueError:  # no complete trial yet
        return None


def _summary(trials) -> str:
    states = [trial.state.name for trial in trials]
    counts = {
        name.lower(): states.count(name)
        for name in ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")
    }
    return "Trials: " + ", ".join(f"{count} {name}" for name, count in counts.items() if count)


def _best_section(best, monitor: str, folder: Path, direction: str) -> str:
    if best is None:
        return "No trial has completed yet."
    run_dir = _run_dir(best, folder)
    path = Path(best.user_attrs.get("run_dir", ""))
    ship = (
        "its `saved_model/` is the model to ship"
        if (path / "saved_model").is_dir()  # not with the recipe's export.saved_model: false
        else f"`bertkit export {path} --out DIR` writes the model to ship"
    )
    lines = [
        f"## Best trial: {best.number}",
        f"Validation {monitor}: **{best.value:.4f}** ({direction}d). Run directory: "
        f"`{run_dir}` (also `best/`); {ship}.",
        "",
        markdown_table(
            ["parameter", "value"], [[key, _value(value)] for key, value in best.params.items()]
        ),
    ]
    return "\n".join(lines)


def _trials_table(trials, monitor: str, best) -> str:
    keys = list(dict.fromkeys(key for trial in trials for key in trial.params))
    header = ["trial", "state", *keys, monitor, "epochs", "minutes", "run directory"]
    rows = []
    for trial in trials:
        is_best = best is not None and trial.number == best.number
        state = trial.state.name.lower() + (" (best)" if is_best else "")
        epochs = trial.last_step if trial.intermediate_values else None
        minutes = f"{trial.duration.total_seconds() / 60:.1f}" if trial.duration else None
        rows.append(
            [
                trial.number,
                state,
                *(_value(trial.params.get(key)) for key in keys),
                trial.value,
                epochs,
                minutes,
                Path(trial.user_attrs.get("run_dir", "")).name or None,
            ]
        )
    return markdown_table(header, rows)


def _value(value):
    return f"{value:.3g}" if isinstance(value, float) else value


def _run_dir(trial, folder: Path) -> str:
    path = Path(trial.user_attrs.get("run_dir", ""))
    return path.name + "/" if path.parent == folder else str(path)


def _plots(study, folder: Path) -> str:
    """Optuna's optimization history and parameter importances, as PNGs in `folder`."""
    import optuna
    from optuna.visualization import matplotlib as plots

    pyplot()  # the file-only Agg backend
    lines = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # e.g. "parameter importances will be equal" when every trial scored alike
        warnings.simplefilter("ignore", UserWarning)
        for name, plot, title in (
            (HISTORY_PNG, plots.plot_optimization_history, "optimization history"),
            (IMPORTANCES_PNG, plots.plot_param_importances, "parameter importances"),
        ):
            try:
                axes = plot(study)
                if name == HISTORY_PNG:
                    axes.set_ylabel(f"validation {study.user_attrs.get('monitor', 'value')}")
                _save(axes, folder / name)
            except (ValueError, RuntimeError, ZeroDivisionError) as error:
                lines.append(f"No {title} plot yet: {error}")
                continue
            lines.append(f"## {title.capitalize()}\n\n![{title}]({name})")
    return "\n\n".join(lines)


def _save(axes, path: Path) -> None:
    figure = axes.figure
    figure.set_size_inches(7, 4)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot().close(figure)


def _point_best(folder: Path, best) -> None:
    """`best` -> the best trial's folder, replaced in one step (a symlink renamed over it)."""
    target = Path(best.user_attrs.get("run_dir", ""))
    if not target.name or target.parent != folder:
        return
    temporary = folder / f".best.{os.getpid()}"
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(target.name)
    os.replace(temporary, folder / "best")
