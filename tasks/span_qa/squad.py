"""Reading extractive QA data: SQuAD v1.1 / v2.0 JSON and JSON lines.

Both formats become one list of `QAExample`s. Every gold answer text is kept, as the
official scripts score by answer text. For training each answer is also placed in the
context by character offset, so that training labels are cut from the context rather
than detokenized: at its `answer_start` when that points at its text, else at the
occurrence of its text nearest to `answer_start`, else nowhere (start -1; the answer is
scored in evaluation, never trained on). A `PlacementReport` counts the answers re-placed
and unplaced, and the questions left with no placed answer: those are not trained on
(never as unanswerable) but are evaluated.
"""

from __future__ import annotations

import dataclasses
import json

from bertkit.errors import UserError
from bertkit.files import json_lines, kind_from_name, parse_json, read_text

# How many question ids a PlacementReport names; the count covers all of them.
MAX_REPORTED_IDS = 5


@dataclasses.dataclass(frozen=True)
class QAExample:
    """One question about one context, with its gold answers (none if impossible).

    `answer_starts[i]` is the character offset of `answers[i]` in `context`, -1 where its
    text is not in the context (scored in evaluation, never trained on).
    """

    id: str
    question: str
    context: str
    answers: tuple[str, ...]
    answer_starts: tuple[int, ...]
    is_impossible: bool


@dataclasses.dataclass(frozen=True)
class PlacementReport:
    """Answers whose `answer_start` did not point at their text, as `read_squad` placed them.

    Attributes:
        replaced: answers placed at the occurrence of their text nearest to `answer_start`.
        unplaced: answers whose text is not in the context (or empty): evaluated only.
        untrainable: answerable questions without a placed answer: evaluated, not trained on.
        first_ids: ids of the first few questions with an answer re-placed or unplaced.

    Example:
        >>> print(PlacementReport(replaced=2, unplaced=3, untrainable=1, first_ids=("q7", "q9")))
        5 answers not at their answer_start: 2 re-placed at the nearest occurrence of their \
text, 3 not in the context (evaluated, not trained on); 1 questions not trained on; \
first: 'q7', 'q9'
        >>> bool(PlacementReport())
        False
    """

    replaced: int = 0
    unplaced: int = 0
    untrainable: int = 0
    first_ids: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.replaced + self.unplaced > 0

    def __str__(self) -> str:
        ids = ", ".join(repr(id_) for id_ in self.first_ids)
        return (
            f"{self.replaced + self.unplaced} answers not at their answer_start: "
            f"{self.replaced} re-placed at the nearest occurrence of their text, "
            f"{self.unplaced} not in the context (evaluated, not trained on); "
            f"{self.untrainable} questions not trained on; first: {ids}"
        )


def read_squad(path) -> tuple[list[QAExample], PlacementReport]:
    """Reads SQuAD v1.1 / v2.0 JSON or JSON lines into `QAExample`s.

    The format is chosen by content: a JSON object with a `data` list is SQuAD
    (`data[].paragraphs[].qas[]`, optional `is_impossible`, `plausible_answers`
    ignored); otherwise, or for a `.jsonl` file, each line is one question
    `{"id", "question", "context", "answers": {"text": [...], "answer_start": [...]}}`
    with empty lists for an unanswerable one.

    Args:
        path: the file to read (UTF-8).

    Returns:
        Every question in file order, and a report of the answers not at their
        `answer_start`.

    Raises:
        UserError: the file is missing or not valid JSON, a key is missing or has
            the wrong type, an id repeats, or `is_impossible` contradicts `answers`.

    Example:
        >>> import tempfile, os
        >>> line = {"id": "q1", "question": "Who?", "context": "Ada wrote it.",
        ...         "answers": {"text": ["Ada"], "answer_start": [0]}}
        >>> path = os.path.join(tempfile.mkdtemp(), "dev.jsonl")
        >>> _ = open(path, "w").write(json.dumps(line) + "\\n")
        >>> examples, placement = read_squad(path)
        >>> examples[0].answers, examples[0].answer_starts, bool(placement)
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


def _build_examples(records, path) -> tuple[list[QAExample], PlacementReport]:
    examples, seen = [], set()
    replaced = unplaced = untrainable = 0
    first_ids = []
    for record, where in records:
        example, moved, missing = _example(record, path, where)
        if example.id in seen:
            raise UserError(f"duplicate question id {example.id!r}", source=path, **where)
        seen.add(example.id)
        examples.append(example)
        replaced, unplaced = replaced + moved, unplaced + missing
        if moved or missing:
            first_ids.append(example.id)
        untrainable += bool(example.answers) and max(example.answer_starts) < 0
    report = PlacementReport(replaced, unplaced, untrainable, tuple(first_ids[:MAX_REPORTED_IDS]))
    return examples, report


def _example(record: dict, path, where: dict) -> tuple[QAExample, int, int]:
    """One validated QAExample, with how many answers were re-placed and left unplaced."""
    id_ = _question_id(record, path, where)
    if "key" in where:
        where = {**where, "key": f"question {id_!r}"}
    context = _get(record, "context", str, path, where)
    texts, starts = _answers(record, path, where)
    is_impossible = _is_impossible(record, bool(texts), path, where)
    placed = tuple(answer_place(context, t, s) for t, s in zip(texts, starts, strict=True))
    example = QAExample(
        id=id_,
        question=_get(record, "question", str, path, where),
        context=context,
        answers=tuple(texts),
        answer_starts=placed,
        is_impossible=is_impossible,
    )
    moved = sum(0 <= place != start for place, start in zip(placed, starts, strict=True))
    return example, moved, placed.count(-1)


def answer_place(context: str, text: str, start: int) -> int:
    """Where `text` sits in `context`: `start` if it points there, else the occurrence
    nearest to it (the earlier one on a tie), else -1 (an empty text is never placed).

    Example:
        >>> context = "ab ab ab"
        >>> answer_place(context, "ab", 3), answer_place(context, "ab", 4)
        (3, 3)
        >>> answer_place(context, "ab", 7), answer_place(context, "cd", 0)
        (6, -1)
    """
    if not text:
        return -1
    if 0 <= start and context.startswith(text, start):
        return start
    places, found = [], context.find(text)
    while found >= 0:
        places.append(found)
        found = context.find(text, found + 1)
    return min(places, key=lambda place: (abs(place - start), place), default=-1)


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
