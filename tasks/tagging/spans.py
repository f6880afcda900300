"""Readers for raw texts annotated with character spans (`data.format: spans`).

JSON lines, one text a line, in any of three forms (other keys are ignored):

- bertkit's: `{"text": ..., "entities": [{"start": 0, "end": 5, "label": "PER"}]}`,
  end exclusive; `type` is accepted for `label`;
- doccano's: `{"text": ..., "label": [[0, 5, "PER"], ...]}`, end exclusive;
- CLUENER2020's: `{"text": ..., "label": {"PER": {"entity text": [[0, 4], ...]}}}`,
  end INCLUSIVE, and `text[start:end + 1]` must be the entity text.

A text without entities is fine (`"entities": []`, or no `label`); the same entity
written twice is kept once. Overlapping (nested) entities have no place in one tag a
word: `read_spans(path, overlapping="error")` refuses them, naming both; with
`"longest"` they are kept as written (evaluation scores against every gold entity) and
training keeps the longest of those that overlap (`bertkit_tasks.tagging.text_words`).
CLUENER's training file has such nests (a company inside a book title).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bertkit.errors import UserError
from bertkit.files import read_json_lines, source_name


@dataclass(frozen=True)
class SpanEntity:
    """One entity: its type and its characters `text[start:end]`."""

    type: str
    start: int
    end: int


@dataclass(frozen=True)
class SpanSentence:
    """One raw text and its entities (sorted by start), and where it was read.

    Example:
        >>> sentence = SpanSentence("Ann in Oslo", (SpanEntity("LOC", 7, 11),), "dev.jsonl", 3)
        >>> [sentence.text[e.start:e.end] for e in sentence.entities]
        ['Oslo']
    """

    text: str
    entities: tuple[SpanEntity, ...]
    source: str
    line: int


def read_spans(path: str | Path, overlapping: str = "error") -> list[SpanSentence]:
    """Reads span-annotated JSON lines in any of the three forms of the module docstring.

    Args:
        path: the file.
        overlapping: "error" refuses overlapping entities; "longest" keeps them.

    Raises:
        UserError: naming the file and line: bad JSON, a missing or empty `text`, an
            entity out of the text or with start >= end, overlapping entities, a
            CLUENER entity text that is not at its offsets, or a label that is not a
            text.

    Example:
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "train.json"
        >>> _ = path.write_text('{"text": "Ann in Oslo", "label": {"LOC": {"Oslo": [[7, 10]]}}}\\n'
        ...                     '{"text": "Ann in Oslo", "label": [[0, 3, "PER"]]}\\n')
        >>> [(s.line, s.entities) for s in read_spans(path)]  # doctest: +NORMALIZE_WHITESPACE
        [(1, (SpanEntity(type='LOC', start=7, end=11),)),
         (2, (SpanEntity(type='PER', start=0, end=3),))]
    """
    source, sentences = source_name(path), []
    for line, record in read_json_lines(path, objects=True):
        text = record.get("text")
        if not isinstance(text, str) or not text.strip():
            problem = "missing key 'text'" if "text" not in record else "'text' is empty"
            if "text" in record and not isinstance(text, str):
                problem = f"'text' must be a text, got {text!r:.40}"
            raise UserError(problem, source=source, line=line)
        entities = _checked(_entities(record, text, source, line), text, source, line)
        sentences.append(SpanSentence(text, entities, source, line))
        if overlapping == "error" and (pairs := overlapping_entities(sentences[-1])):
            raise overlap_error(sentences[-1], *pairs[0])
    if not sentences:
        raise UserError("no sentences found", source=source)
    return sentences


def is_spans_record(record) -> bool:
    """Whether a JSON line is a span-annotated text (`text`, no `tokens`): how
    `data.format: auto` tells the spans format from `{"tokens", "tags"}`.

    Example:
        >>> is_spans_record({"text": "x", "label": []}), is_spans_record({"tokens": ["x"]})
        (True, False)
    """
    return isinstance(record, dict) and "text" in record and "tokens" not in record


# ---------------------------------------------------------------- the three forms
def _entities(record: dict, text: str, source: str, line: int) -> list[SpanEntity]:
    if "entities" in record:
        return _bertkit_entities(record["entities"], source, line)
    label = record.get("label", [])
    if isinstance(label, dict):
        return _cluener_entities(label, text, source, line)
    if isinstance(label, list):
        return [_doccano_entity(item, source, line) for item in label]
    raise UserError(
        f"expected a list of [start, end, label] or CLUENER's {{type: {{text: [[start, end]]}}}}, "
        f"got {label!r:.60}",
        source=source,
        line=line,
        key="label",
    )


def _bertkit_entities(entities, source: str, line: int) -> list[SpanEntity]:
    if not isinstance(entities, list) or not all(isinstance(e, dict) for e in entities):
        raise UserError(
            f'expected a list of {{"start", "end", "label"}} objects, got {entities!r:.60}',
            source=source,
            line=line,
            key="entities",
        )
    found = []
    for entity in entities:
        for key in ("start", "end"):
            if key not in entity:
                raise UserError(f"an entity has no {key!r}", source=source, line=line)
        label = entity.get("label", entity.get("type"))
        found.append(_entity(label, entity["start"], entity["end"], source, line))
    return found


def _doccano_entity(item, source: str, line: int) -> SpanEntity:
    if not isinstance(item, list) or len(item) != 3:
        raise UserError(
            f"expected [start, end, label], got {item!r:.60}", source=source, line=line, key="label"
        )
    return _entity(item[2], item[0], item[1], source, line)


def _cluener_entities(label: dict, text: str, source: str, line: int) -> list[SpanEntity]:
    found = []
    for type_, mentions in label.items():
        if not isinstance(mentions, dict):
            raise UserError(
                f"type {type_!r}: expected {{entity text: [[start, end], ...]}}, "
                f"got {mentions!r:.60}",
                source=source,
                line=line,
            )
        for mention, places in mentions.items():
            if not isinstance(places, list) or not all(
                isinstance(p, list) and len(p) == 2 for p in places
            ):
                raise UserError(
                    f"{mention!r}: expected a list of [start, end], got {places!r:.60}",
                    source=source,
                    line=line,
                )
            for start, last in places:
                entity = _entity(type_, start, last + 1 if _is_int(last) else last, source, line)
                if entity.end <= len(text) and text[entity.start : entity.end] != mention:
                    raise UserError(
                        f"entity {mention!r} ({type_}) is not at [{start}, {last}]: the text "
                        f"there is {text[entity.start : entity.end]!r}",
                        source=source,
                        line=line,
                    )
                found.append(entity)
    return found


# ---------------------------------------------------------------- checks
def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _entity(label, start, end, source: str, line: int) -> SpanEntity:
    if not isinstance(label, str) or not label:
        raise UserError(
            f"an entity's label must be a text, got {label!r:.40}", source=source, line=line
        )
    if not (_is_int(start) and _is_int(end)):
        raise UserError(
            f"entity {label}: start and end must be whole numbers, got {start!r:.20} and "
            f"{end!r:.20}",
            source=source,
            line=line,
        )
    return SpanEntity(label, start, end)


def _checked(entities: list[SpanEntity], text: str, source: str, line: int) -> tuple:
    """The entities sorted, duplicates dropped; out of range or empty ones raise."""
    for entity in entities:
        if entity.start >= entity.end:
            raise UserError(
                f"entity {entity.type} [{entity.start}, {entity.end}): start must be before end",
                source=source,
                line=line,
            )
        if entity.start < 0 or entity.end > len(text):
            raise UserError(
                f"entity {entity.type} [{entity.start}, {entity.end}) is out of the text's "
                f"{len(text)} characters",
                source=source,
                line=line,
            )
    return tuple(sorted(set(entities), key=lambda e: (e.start, e.end, e.type)))


def overlapping_entities(sentence: SpanSentence) -> list[tuple[SpanEntity, SpanEntity]]:
    """The pairs of a sentence's entities that share characters, in text order.

    Example:
        >>> entities = (SpanEntity("LOC", 0, 4), SpanEntity("ORG", 0, 9), SpanEntity("PER", 10, 13))
        >>> overlapping_entities(SpanSentence("Oslo Bank Ann", entities, "x.jsonl", 1))
        [(SpanEntity(type='LOC', start=0, end=4), SpanEntity(type='ORG', start=0, end=9))]
    """
    entities, pairs = sentence.entities, []
    for i, before in enumerate(entities):
        for after in entities[i + 1 :]:
            if after.start >= before.end:
                break
            pairs.append((before, after))
    return pairs


def overlap_error(sentence: SpanSentence, before: SpanEntity, after: SpanEntity) -> UserError:
    """The error of two overlapping entities, naming both, at the sentence's file and line."""
    return UserError(
        f"entities {_named(before, sentence.text)} and {_named(after, sentence.text)} overlap",
        source=sentence.source,
        line=sentence.line,
    )


def _named(entity: SpanEntity, text: str) -> str:
    return f"{text[entity.start : entity.end]!r} ({entity.type} [{entity.start}, {entity.end}))"


def overlaps_line(sentences: list[SpanSentence]) -> str | None:
    """One line on the overlapping entities `read_spans(overlapping="longest")` kept, or None.

    Example:
        >>> entities = (SpanEntity("LOC", 0, 4), SpanEntity("ORG", 0, 9))
        >>> print(overlaps_line([SpanSentence("Oslo Bank", entities, "x.jsonl", 7)]))
        x.jsonl: 1 pair of overlapping entities in 1 text; training keeps the longest of each \
nest, evaluation all; first: x.jsonl:7 'Oslo' (LOC [0, 4)) and 'Oslo Bank' (ORG [0, 9))
    """
    found = [(s, pair) for s in sentences for pair in overlapping_entities(s)]
    if not found:
        return None
    sentence, (before, after) = found[0]
    pairs, texts = len(found), len({id(s) for s, _ in found})
    return (
        f"{sentence.source}: {pairs:,} pair{'s' * (pairs != 1)} of overlapping entities in "
        f"{texts:,} text{'s' * (texts != 1)}; training keeps the longest of each nest, "
        f"evaluation all; first: {sentence.source}:{sentence.line} "
        f"{_named(before, sentence.text)} and {_named(after, sentence.text)}"
    )
