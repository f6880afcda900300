"""The one error type for mistakes a user can fix: bad recipes, files and data."""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the user's input, reported as one line with its location.

    The CLI prints `str(error)` and exits with status 2; no traceback.

    Args:
        message: what is wrong, in the user's terms.
        source: the file (or `--set`, or another origin) the mistake is in.
        line: 1-based line number inside `source`, when known.
        key: dotted key path (`training.learning_rate`) or column name.

    Example:
        >>> str(UserError("expected a number, got 'fast'", source="ner.yaml",
        ...               line=12, key="training.learning_rate"))
        "ner.yaml:12: training.learning_rate: expected a number, got 'fast'"
    """

    def __init__(self, message: str, *, source=None, line=None, key=None):
        super().__init__(message)
        self.message = message
        self.source = None if source is None else str(source)
        self.line = line
        self.key = key

    def __str__(self) -> str:
        where = ""
        if self.source is not None:
            where = self.source + (f":{self.line}" if self.line is not None else "") + ": "
        key = f"{self.key}: " if self.key else ""
        return f"{where}{key}{self.message}"
