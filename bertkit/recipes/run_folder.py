"""Where a run directory goes: `output_dir`, `--output` and `--set output_dir=` all resolve
here, so that each refuses the same folders with the same message."""

from __future__ import annotations

from pathlib import Path

from bertkit.errors import UserError


def resolve_run_folder(value, base=None) -> Path:
    """The absolute folder a run directory named `value` (relative ones against `base`, else
    the current directory) is, or a `UserError` without location (its caller names it).

    A leading `~` is expanded (`~/runs/sst2`, `~alice/runs`), as every path in a recipe is:
    YAML and Python have no shell to expand it, and a folder literally named `~` is never
    what was meant (`rm -rf ~` would be the next command). One that names no home folder
    here (`~nobody/x`) is refused. So is the filesystem root: a run replaced with
    `--overwrite` moves aside beside its folder, and `/` has no parent to hold it.

    Example:
        >>> resolve_run_folder("runs/a", "/tmp").as_posix()
        '/tmp/runs/a'
        >>> resolve_run_folder("/")
        Traceback (most recent call last):
        ...
        bertkit.errors.UserError: '/' is the filesystem root; name a folder for the run
    """
    try:
        path = Path(value).expanduser()
    except RuntimeError:  # Python 3.11-3.12: no such user (later ones leave it as it is)
        path = Path(value)
    if path.parts and path.parts[0].startswith("~"):
        raise UserError(
            f"'{value}' starts with '{path.parts[0]}', which names no home folder here; "
            "write $HOME/... or the full path"
        )
    resolved = (Path(base or Path.cwd()) / path).resolve()
    if not resolved.name:
        raise UserError(f"'{value}' is the filesystem root; name a folder for the run")
    return resolved
