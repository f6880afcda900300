"""Reading extractive QA data: SQuAD v1.1 / v2.0 JSON and JSON lines.

Both formats become one list of `QAExample`s. Gold answers are kept as
character offsets into the original context, so that training labels and
evaluation always cut answers from the context rather than detokenizing.

An answer whose `answer_start` does not point at its text is skipped and
counted in a `SkippedReport`; a question meant to be answerable that loses all
of its answers this way is dropped, so it is never trained on as unanswerable.
"""

from __future__ import annotations

import dataclasses
import json

from bertkit.errors import UserError
from bertkit.files import json_lines, kind_from_name, parse_json, read_text

# How many question ids a SkippedReport names; the count covers all of them.
MAX_REPORTED_IDS = 5


@dataclasses.dataclass(frozen=True)
class QAExample:
    """One question about one context, with its gold answers (none if impossible).

    `answer_starts[i]` is the character offset of `answers[i]` in `context`.
    """

    id: str
    question: str
    context: str
    answers: tuple[str, ...]
    answer_starts: tuple[int, ...]
    is_impossible: bool


@dataclasses.dataclass(frozen=True)
class SkippedReport:
    """What `read_squad` left out because `answer_start` missed the answer text.

    Attributes:
        answers: number of answers skipped.
        examples: number of answerable questions dropped because every one of
            their answers was skipped.
        first_ids: ids of the first few questions that had an answer skipped.

    Example:
        >>> print(SkippedReport(answers=3, examples=1, first_ids=("q7", "q9")))
        3 answers skipped (not at their answer_start), 1 questions dropped; first: 'q7', 'q9'
        >>> bool(SkippedReport())
        False
    """

    answers: int = 0
    examples: int = 0
    first_ids: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.answers > 0

    def __str__(self) -> str:
        ids = ", ".join(repr(id_) for id_ in self.first_ids)
        return (
            f"{self.answers} answers skipped (not at their answer_start), "
            f"{self.examples} questions dropped; first: {ids}"
        )


def read_squad(path) -> tuple[list[QAExample], SkippedReport]:
    """Reads SQuAD v1.1 / v2.0 JSON or JSON lines into `QAExample`s.

    The format is chosen by content: a JSON object with a `data` list is SQuAD
    (`data[].paragraphs[].qas[]`, optional `is_impossible`, `plausible_answers`
    ignored); otherwise, or for a `.jsonl` file, each line is one question
    `{"id", "question", "context", "answers": {"text": [...], "answer_start": [...]}}`
    with empty lists for an unanswerable one.

    Args:
        path: the file to read (UTF-8).

    Returns:
        The examples in file order, and a report of skipped answers.

    Raises:
        UserError: the file is missing or not valid JSON, a key is missing or has
            the wrong type, an id repeats, or `is_impossible` contradicts `answers`.

    Example:
        >>> import tempfile, os
        >>> line = {"id": "q1", "question": "Who?", "context": "Ada wrote it.",
        ...         "answers": {"text": ["Ada"], "answer_start": [0]}}
        >>> path = os.path.join(tempfile.mkdtemp(), "dev.jsonl")
        >>> _ = open(path, "w").write(json.dumps(line) + "\\n")
        >>> examples, skipped = read_squad(path)
        >>> examples[0].answers, examples[0].answer_starts, bool(skipped)
        (('Ada',), (0,), False)
    """
    text = read_text(path)
    if kind_from_name(path) == "jsonl":
        records = _json_lines_records(text, path)
    else:
        records = _json_records(text, path)
    return _build_examples(records, path)


# A record is (raw question dict, where) on the way to becoming a QAExample;
# `where` holds the UserError location: {"line": n} or {"key": "data[0]..."}.


def _json_records(text: str, path) -> list[tuple[dict, dict]]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        if error.msg == "Extra data" and error.lineno > 1:
            return _json_lines_records(text, path)  # several JSON values: JSON lines
        document = parse_json(text, path)  # raises the error in the house's words
    if isinstance(document, dict) and "data" in document:
        return _squad_records(document["data"], path)
    if isinstance(document, dict) and "question" in document:
        return [(document, {"line": 1})]  # a one-line JSON lines file
    raise UserError(
        "expected a SQuAD object with a 'data' list, or one JSON object per line", source=path
    )


def _squad_records(data, path) -> list[tuple[dict, dict]]:
    records = []
    for i, article in enumerate(_list(data, path, "data")):
        paragraphs = _get(article, "paragraphs", list, path, {"key": f"data[{i}]"})
        for j, paragraph in enumerate(paragraphs):
            where = {"key": f"data[{i}].paragraphs[{j}]"}
            context = _get(paragraph, "context", str, path, where)
            for k, qa in enumerate(_get(paragraph, "qas", list, path, where)):
                qa_where = {"key": f"data[{i}].paragraphs[{j}].qas[{k}]"}
                records.append((_squad_question(qa, context, path, qa_where), qa_where))
    return records


def _squad_question(qa, context: str, path, where: dict) -> dict:
    """Rewrites one SQuAD `qas` entry into the JSON lines layout."""
    where = {**where, "key": f"question {_question_id(qa, path, where)!r}"}
    answers = _get(qa, "answers", list, path, where)
    for answer in answers:
        if not isinstance(answer, dict):
            raise UserError("each answer must be an object", source=path, **where)
    record = {key: qa.get(key) for key in ("id", "question", "is_impossible") if key in qa}
    record["context"] = context
    record["answers"] = {
        "text": [answer.get("text") for answer in answers],
        "answer_start": [answer.get("answer_start") for answer in answers],
    }
    return record


def _json_lines_records(text: str, path) -> list[tuple[dict, dict]]:
    # Not splitlines(): U+2028 and friends may sit unescaped inside JSON strings.
    lines = enumerate(text.split("\n"), start=1)
    return [(record, {"line": number}) for number, record in json_lines(lines, path, objects=True)]


def _build_examples(records, path) -> tuple[list[QAExample], SkippedReport]:
    examples, seen = [], set()
    skipped_answers, dropped, skipped_ids = 0, 0, []
    for record, where in records:
        example, num_bad = _example(record, path, where)
        if example.id in seen:
            raise UserError(f"duplicate question id {example.id!r}", source=path, **where)
        seen.add(example.id)
        if num_bad:
            skipped_answers += num_bad
            skipped_ids.append(example.id)
        if num_bad and not example.answers:
            dropped += 1  # was answerable; training on it as impossible would be wrong
        else:
            examples.append(example)
    report = SkippedReport(skipped_answers, dropped, tuple(skipped_ids[:MAX_REPORTED_IDS]))
    return examples, report


def _example(record: dict, path, where: dict) -> tuple[QAExample, int]:
    """One validated QAExample (misaligned answers removed) and how many were removed."""
    id_ = _question_id(record, path, where)
    if "key" in where:
        where = {**where, "key": f"question {id_!r}"}
    context = _get(record, "context", str, path, where)
    texts, starts = _answers(record, path, where)
    is_impossible = _is_impossible(record, bool(texts), path, where)
    good = [(t, s) for t, s in zip(texts, starts, strict=True) if _points_at(context, t, s)]
    example = QAExample(
        id=id_,
        question=_get(record, "question", str, path, where),
        context=context,
        answers=tuple(text for text, _ in good),
        answer_starts=tuple(start for _, start in good),
        is_impossible=is_impossible,
    )
    return example, len(texts) - len(good)


def _points_at(context: str, text: str, start: int) -> bool:
    """Whether `start` is where `text` sits in `context` (an empty text never is)."""
    return bool(text) and 0 <= start and context[start : start + len(text)] == text


def _answers(record: dict, path, where: dict) -> tuple[list[str], list[int]]:
    answers = _get(record, "answers", dict, path, where)
    texts = _get(answers, "text", list, path, where, prefix="answers.")
    starts = _get(answers, "answer_start", list, path, where, prefix="answers.")
    if len(texts) != len(starts):
        message = f"{len(texts)} answer texts but {len(starts)} answer_start values"
        raise UserError(message, source=path, **where)
    if not all(isinstance(text, str) for text in texts):
        raise UserError("answers.text: expected strings", source=path, **where)
    if not all(isinstance(start, int) and not isinstance(start, bool) for start in starts):
        raise UserError("answers.answer_start: expected integers", source=path, **where)
    return texts, starts


def _question_id(record: dict, path, where: dict) -> str:
    id_ = _get(record, "id", (str, int), path, where)
    return str(id_)


def _is_impossible(record: dict, has_answers: bool, path, where: dict) -> bool:
    is_impossible = record.get("is_impossible", not has_answers)
    if not isinstance(is_impossible, bool):
        raise UserError("is_impossible: expected true or false", source=path, **where)
    if is_impossible and has_answers:
        raise UserError("is_impossible is true but answers are given", source=path, **where)
    if not is_impossible and not has_answers:
        raise UserError("is_impossible is false but no answers are given", source=path, **where)
    return is_impossible


_KIND_NAMES = {list: "a list", dict: "an object", str: "a string"}


def _get(record, key: str, kind, path, where: dict, prefix: str = ""):
    """`record[key]`, or a UserError naming the key and where the record is."""
    if not isinstance(record, dict):
        raise UserError("expected a JSON object", source=path, **where)
    if key not in record:
        raise UserError(f"missing key '{prefix}{key}'", source=path, **where)
    if not isinstance(record[key], kind) or isinstance(record[key], bool):
        expected = _KIND_NAMES.get(kind, "a string or an integer")
        raise UserError(f"{prefix}{key}: expected {expected}", source=path, **where)
    return record[key]


def _list(value, path, key: str) -> list:
    if not isinstance(value, list):
        raise UserError("expected a list", source=path, key=key)
    return value
