"""Where `bertkit predict` writes its JSON lines: stdout, or a file replaced only when every
input is done (what JSON cannot hold, NaN and infinity, is made null by
`bertkit.serving.protocol.finite`, as `bertkit serve` answers).

A file that cannot be written (a full disk, a folder the user may not write) is a
`UserError` naming it, and leaves neither the file nor its temporary behind.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from bertkit.errors import UserError


@contextlib.contextmanager
def atomic_output(path):
    """stdout, or a file that replaces `path` only when every input is done."""
    if path is None:
        yield sys.stdout
        return
    target = Path(path)
    temporary = target.with_name(f".{target.name}.partial")
    try:
        with named_write_errors(path):
            file = open(temporary, "w", encoding="utf-8")  # noqa: SIM115  (closed below)
        with file:  # closed however the block ends
            yield OutputFile(file, path)
            with named_write_errors(path):
                file.close()  # the last buffered lines: a full disk may refuse them
        with named_write_errors(path):
            os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


class OutputFile:
    """An open text file whose writes fail as a `UserError` naming `path`, the file the
    user asked for (not its temporary).

    Example:
        >>> import io
        >>> print("one line", file=OutputFile(io.StringIO(), "out.jsonl"))
    """

    def __init__(self, file, path):
        self.file = file
        self.path = path

    def write(self, text: str) -> int:
        with named_write_errors(self.path):
            return self.file.write(text)

    def flush(self) -> None:
        with named_write_errors(self.path):
            self.file.flush()


@contextlib.contextmanager
def named_write_errors(path):
    """An `OSError` of writing `path` as a one-line `UserError` naming it.

    Example:
        >>> import errno
        >>> with named_write_errors("out.jsonl"):
        ...     raise OSError(errno.ENOSPC, "No space left on device")
        Traceback (most recent call last):
        bertkit.errors.UserError: out.jsonl: cannot write the file: No space left on device
    """
    try:
        yield
    except FileNotFoundError:
        raise UserError("folder not found", source=path) from None
    except IsADirectoryError:
        raise UserError("is a folder", source=path) from None
    except OSError as error:
        reason = error.strerror or str(error)
        raise UserError(f"cannot write the file: {reason}", source=path) from None
