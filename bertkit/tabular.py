"""Rows of CSV, TSV and JSON-lines files, each with its line number for error messages."""

from __future__ import annotations

import contextlib
import csv
from collections.abc import Iterator

from bertkit.errors import UserError
from bertkit.files import (
    arrives_over_time,
    input_text,
    kind_from_name,
    numbered_lines,
    predict_inputs,
    read_json_lines,
    source_name,
)

FORMATS = ("csv", "tsv", "jsonl")
# A longer cell is refused, named by file, line and column. Python's csv module stops at the
# same size (its default field limit) with an error that names none of them.
MAX_CELL_CHARACTERS = 131_072
# `bertkit.files.kind_from_name` -> format: a .txt file is TSV, a .json file JSON lines.
_FORMAT_OF_KIND = {"csv": "csv", "tsv": "tsv", "text": "tsv", "jsonl": "jsonl", "json": "jsonl"}


def detect_format(path, declared: str = "auto", allowed=FORMATS) -> str:
    """The declared format, or the one the file name implies.

    Example:
        >>> detect_format("data/train.tsv"), detect_format("x.data", "csv")
        ('tsv', 'csv')
    """
    if declared != "auto":
        if declared not in allowed:
            raise UserError(
                f"unknown format '{declared}'; expected one of: auto, {', '.join(allowed)}",
                key="data.format",
            )
        return declared
    fmt = _FORMAT_OF_KIND.get(kind_from_name(path))
    if fmt not in allowed:
        raise UserError(
            f"cannot tell the format from the file name; set data.format to one "
            f"of: {', '.join(allowed)}",
            source=path,
        )
    return fmt


def read_rows(path, fmt: str, columns: list[str]) -> Iterator[tuple[int, dict]]:
    """Yields (line number, row) with every column in `columns` present and non-empty.

    CSV and TSV files need a header line naming the columns. TSV is read without
    quote processing (GLUE files contain bare quotes).

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "d.tsv")
        >>> _ = open(path, "w").write("sentence\\tlabel\\nfine film\\t1\\n")
        >>> list(read_rows(path, "tsv", ["sentence", "label"]))
        [(2, {'sentence': 'fine film', 'label': '1'})]
    """
    if fmt == "jsonl":
        rows = read_json_lines(path, objects=True)
    else:
        rows = _delimited_rows(path, fmt)
    for line, row in rows:
        yield line, _require(row, columns, path, line)


def read_records(path, fmt: str) -> Iterator[tuple[int, dict]]:
    """Yields (line number, row) of every data row, whatever its columns hold."""
    if fmt == "jsonl":
        return read_json_lines(path, objects=True)
    return _delimited_rows(path, fmt)


def column_inputs(path, fmt: str, column: str, pair_column: str | None = None) -> Iterator:
    """Yields one `predict` input per data row of a file (`-`: stdin), as rows arrive.

    The input is the column's text, or a [text, pair] pair with `pair_column`; an
    empty cell gives None (which `predict` answers with an "empty input" error).

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "d.tsv")
        >>> _ = open(path, "w").write("sentence\\tlabel\\nfine film\\t1\\n \\t0\\n")
        >>> list(column_inputs(path, "auto", "sentence"))
        ['fine film', None]
    """
    names = (column, pair_column) if pair_column else (column,)
    for line, row in read_records(path, detect_format(path, fmt)):
        values = [_cell(row, name, path, line) for name in names]
        yield None if None in values else values[0] if len(values) == 1 else values


def prediction_inputs(
    path, *, column: str | None = None, pair_column: str | None = None, file_format: str = "auto"
):
    """`predict`'s inputs from a file (`-`: stdin), read as `bertkit predict` reads them: one
    per line (`bertkit.files.predict_inputs`), or with `column` one per data row of a TSV,
    CSV or JSON-lines file (`column_inputs`).

    A regular file's inputs come as a list, read whole before anything is predicted (its
    errors come before a model loads); a pipe's, a terminal's or a socket's as an iterator,
    to predict as they arrive (`bertkit.files.arrives_over_time`). This lives here rather
    than in `bertkit.files` because it reads columns, and this module, which reads tabular
    rows, is built on `bertkit.files`, which imports nothing of bertkit's above it.

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "d.tsv")
        >>> _ = open(path, "w").write("sentence\\tlabel\\nfine film\\t1\\n")
        >>> prediction_inputs(path), prediction_inputs(path, column="sentence")
        (['sentence\\tlabel', 'fine film\\t1'], ['fine film'])
    """
    if pair_column and not column:
        raise UserError("pair_column needs column (the first text's column)")
    if column and str(path) == "-" and file_format == "auto":
        raise UserError("a column of stdin needs file_format tsv, csv or jsonl")
    if column:
        inputs = column_inputs(path, file_format, column, pair_column)
    else:
        inputs = predict_inputs(path)
    return inputs if arrives_over_time(path) else list(inputs)


def text_and_pair(value, text: str = "text", pair: str | None = None) -> tuple:
    """(text, text pair or None) of one prediction input of a task that reads a text or a
    text pair: a text, a [text, text_pair] pair, or an object with the data's `text` /
    `pair` column names (or "text" / "text_pair"). With `pair` set the input must be a
    pair, without it a single text: the model was trained on one or the other. The texts
    are checked with `bertkit.files.input_text`.

    Example:
        >>> text_and_pair({"sentence1": "a cat", "sentence2": "a dog"}, "sentence1", "sentence2")
        ('a cat', 'a dog')
        >>> text_and_pair(["a cat", "a dog"])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        bertkit.errors.UserError: this model reads single texts: expected a text or ...
    """
    first, second = _text_fields(value, text, pair)
    if pair and second is None:  # its featurizer needs both
        raise UserError(
            f"this model reads text pairs: expected a [text, text_pair] pair or an object "
            f"with '{text}' and '{pair}', got {value!r:.80}"
        )
    if not pair and second is not None:  # never trained on two
        raise UserError(
            f"this model reads single texts: expected a text or an object with "
            f"'{text}', got a pair {value!r:.80}"
        )
    input_text(first, text)
    return first, None if second is None else input_text(second, pair)


def _text_fields(value, text: str, pair: str | None) -> tuple:
    if isinstance(value, str):
        return value, None
    if isinstance(value, (list, tuple)) and len(value) == 2:
        if not all(isinstance(item, str) for item in value):  # ["a", null] is no pair
            raise UserError(f"a [text, text_pair] pair must be two texts, got {value!r:.80}")
        return value[0], value[1]
    if isinstance(value, dict):
        first = value.get(text, value.get("text"))
        if isinstance(first, str):
            return first, value.get(pair or "text_pair", value.get("text_pair"))
    raise UserError(
        f"expected a text, a [text, text_pair] pair or an object with '{text}', got {value!r:.80}"
    )


def _cell(row: dict, name: str, path, line: int):
    if name not in row:
        raise UserError(
            f"missing column '{name}' (columns: {', '.join(map(str, row)) or 'none'})",
            source=source_name(path),
            line=line,
        )
    value = row[name]
    return value if isinstance(value, str) and value.strip() else None


def _delimited_rows(path, fmt):
    handle = (text for _, text in numbered_lines(path, keep_ends=True))
    if fmt == "tsv":
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
    else:
        reader = csv.reader(handle)
    source = source_name(path)
    header = _next_fields(reader, source, None)
    if not header:
        raise UserError(
            "empty file; expected a header line naming the columns", source=source, line=1
        )
    header = [name.strip() for name in header]
    while (fields := _next_fields(reader, source, header)) is not None:
        if not fields or fields == [""]:
            continue
        if len(fields) != len(header):
            raise UserError(
                f"expected {len(header)} fields ({', '.join(header)}), found {len(fields)}",
                source=source,
                line=reader.line_num,
            )
        yield reader.line_num, dict(zip(header, fields, strict=True))


def _next_fields(reader, source: str, header: list | None) -> list | None:
    """The next record's fields (None at the end); a cell over `MAX_CELL_CHARACTERS` is an
    error naming its column."""
    with _field_limit(2**31 - 1):  # csv's own limit names no column: cells are measured below
        fields = next(reader, None)
    for index, field in enumerate(fields or ()):
        if len(field) > MAX_CELL_CHARACTERS:
            column = header[index] if header and index < len(header) else f"column {index + 1}"
            raise UserError(
                f"a cell of {len(field):,} characters, over the limit of "
                f"{MAX_CELL_CHARACTERS:,} (128 KiB)",
                source=source,
                line=reader.line_num,
                key=column,
            )
    return fields


@contextlib.contextmanager
def _field_limit(limit: int):
    """csv's field size limit (a setting of the whole process) raised for one record."""
    previous = csv.field_size_limit(limit)
    try:
        yield
    finally:
        csv.field_size_limit(previous)


def _require(row: dict, columns: list[str], path, line) -> dict:
    for column in columns:
        if column not in row:
            available = ", ".join(map(str, row)) or "none"
            raise UserError(
                f"missing column '{column}' (columns: {available})",
                source=path,
                line=line,
                key=column,
            )
        value = row[column]
        if value is None or (isinstance(value, str) and not value.strip()):
            raise UserError(f"empty value in column '{column}'", source=path, line=line, key=column)
    return row
