"""The exclusive lock a run directory is held by while in use (`RunDirectory.lock`): the
kernel's `flock` on a file inside it, which names its holder for whoever is turned away."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from pathlib import Path

from bertkit.errors import UserError


def outermost_missing(path: Path) -> Path | None:
    """The outermost folder of `path` (itself included) that does not exist yet, if any:
    what making `path` makes."""
    return next(
        (folder for folder in reversed([path, *path.parents]) if not folder.exists()),
        None,
    )


@contextlib.contextmanager
def exclusive_lock(lock_file: Path, folder: Path):
    """Holds `flock` on `lock_file` (created if absent), writing the holder's line into it;
    a `UserError` about `folder` naming the holder when another process has it."""
    with open(lock_file, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise UserError(
                f"in use by {holder}; wait for it to end or choose another output folder",
                source=folder,
            ) from None
        handle.truncate(0)
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        handle.write(
            f"bertkit finetune (pid {os.getpid()} on {socket.gethostname()}, started {started})\n"
        )
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
