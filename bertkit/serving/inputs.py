"""One prediction input checked and parsed into its task's example, as `bertkit predict`,
`bertkit serve` and the ONNX server check them: TensorFlow-free, so a server of an ONNX
folder checks requests exactly as the run's own server does.

Example:
    >>> from bertkit.serving.run_task import build_task                      # doctest: +SKIP
    >>> parse_input(task, "a warm, funny film", max_input_characters=100)  # doctest: +SKIP
    TextExample(text='a warm, funny film', text_pair=None)
"""

from __future__ import annotations

import dataclasses
import typing

from bertkit.errors import UserError
from bertkit.serving.protocol import strings_in


def parse_input(task, value, max_input_characters: int):
    """The task's example of one input; a `UserError` says what is wrong with it (empty,
    too long, binary, a field of the wrong type)."""
    # the CLI's blank input line, or a text of whitespace only (see `input_text`)
    if value is None or isinstance(value, str) and not value.strip():
        raise UserError("empty input")
    _check_strings(value, max_input_characters)
    example = task.parse_input(value)
    if dataclasses.is_dataclass(example):  # e.g. {"text": "ok", "text_pair": 7}
        try:
            hints = typing.get_type_hints(type(example))
        except (NameError, TypeError):  # a plugin's annotations we cannot resolve
            hints = {}
        for field in dataclasses.fields(example):
            _check_text(getattr(example, field.name), hints.get(field.name), field.name)
    return example


def parse_inputs(task, inputs: list, max_input_characters: int) -> list:
    """The examples of `inputs`, each checked by `parse_input`; the first that cannot be
    predicted is a `UserError` naming it (`input 3: ...`)."""
    examples = []
    for position, value in enumerate(inputs):
        try:
            examples.append(parse_input(task, value, max_input_characters))
        except UserError as error:
            raise UserError(error.message, source=f"input {position + 1}") from None
    return examples


def takes_text_pairs(task) -> bool:
    """Whether every input must be a pair of texts (a premise-hypothesis classifier, span
    QA): the task takes a [text, text] pair but not a single text."""
    return not parses(task, "text") and parses(task, ["text", "text"])


def parses(task, value) -> bool:
    try:
        task.parse_input(value)
    except UserError:
        return False
    return True


def _check_text(value, hint, name: str) -> None:
    """A field typed `str` (or `str | None`) holds valid Unicode text."""
    kinds = set(typing.get_args(hint)) or {hint}
    if str not in kinds or not kinds <= {str, type(None)}:
        return
    if hint is str and value is None or value is not None and not isinstance(value, str):
        raise UserError(f"'{name}' must be a text, got {value!r:.40}")
    if value is not None:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise UserError(f"'{name}' is not valid Unicode (a lone surrogate)") from None


def _check_strings(value, max_input_characters: int) -> None:
    """An input's texts (strings, also inside pairs, lists and objects) are within the
    size bound and hold no NUL byte, the mark of binary data."""
    strings = list(strings_in(value))
    count = sum(map(len, strings))
    if count > max_input_characters:
        raise UserError(
            f"longer than {max_input_characters:,} characters ({count:,}), the limit per input"
        )
    if any("\0" in text for text in strings):
        raise UserError("a NUL byte (binary data?); expected text")
