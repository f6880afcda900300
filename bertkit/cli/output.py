"""Where `bertkit predict` writes its JSON lines: stdout, or a file replaced only when every
input is done; and what JSON cannot hold (NaN, infinity) made null."""

from __future__ import annotations

import contextlib
import math
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


def finite(value):
    """JSON has no NaN or infinity: a diverged model's scores are printed as null.

    Example:
        >>> finite({"score": float("nan"), "top_k": [{"score": 0.5}]})
        {'score': None, 'top_k': [{'score': 0.5}]}
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value
