"""Every export's folder rules: the target is new or empty, the run finished, and the
files are written into a hidden staging folder beside the target that is renamed to it
once complete, so that a failure (a full disk, a folder the user may not write) leaves
nothing behind and a reader never sees half a model.

A process killed with SIGKILL runs no clean-up: its staging folder stays, named
`.<target>.<8 hex digits>.partial`. `remove_stale_staging` removes a target's, where the
caller knows no other process writes it (`finetune`'s finish step holds the run's lock).

Example:
    >>> import pathlib, tempfile
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "model"
    >>> with staging_folder(out, "the model") as staging:
    ...     _ = (staging / "weights.bin").write_bytes(b"1")
    >>> sorted(p.name for p in out.parent.iterdir()), sorted(p.name for p in out.iterdir())
    (['model'], ['weights.bin'])
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import uuid
from pathlib import Path

from bertkit.errors import UserError
from bertkit.run_dir import FINISHED, RunDirectory, read_json

# `.<target>.<8 hex digits>.partial`; the int8 export's were `.int8` before they were `.partial`.
_STAGING_NAME = r"\.{name}\.[0-9a-f]{{8}}\.(partial|int8)"


def new_export_folder(directory) -> Path:
    """`directory` as a `Path` once it is new or an empty folder (every export's rule); a
    link to a folder is that folder (the link stays a link)."""
    directory = Path(directory)
    if directory.is_symlink():
        if not directory.exists():
            raise UserError("export path is a broken link; choose another", source=directory)
        directory = directory.resolve()
    for parent in directory.parents:  # else mkdir's "File exists" names no file
        if parent.exists() and not parent.is_dir():
            raise UserError("exists and is not a folder; choose another export path", source=parent)
    if directory.exists() and not directory.is_dir():
        raise UserError("export path exists and is not a folder; choose another", source=directory)
    if directory.exists() and any(directory.iterdir()):
        raise UserError("export folder exists and is not empty; choose another", source=directory)
    return directory


def finished_run(run_dir, *, trained_will_do: bool = False) -> RunDirectory:
    """The run at `run_dir`, once `bertkit finetune` has finished it (with
    `trained_will_do`, once its training is done: a run in its finish step, or killed
    there, whose weights are final); else a `UserError` naming it."""
    run = RunDirectory.open(run_dir)
    status = run.status()
    if status == FINISHED:
        return run
    if trained_will_do and read_json(run.run_file).get("trained"):
        return run
    raise UserError(
        f"holds no finished run (run.json: {status or 'missing'}); export a run that "
        "bertkit finetune has finished",
        source=run.path,
    )


@contextlib.contextmanager
def staging_folder(directory, what: str, errors: tuple = (), reason=str):
    """A new hidden folder beside `directory` that replaces it (new, or an empty folder)
    when the block ends normally; removed, with what was written into it, however the
    block ends. An `OSError` (or one of `errors`, worded by `reason`) is a `UserError`
    naming `directory`: `cannot write <what>: <file>: No space left on device`."""
    directory = Path(directory)
    staging = directory.with_name(f".{directory.name}.{uuid.uuid4().hex[:8]}.partial")
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()  # the umask applies, as to any folder the user makes
        yield staging
        replace_folder(staging, directory)
    except (OSError, *errors) as error:
        text = write_error_reason(error, staging) if isinstance(error, OSError) else reason(error)
        raise UserError(f"cannot write {what}: {text}", source=directory) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def replace_folder(written: Path, directory: Path) -> None:
    """Renames the folder `written` to `directory`, which is new or an empty folder; an
    empty folder the user made keeps its mode (`chmod g+w` for a shared group, say)."""
    if directory.is_dir():
        os.chmod(written, stat.S_IMODE(directory.stat().st_mode))
    os.replace(written, directory)  # an empty `directory` is replaced too


def stale_staging_folders(directory) -> list[Path]:
    """The staging folders of `directory` that are left beside it (see the module
    docstring), oldest name first.

    Example:
        >>> import pathlib, tempfile
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> for name in (".model.0123abcd.partial", ".model.notes", ".other.0123abcd.partial"):
        ...     (folder / name).mkdir()
        >>> [p.name for p in stale_staging_folders(folder / "model")]
        ['.model.0123abcd.partial']
    """
    directory = Path(directory)
    pattern = re.compile(_STAGING_NAME.format(name=re.escape(directory.name)))
    if not directory.parent.is_dir():
        return []
    return sorted(
        path
        for path in directory.parent.iterdir()
        if pattern.fullmatch(path.name) and path.is_dir() and not path.is_symlink()
    )


def remove_stale_staging(directory) -> None:
    """Removes `stale_staging_folders(directory)`: only where no other process may be
    writing `directory` now."""
    for path in stale_staging_folders(directory):
        shutil.rmtree(path, ignore_errors=True)


def write_error_reason(error: OSError, staging: Path) -> str:
    """`No space left on device`, and which file of the export it was writing when the
    error says (`model.safetensors: No space left on device`).

    Example:
        >>> import errno
        >>> write_error_reason(OSError(errno.ENOSPC, "No space left on device",
        ...                            "/x/.m.0123abcd.partial/config.json"),
        ...                    Path("/x/.m.0123abcd.partial"))
        'config.json: No space left on device'
    """
    reason = error.strerror or str(error)
    if error.filename:
        with contextlib.suppress(ValueError):  # a file outside the staging folder
            name = Path(error.filename).relative_to(staging)
            return f"{name}: {reason}" if name.parts else reason
    return reason


def os_error_of(message: str, filename=None) -> OSError | None:
    """The `OSError` a library's error text reports with Rust's `(os error N)` (safetensors:
    `I/O error: No space left on device (os error 28)`), or None.

    Example:
        >>> import errno
        >>> os_error_of("Error while serializing: I/O error: No space left on device "
        ...             "(os error 28)", "m.safetensors").errno == errno.ENOSPC
        True
    """
    found = re.search(r"\(os error (\d+)\)", message)
    if found is None:
        return None
    number = int(found.group(1))
    return OSError(number, os.strerror(number), filename)
