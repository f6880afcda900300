"""Reading users' data files: the one place that opens, decodes and parses them.

Every reader (CoNLL, SQuAD, tabular rows, pretraining corpora, recipes) goes
through these functions, so a file has the same rules and its problems the
same words wherever it is read: UTF-8 with an optional byte-order mark,
`\\r\\n` or `\\n` line endings, JSON lines, the kind of file told by its name,
`-` for stdin (`<stdin>` in messages), `predict`'s inputs (`predict_inputs`; with
`arrives_over_time`, `bertkit.tabular.prediction_inputs` reads them as `bertkit predict` does).
Each problem is a `UserError` naming the file (and the line where there is one):

    file not found
    is a directory, expected a file
    cannot read the file: <reason>
    not UTF-8 text (byte <offset in the file>)
    invalid JSON: <reason>
    expected a JSON object
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import stat
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from bertkit.errors import UserError

_BOM = b"\xef\xbb\xbf"
# How long a started chunk of arriving inputs waits for more before it is handed on.
ARRIVAL_WINDOW_SECONDS = 0.05
# `predict`'s default bound on the characters of one input (all its texts together): the
# tagging model spent 115 s of CPU on one 600,000-character text.
MAX_INPUT_CHARACTERS = 100_000
# A SavedModel's default bound on the characters of one request (all its inputs together).
MAX_REQUEST_CHARACTERS = 1_000_000
_KINDS = {
    ".jsonl": "jsonl",
    ".jsonlines": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".csv": "csv",
    ".tsv": "tsv",
    ".txt": "text",
}


def kind_from_name(path) -> str | None:
    """The kind of file its extension names: jsonl, json, csv, tsv, text, or None.

    Example:
        >>> kind_from_name("dev.JSONL"), kind_from_name("train.txt"), kind_from_name("x.data")
        ('jsonl', 'text', None)
    """
    return _KINDS.get(Path(path).suffix.lower())


def source_name(path) -> str:
    """How messages name a file: its path, or `<stdin>` for `-`.

    Example:
        >>> source_name("-"), source_name("data/dev.tsv")
        ('<stdin>', 'data/dev.tsv')
    """
    return "<stdin>" if str(path) == "-" else str(path)


def read_text(path) -> str:
    """A whole file's text, decoded as UTF-8 (a leading BOM dropped), with `\\n` line endings.

    Example:
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
        >>> _ = path.write_bytes(b"\\xef\\xbb\\xbfone\\r\\ntwo\\r")
        >>> read_text(path)
        'one\\ntwo\\n'
    """
    with _opened(path) as file:
        data = _read(file, path)
    return _decode(data, path, 0, 1, first=True).replace("\r\n", "\n").replace("\r", "\n")


def numbered_lines(path, keep_ends: bool = False) -> Iterator[tuple[int, str]]:
    """Yields `(line number, line)` from a UTF-8 file, streaming (corpora can be large).

    Lines are split at `\\n` only (a bare `\\r` stays in its line); a leading BOM is
    dropped. Without `keep_ends` the line ending (`\\n` or `\\r\\n`) is removed;
    with it, lines are as in the file (what `csv.reader` expects).

    Example:
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
        >>> _ = path.write_bytes(b"\\xef\\xbb\\xbfone\\r\\ntwo")
        >>> list(numbered_lines(path))
        [(1, 'one'), (2, 'two')]
    """
    with _opened(path) as file:
        offset = 0
        for number, raw in enumerate(_read_lines(file, path), start=1):
            text = _decode(raw, path, offset, number, first=number == 1)
            offset += len(raw)
            yield number, text if keep_ends else text.rstrip("\n").removesuffix("\r")


def parse_json(text: str, source, line: int | None = None):
    """`json.loads`, its errors as `UserError`s at `line` (else the error's own line).

    Example:
        >>> parse_json('{"a": 1}', "x.json")
        {'a': 1}
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise UserError(
            f"invalid JSON: {error.msg}",
            source=source,
            line=line if line is not None else error.lineno,
        ) from None
    except ValueError:  # Python turns at most sys.get_int_max_str_digits() digits into an int
        raise UserError(
            f"invalid JSON: a number of over {sys.get_int_max_str_digits():,} digits",
            source=source,
            line=line,
        ) from None


def json_lines(lines: Iterable[tuple[int, str]], source, objects: bool = False):
    """Yields `(line number, value)` for every non-blank line of numbered JSON lines.

    With `objects`, a value that is not a JSON object is an error.

    Example:
        >>> list(json_lines([(1, '{"a": 1}'), (2, "  "), (3, "[2]")], "x.jsonl"))
        [(1, {'a': 1}), (3, [2])]
    """
    for number, text in lines:
        if text.strip():
            value = parse_json(text, source, number)
            if objects and not isinstance(value, dict):
                raise UserError("expected a JSON object", source=source, line=number)
            yield number, value


def read_json_lines(path, objects: bool = False) -> Iterator[tuple[int, object]]:
    """`json_lines` over a file's lines, streaming."""
    return json_lines(numbered_lines(path), source_name(path), objects)


def predict_inputs(path) -> Iterator[object]:
    """Yields one `predict` input per line of a UTF-8 file (`-`: stdin) as lines arrive.

    A line holding a JSON array, object or string is that value (a text pair, an
    object with named fields); any other line is its text. A blank line is None,
    which `predict` answers with an "empty input" error object, so that output
    line N still belongs to input line N.

    Example:
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "in.txt"
        >>> _ = path.write_text('a fine film\\n["premise", "hypothesis"]\\n\\n[broken\\n')
        >>> list(predict_inputs(path))
        ['a fine film', ['premise', 'hypothesis'], None, '[broken']
    """
    for _, line in numbered_lines(path):
        yield _json_or_text(line) if line.strip() else None


def input_text(value, name: str) -> str:
    """`value`, the text `name` of a prediction input (a task's `parse_input` checks its
    texts with it): a `UserError` unless it is a text with more than whitespace in it.
    An empty text is a mistake upstream (a blank line, an empty cell, a field left
    unfilled), not a question for the model: `predict` and `serve` refuse it alike.

    Example:
        >>> input_text(" ", "text_pair")
        Traceback (most recent call last):
        bertkit.errors.UserError: 'text_pair' is empty
    """
    if not isinstance(value, str):
        raise UserError(f"'{name}' must be a text, got {value!r:.40}")
    if not value.strip():
        raise UserError(f"'{name}' is empty")
    return value


def arrives_over_time(path) -> bool:
    """Whether a file (`-`: stdin) is a pipe, a terminal or a socket, whose lines arrive
    over time (`tail -f log | bertkit predict`), rather than a file that can be read whole.

    Example:
        >>> import tempfile
        >>> arrives_over_time(tempfile.mkstemp()[1]), arrives_over_time("/no/such/file")
        (False, False)
    """
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode if str(path) == "-" else os.stat(path).st_mode
    except (OSError, ValueError, AttributeError):  # missing, or no stdin: reading says so
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode)


def _json_or_text(line: str):
    if line.lstrip()[:1] not in ("[", "{", '"'):
        return line
    # "[1, 2", 100,000 nested "[" or a number of 5,000 digits (over Python's int limit): a text
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return line


def arriving_chunks(items: Iterable, size: int, wait: float = ARRIVAL_WINDOW_SECONDS):
    """Lists of up to `size` items, each handed on when full or when no further item
    has arrived for `wait` seconds.

    For inputs that come over time (`tail -f log | bertkit predict`): a line is
    answered soon after it arrives, while a fast source still fills whole chunks.
    `items` is read on a thread; an error it raises comes after the items before it.

    Example:
        >>> list(arriving_chunks(iter(range(5)), 2, wait=10))
        [[0, 1], [2, 3], [4]]
    """
    arrived: queue.Queue = queue.Queue(maxsize=2 * size)  # a fast source is not read far ahead
    stop = threading.Event()
    threading.Thread(target=_feed, args=(items, arrived, stop), daemon=True).start()
    chunk: list = []
    try:
        while not isinstance(item := _next_arrived(arrived, wait if chunk else None), _End):
            if item is not _NOTHING_NEW:
                chunk.append(item)
            if item is _NOTHING_NEW or len(chunk) == size:  # (a wait starts with an item)
                yield chunk
                chunk = []
        if chunk:
            yield chunk
        if item.error is not None:
            raise item.error
    finally:
        stop.set()


class _End:
    """The end of the items: they are done, or reading them raised `error`."""

    def __init__(self, error: Exception | None = None):
        self.error = error


_NOTHING_NEW = object()  # no item arrived within the wait


def _next_arrived(arrived: queue.Queue, timeout: float | None):
    try:
        return arrived.get(timeout=timeout)
    except queue.Empty:
        return _NOTHING_NEW


def _feed(items: Iterable, arrived: queue.Queue, stop: threading.Event) -> None:
    """Reads `items` into `arrived` until they end, fail, or the reader stops listening."""
    end = _End()
    try:
        for item in items:
            if not _put(arrived, item, stop):
                return
    except Exception as error:  # raised again by the reader, after the items before it
        end = _End(error)
    _put(arrived, end, stop)


def _put(arrived: queue.Queue, item, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            arrived.put(item, timeout=0.1)
            return True
        except queue.Full:
            pass
    return False


def _opened(path):
    if str(path) == "-":
        return contextlib.nullcontext(sys.stdin.buffer)  # the caller's `with` keeps it open
    try:
        return open(path, "rb")  # noqa: SIM115  (closed by the caller's `with`)
    except FileNotFoundError:
        raise UserError("file not found", source=path) from None
    except IsADirectoryError:
        raise UserError("is a directory, expected a file", source=path) from None
    except OSError as error:
        raise UserError(f"cannot read the file: {error.strerror}", source=path) from None


def _read(file, path) -> bytes:
    try:
        return file.read()
    except OSError as error:
        raise UserError(
            f"cannot read the file: {error.strerror}", source=source_name(path)
        ) from None


def _read_lines(file, path) -> Iterator[bytes]:
    try:
        yield from file
    except OSError as error:
        raise UserError(
            f"cannot read the file: {error.strerror}", source=source_name(path)
        ) from None


def _decode(data: bytes, path, offset: int, line: int, first: bool) -> str:
    """UTF-8 text of `data`, which starts at byte `offset` and line `line` of the file."""
    skip = len(_BOM) if first and data.startswith(_BOM) else 0
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as error:
        line += data.count(b"\n", 0, skip + error.start)
        raise UserError(
            f"not UTF-8 text (byte {offset + skip + error.start})",
            source=source_name(path),
            line=line,
        ) from None
