"""Rows of CSV, TSV and JSON-lines files, each with its line number for error messages."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

from bertkit.errors import UserError

FORMATS = ("csv", "tsv", "jsonl")
_EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".txt": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}


def detect_format(path, declared: str = "auto", allowed=FORMATS) -> str:
    """The declared format, or the one the file name implies.

    Example:
        >>> detect_format("data/train.tsv"), detect_format("x.data", "csv")
        ('tsv', 'csv')
    """
    if declared != "auto":
        if declared not in allowed:
            raise UserError(f"unknown format '{declared}'; expected one of: auto, "
                            f"{', '.join(allowed)}", key="data.format")
        return declared
    fmt = _EXTENSIONS.get(Path(path).suffix.lower())
    if fmt not in allowed:
        raise UserError(f"cannot tell the format from the file name; set data.format to one "
                        f"of: {', '.join(allowed)}", source=path)
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
    path = Path(path)
    try:
        handle = path.open(encoding="utf-8", newline="")
    except FileNotFoundError:
        raise UserError("file not found", source=path) from None
    except OSError as error:
        raise UserError(f"cannot read file: {error.strerror}", source=path) from None
    with handle:
        try:
            if fmt == "jsonl":
                rows = _json_rows(handle, path)
            else:
                rows = _delimited_rows(handle, fmt, path)
            for line, row in rows:
                yield line, _require(row, columns, path, line)
        except UnicodeDecodeError:
            raise UserError("not UTF-8 text", source=path) from None


def _delimited_rows(handle, fmt, path):
    if fmt == "tsv":
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
    else:
        reader = csv.reader(handle)
    header = next(reader, None)
    if not header:
        raise UserError("empty file; expected a header line naming the columns", source=path,
                        line=1)
    header = [name.strip() for name in header]
    for fields in reader:
        if not fields or fields == [""]:
            continue
        if len(fields) != len(header):
            raise UserError(f"expected {len(header)} fields ({', '.join(header)}), "
                            f"found {len(fields)}", source=path, line=reader.line_num)
        yield reader.line_num, dict(zip(header, fields, strict=True))


def _json_rows(handle, path):
    for line, text in enumerate(handle, start=1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as error:
            raise UserError(f"invalid JSON: {error.msg}", source=path, line=line) from None
        if not isinstance(row, dict):
            raise UserError("expected a JSON object", source=path, line=line)
        yield line, row


def _require(row: dict, columns: list[str], path, line) -> dict:
    for column in columns:
        if column not in row:
            available = ", ".join(map(str, row)) or "none"
            raise UserError(f"missing column '{column}' (columns: {available})", source=path,
                            line=line, key=column)
        value = row[column]
        if value is None or (isinstance(value, str) and not value.strip()):
            raise UserError(f"empty value in column '{column}'", source=path, line=line,
                            key=column)
    return row
