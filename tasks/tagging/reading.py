"""Tagging's data files: which format a file is in, and reading it into examples.

`data.format` is `conll`, `jsonl` (`{"tokens", "tags"}`), `spans` (raw texts with
character spans, `bertkit_tasks.tagging.spans`) or `auto`: a .json or .jsonl file is
`spans` when its first record has a `text` and no `tokens`, else `jsonl`; any other
file is `conll`. A prediction input is a raw text or a list of words (`UntaggedInput`).
"""

from __future__ import annotations

import dataclasses
import sys

from bertkit.errors import UserError
from bertkit.files import input_text, kind_from_name, read_json_lines
from bertkit_tasks.tagging.conll import read_conll, read_tagged_jsonl
from bertkit_tasks.tagging.schemes import TagSchemeError, convert_tags
from bertkit_tasks.tagging.spans import is_spans_record, overlaps_line, read_spans


def file_format(path, format: str) -> str:
    """The format `path` is read in: `format`, or for `auto` the one its name and first
    record say.

    Example:
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "train.json"
        >>> _ = path.write_text('\\n{"text": "Ann", "label": [[0, 3, "PER"]]}\\n')
        >>> file_format(path, "auto"), file_format("train.txt", "auto")
        ('spans', 'conll')
    """
    if format != "auto":
        return format
    if kind_from_name(path) not in ("jsonl", "json"):
        return "conll"
    try:
        _, first = next(iter(read_json_lines(path)), (None, None))
    except UserError:  # bad JSON or no file: the jsonl reader says so, with the line
        return "jsonl"
    return "spans" if is_spans_record(first) else "jsonl"


def read_tagging_file(path, data, model_scheme: str) -> list:
    """The examples of a file: `TaggedSentence`s, or `SpanSentence`s for span data.

    Args:
        path: the file.
        data: the recipe's `data:` section (`TaggingData`).
        model_scheme: the scheme the model predicts in; a word list's tags must
            convert to it.
    """
    format = file_format(path, data.format)
    if format == "spans":
        sentences = read_spans(path, data.overlapping_entities)
        if line := overlaps_line(sentences):
            print(line, file=sys.stderr)
        return sentences
    jsonl = format == "jsonl"
    sentences = read_tagged_jsonl(path) if jsonl else read_conll(path, data.tag_column)
    for sentence in sentences:  # a tag outside the data's scheme fails here, not mid-run
        try:
            convert_tags(sentence.tags, data.scheme, model_scheme)
        except TagSchemeError as error:  # a CoNLL file has a line per word
            line = sentence.line + (0 if jsonl else error.word_index)
            raise UserError(
                f"{error} (data.scheme: {data.scheme})", source=sentence.source, line=line
            ) from None
    return sentences


@dataclasses.dataclass(frozen=True)
class UntaggedInput:
    """A prediction input: a raw text, or a list of words."""

    text: str | None = None
    words: tuple[str, ...] | None = None


def parse_tagging_input(value) -> UntaggedInput:
    """A prediction input: a text, a list of words, or an object with `text` or `words`.

    Example:
        >>> parse_tagging_input({"words": ["Ann", "Lee"]})
        UntaggedInput(text=None, words=('Ann', 'Lee'))
    """
    if isinstance(value, dict):
        value = value.get("text", value.get("words", value.get("tokens")))
    if isinstance(value, str):
        return UntaggedInput(text=input_text(value, "text"))
    if isinstance(value, (list, tuple)) and all(isinstance(word, str) for word in value):
        if not value:
            raise UserError("'words' is empty")
        return UntaggedInput(
            words=tuple(input_text(word, f"word {i + 1}") for i, word in enumerate(value))
        )
    raise UserError(
        f"expected a text, a list of words or an object with 'text' or 'words', got {value!r:.80}"
    )
