"""Task plugins, found through the `bertkit.tasks` entry-point group.

Nothing is imported until a task is asked for by name; the built-in tasks are
declared in `pyproject.toml` exactly as a third-party distribution declares its
own. A plugin that fails to import is reported with its entry point and
distribution and does not break any other task.
"""

from __future__ import annotations

import dataclasses
import difflib
from importlib.metadata import EntryPoint, entry_points

from bertkit.errors import UserError

GROUP = "bertkit.tasks"


@dataclasses.dataclass(frozen=True)
class TaskInfo:
    """One row of `bertkit tasks`: a loaded task, or the reason it failed to load."""

    name: str
    entry_point: str
    distribution: str
    description: str = ""
    predict_options: tuple = ()  # the task's `PredictOption`s: flags of `bertkit predict`
    error: str | None = None


def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def _name_taken_twice(name: str) -> str | None:
    """Why task `name` cannot be used when two distributions declare it (neither may
    silently win: a run would train one and be reloaded as the other), else None."""
    declared = {
        (ep.value, _distribution(ep)) for ep in entry_points(group=GROUP) if ep.name == name
    }
    if len(declared) < 2:
        return None
    both = " and ".join(f"{value} from {dist}" for value, dist in sorted(declared))
    return f"task '{name}' is declared twice ({both}): uninstall one of them"


def task_names() -> list[str]:
    """Names of the installed tasks, without importing any of them."""
    return sorted(_entry_points())


def _distribution(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "unknown distribution"


def load_task(name: str, *, source=None, line=None, key="task"):
    """Imports and returns the task class registered under `name`.

    Example:
        >>> load_task("classification").name
        'classification'
        >>> load_task("clasification")
        Traceback (most recent call last):
        ...
        bertkit.errors.UserError: task: unknown task 'clasification'; did you mean ...
    """
    points = _entry_points()
    if name not in points:
        available = ", ".join(sorted(points)) or "none installed"
        close = difflib.get_close_matches(str(name), list(points), n=1)
        hint = f" did you mean '{close[0]}'?" if close else ""
        raise UserError(
            f"unknown task '{name}';{hint} available: {available}",
            source=source,
            line=line,
            key=key,
        )
    ep, twice = points[name], _name_taken_twice(name)
    if twice:
        raise UserError(twice, source=source, line=line, key=key)
    try:
        task_class = ep.load()
    except Exception as error:  # a broken plugin must not take the CLI down with a traceback
        raise UserError(
            f"task plugin '{name}' ({ep.value}, from {_distribution(ep)}) failed to import: "
            f"{type(error).__name__}: {error}",
            source=source,
            line=line,
            key=key,
        ) from None
    return task_class


def describe_tasks() -> list[TaskInfo]:
    """Every installed task with its description, or the error that kept it from loading."""
    infos = []
    for name, ep in sorted(_entry_points().items()):
        twice = _name_taken_twice(name)
        if twice:
            infos.append(TaskInfo(name, ep.value, _distribution(ep), error=twice))
            continue
        try:
            task_class = ep.load()
            description = (getattr(task_class, "description", "") or "").strip()
            options = tuple(getattr(task_class, "predict_options", ()))
            infos.append(TaskInfo(name, ep.value, _distribution(ep), description, options))
        except Exception as error:
            infos.append(
                TaskInfo(
                    name, ep.value, _distribution(ep), error=f"{type(error).__name__}: {error}"
                )
            )
    return infos
