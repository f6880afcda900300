"""Entity F1 on span-annotated texts: predicted (type, start, end) characters against gold.

Span data (`data.format: spans`) is scored on its own terms: a predicted entity is
correct when a gold entity of the text has the same type and the same character start
and end, whatever words the model tags. The gold spans are the file's, never widened to
words, and overlapping (nested) gold entities all count. The result has the keys and
the report of the conlleval path (`bertkit_tasks.tagging.conlleval.evaluate`), so
`monitor: f1`, reports and seed tables read it alike; `tokens` counts characters and
`accuracy` is the share of characters whose entity type (or none) is right.
"""

from __future__ import annotations

import numpy as np

from bertkit_tasks.tagging.conlleval import chunk_scores


def gold_spans(sentence) -> list[tuple[str, int, int]]:
    """A `SpanSentence`'s entities as `(type, start, end)` characters."""
    return [(entity.type, entity.start, entity.end) for entity in sentence.entities]


def predicted_spans(prediction: dict) -> list[tuple[str, int, int]]:
    """A raw-text prediction's entities as `(type, start, end)` characters."""
    return [(e["type"], e["start"], e["end"]) for e in prediction["entities"]]


def evaluate_spans(texts: list[str], gold: list[list], predicted: list[list]) -> dict:
    """Precision, recall and F1 over character spans, overall and per type.

    Args:
        texts: the texts.
        gold: per text, its gold entities `(type, start, end)` (end exclusive).
        predicted: per text, its predicted entities, as `gold`.

    Returns:
        What `conlleval.evaluate` returns: `precision`, `recall`, `f1`, `accuracy`,
        `found_gold`, `found_predicted`, `correct`, `tokens` (characters), `per_type`.

    Example:
        >>> result = evaluate_spans(
        ...     ["DOTA2 in Oslo", "Ann"],
        ...     [[("GAME", 0, 4), ("LOC", 9, 13)], [("PER", 0, 3)]],
        ...     [[("GAME", 0, 5), ("LOC", 9, 13)], [("PER", 0, 3)]])
        >>> round(result["f1"], 4), result["correct"], result["per_type"]["GAME"]["f1"]
        (0.6667, 2, 0.0)
        >>> result["tokens"], round(result["accuracy"], 4)  # "2" is the only wrong character
        (16, 0.9375)
    """
    if not len(texts) == len(gold) == len(predicted):
        raise ValueError(f"{len(texts)} texts, {len(gold)} gold and {len(predicted)} predicted")
    result = chunk_scores(_indexed(gold), _indexed(predicted))
    right = sum(
        int((_character_types(text, g) == _character_types(text, p)).sum())
        for text, g, p in zip(texts, gold, predicted, strict=True)
    )
    tokens = sum(len(text) for text in texts)
    result.update(accuracy=right / tokens if tokens else 0.0, tokens=tokens)
    return result


def _indexed(spans: list[list]) -> set[tuple[int, str, int, int]]:
    return {(index, *span) for index, text_spans in enumerate(spans) for span in text_spans}


def _character_types(text: str, spans: list) -> np.ndarray:
    """(characters,) the type of the entity each character is in, "" outside any (the
    longest entity wins where gold ones nest)."""
    types = np.full(len(text), "", dtype=object)
    for type_, start, end in sorted(spans, key=lambda span: span[1] - span[2], reverse=True):
        types[start:end] = type_
    return types
