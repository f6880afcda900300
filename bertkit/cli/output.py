"""Where `bertkit predict` writes its JSON lines: stdout, or a file replaced only when every
input is done (what JSON cannot hold, NaN and infinity, is made null by
`bertkit.serving.protocol.finite`, as `bertkit serve` answers)."""

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
        with open(temporary, "w", encoding="utf-8") as file:
            yield file
        os.replace(temporary, target)
    except FileNotFoundError:
        raise UserError("folder not found", source=path) from None
    except IsADirectoryError:
        raise UserError("is a folder", source=path) from None
    finally:
        temporary.unlink(missing_ok=True)
