"""Readers for tagged sentences: CoNLL column files and JSON lines.

Both return `TaggedSentence`s that remember where they came from, so a later
problem with a sentence (a tag outside the label set, say) can still be
reported as `file:line`. Every problem in the file itself raises `UserError`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from bertkit.errors import UserError
from bertkit.files import parse_json, read_text

DOCSTART = "-DOCSTART-"
# Spaces and tabs only: str.split() would also split on the no-break spaces some tokens hold.
_COLUMN_SEPARATOR = re.compile(r"[ \t]+")


@dataclass(frozen=True)
class TaggedSentence:
    """One sentence: its words, one tag per word, and where it was read.

    Attributes:
        words: the tokens, as written in the file.
        tags: one tag per word, as written in the file.
        source: the file the sentence was read from.
        line: 1-based line of its first word. In CoNLL files word `i` is on
            line `line + i`; in JSON lines the whole sentence is on `line`.

    Example:
        >>> TaggedSentence(words=("Paris",), tags=("S-LOC",), source="dev.txt", line=7)
        TaggedSentence(words=('Paris',), tags=('S-LOC',), source='dev.txt', line=7)
    """

    words: tuple[str, ...]
    tags: tuple[str, ...]
    source: str
    line: int


def read_conll(path: str | Path, tag_column: int = -1) -> list[TaggedSentence]:
    """Reads a CoNLL file: one word per line, columns split by spaces or tabs.

    The token is the first column and the tag is column `tag_column` (0-based;
    negative counts from the end, so the default is the last column). A blank
    line ends a sentence; `-DOCSTART-` lines are skipped and also end one. Every
    line must have as many columns as the first word's line. Windows line
    endings, a byte-order mark and a missing final blank line are all fine.

    Raises:
        UserError: naming the file, and the line where there is one: a missing
            or unreadable file, a line with a different column count, a tag
            column the lines do not have, or no sentences at all.

    Example:
        >>> import pathlib, tempfile
        >>> directory = tempfile.TemporaryDirectory()
        >>> path = pathlib.Path(directory.name) / "train.txt"
        >>> _ = path.write_text("-DOCSTART- -X- O\\n\\nJohn NNP B-PER\\nlives VBZ O\\n")
        >>> [sentence] = read_conll(path)
        >>> sentence.words, sentence.tags, sentence.line
        (('John', 'lives'), ('B-PER', 'O'), 3)
        >>> directory.cleanup()
    """
    source, sentences, layout = str(path), [], None
    for block in _sentence_blocks(read_text(path).split("\n")):
        if layout is None:  # the first word's line sets the column count for the whole file
            layout = _column_layout(block[0], tag_column, source)
        for line, columns in block:
            if len(columns) != layout.columns:
                raise UserError(
                    f"expected {layout.columns} columns as on line {layout.line}, "
                    f"found {len(columns)}",
                    source=source,
                    line=line,
                )
        words = tuple(columns[0] for _, columns in block)
        tags = tuple(columns[tag_column] for _, columns in block)
        sentences.append(TaggedSentence(words, tags, source, line=block[0][0]))
    return _non_empty(sentences, source)


def read_tagged_jsonl(path: str | Path) -> list[TaggedSentence]:
    """Reads JSON lines, one sentence a line: `{"tokens": [...], "tags": [...]}`.

    Other keys are ignored and blank lines skipped. Tokens and tags must be
    non-empty lists of strings of the same length.

    Raises:
        UserError: naming the file and line: a missing file, bad JSON, a missing
            key, a value of the wrong kind, or tokens and tags of different lengths.

    Example:
        >>> import pathlib, tempfile
        >>> directory = tempfile.TemporaryDirectory()
        >>> path = pathlib.Path(directory.name) / "train.jsonl"
        >>> _ = path.write_text('{"tokens": ["John", "lives"], "tags": ["B-PER", "O"]}\\n')
        >>> [sentence] = read_tagged_jsonl(path)
        >>> sentence.words, sentence.tags, sentence.line
        (('John', 'lives'), ('B-PER', 'O'), 1)
        >>> directory.cleanup()
    """
    source, sentences = str(path), []
    for line, text in enumerate(read_text(path).split("\n"), start=1):
        if text.strip():
            record = _json_object(text, source, line)
            tokens, tags = (_string_list(record, key, source, line) for key in ("tokens", "tags"))
            if len(tokens) != len(tags):
                raise UserError(
                    f"{len(tokens)} tokens but {len(tags)} tags", source=source, line=line
                )
            sentences.append(TaggedSentence(tuple(tokens), tuple(tags), source, line))
    return _non_empty(sentences, source)


def _sentence_blocks(lines: list[str]) -> Iterator[list[tuple[int, list[str]]]]:
    """Groups the data lines of a CoNLL file into `[(line, columns), ...]` per sentence."""
    block = []
    for line, text in enumerate(lines, start=1):
        columns = _COLUMN_SEPARATOR.split(text.strip(" \t"))
        if columns[0] and columns[0] != DOCSTART:
            block.append((line, columns))
        elif block:
            yield block
            block = []
    if block:
        yield block


class _Layout(NamedTuple):
    columns: int  # how many columns every line must have
    line: int  # the line that set it


def _column_layout(first: tuple[int, list[str]], tag_column: int, source: str) -> _Layout:
    """The layout the first data line sets, once its tag column is checked."""
    line, columns = first
    count = len(columns)
    if count < 2:
        raise UserError("expected a token and a tag, found only 1 column", source=source, line=line)
    if not 1 <= (tag_column if tag_column >= 0 else count + tag_column) < count:
        raise UserError(
            f"tag_column {tag_column} is out of range for a line of {count} columns "
            "(column 0 is the token)",
            source=source,
            line=line,
        )
    return _Layout(count, line)


def _json_object(text: str, source: str, line: int) -> dict:
    record = parse_json(text, source, line)
    if not isinstance(record, dict):
        raise UserError(
            'expected a JSON object like {"tokens": [...], "tags": [...]}', source=source, line=line
        )
    return record


def _string_list(record: dict, key: str, source: str, line: int) -> list[str]:
    if key not in record:
        raise UserError(f"missing key {key!r}", source=source, line=line)
    value = record[key]
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise UserError(
            f"expected a list of non-empty strings, got {value!r:.60}",
            source=source,
            line=line,
            key=key,
        )
    if not value:
        raise UserError(
            "empty list; a sentence needs at least one word", source=source, line=line, key=key
        )
    return value


def _non_empty(sentences: list[TaggedSentence], source: str) -> list[TaggedSentence]:
    if not sentences:
        raise UserError("no sentences found", source=source)
    return sentences
