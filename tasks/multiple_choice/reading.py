"""Multiple-choice questions from JSON lines: a question, its choices and the answer.

The data keys may be dotted paths into nested objects, so that CommonsenseQA's own files read
as they are (`question: question.stem`, `choices: question.choices`, `label: answerKey`). A
choice is a string or an object with `text` (and a `label`, such as "A"); the answer is the
choice's 0-based index, its label, or its text.
"""

from __future__ import annotations

import dataclasses

from bertkit.errors import UserError
from bertkit.files import input_text


@dataclasses.dataclass(frozen=True)
class Question:
    question: str
    choices: tuple[str, ...]
    answer: int | None = None  # the right choice's index
    choice_labels: tuple[str, ...] | None = None  # "A", "B", ... where the data names them
    source: str | None = None
    line: int | None = None


def field(record: dict, path: str, *, source=None, line=None):
    """The value at a dotted `path` of a JSON object, or a one-line error naming it.

    Example:
        >>> field({"question": {"stem": "Why?"}}, "question.stem")
        'Why?'
        >>> field({"question": "Why?"}, "question.stem", source="d.jsonl", line=3)
        Traceback (most recent call last):
        ...
        bertkit.errors.UserError: d.jsonl:3: question.stem: missing
    """
    value = record
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            raise UserError("missing", source=source, line=line, key=path)
        value = value[part]
    return value


def parse_choices(value, *, key: str = "choices", source=None, line=None) -> tuple:
    """(texts, labels or None) of a list of choices: strings, or objects with `text` and
    optionally `label`.

    Example:
        >>> parse_choices([{"label": "A", "text": "ignore"}, {"label": "B", "text": "enforce"}])
        (('ignore', 'enforce'), ('A', 'B'))
        >>> parse_choices(["yes", "no"])
        (('yes', 'no'), None)
    """
    if not isinstance(value, list) or len(value) < 2:
        raise UserError(
            f"expected a list of at least 2 choices, got {value!r:.60}",
            source=source,
            line=line,
            key=key,
        )
    texts, labels = [], []
    for choice in value:
        if isinstance(choice, dict):
            texts.append(choice.get("text"))
            labels.append(choice.get("label"))
        else:
            texts.append(choice)
            labels.append(None)
    for text in texts:
        if not isinstance(text, str) or not text.strip():
            raise UserError(
                f"each choice must be a non-empty text (or an object with one as 'text'), "
                f"got {text!r:.60}",
                source=source,
                line=line,
                key=key,
            )
    named = all(isinstance(label, str) for label in labels)
    return tuple(texts), tuple(labels) if named else None


def answer_index(value, texts: tuple, labels: tuple | None, *, key, source=None, line=None):
    """The index of the answer among the choices: a 0-based index, a choice's label or text.

    Example:
        >>> answer_index("B", ("ignore", "enforce"), ("A", "B"), key="answerKey")
        1
        >>> answer_index(0, ("yes", "no"), None, key="label")
        0
        >>> answer_index("maybe", ("yes", "no"), None, key="label", source="d.jsonl",
        ...              line=2)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        bertkit.errors.UserError: d.jsonl:2: label: 'maybe' is neither a choice's index, ...
    """
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(texts):
        return value
    if isinstance(value, str):
        for names in (labels or (), texts):
            if value in names:
                return names.index(value)
        if value.isdigit() and int(value) < len(texts):
            return int(value)
    raise UserError(
        f"{value!r:.40} is neither a choice's index, label nor text "
        f"(the choices: {', '.join(repr(t) for t in texts):.80})",
        source=source,
        line=line,
        key=key,
    )


def read_question(record: dict, data, *, source, line) -> Question:
    """One JSON object of a data file as a `Question` (the keys of `data`)."""
    where = {"source": source, "line": line}
    question = field(record, data.question, **where)
    if not isinstance(question, str) or not question.strip():
        raise UserError(
            f"expected a question text, got {question!r:.60}", key=data.question, **where
        )
    texts, labels = parse_choices(field(record, data.choices, **where), key=data.choices, **where)
    answer = answer_index(
        field(record, data.label, **where), texts, labels, key=data.label, **where
    )
    return Question(question, texts, answer, labels, source, line)


def parse_question(value) -> Question:
    """One prediction input: `{"question": str, "choices": [str or {"label", "text"}, ...]}`.

    Example:
        >>> parse_question({"question": "Where is ice?", "choices": ["freezer", "oven"]}).choices
        ('freezer', 'oven')
    """
    if not isinstance(value, dict) or "question" not in value or "choices" not in value:
        raise UserError(
            f'expected an object {{"question": ..., "choices": [...]}}, got {value!r:.80}'
        )
    texts, labels = parse_choices(value["choices"])
    for text in texts:
        input_text(text, "choices")
    return Question(input_text(value["question"], "question"), texts, None, labels)
