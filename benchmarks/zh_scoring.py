"""The scorers `benchmarks/chinese.py` applies to both toolkits' predictions: entity F1 on
character spans and the CMRC 2018 metric.

`cmrc_scores` is the one place that scores span QA, with bertkit's CMRC 2018 metric
(`bertkit_tasks.span_qa.cmrc_eval`, equal to the official script question for question:
`benchmarks/cmrc_metric_parity.py`); every gold answer is kept and an unanswered question
scores 0, as in the official script.
"""

from __future__ import annotations

import json
from pathlib import Path


def spans_from_tags(tags: list[str]) -> set:
    """IOB2 tags, one a character -> `{(type, start, end)}` character spans (end exclusive)."""
    from bertkit_tasks.tagging.conlleval import extract_chunks

    return set(extract_chunks(tags))


def span_f1(gold: list[set], predicted: list[set]) -> dict:
    """Micro precision / recall / F1 of exact `(type, start, end)` spans over sentences.

    Example:
        >>> span_f1([{("PER", 0, 2)}, {("LOC", 1, 3)}], [{("PER", 0, 2)}, {("LOC", 1, 2)}])
        {'precision': 0.5, 'recall': 0.5, 'f1': 0.5, 'gold': 2, 'predicted': 2, 'correct': 1}
    """
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sentences, {len(predicted)} predicted")
    from bertkit_tasks.tagging.conlleval import chunk_scores

    def indexed(sentences):
        return {(i, *span) for i, spans in enumerate(sentences) for span in spans}

    scores = chunk_scores(indexed(gold), indexed(predicted))
    return {
        "precision": scores["precision"],
        "recall": scores["recall"],
        "f1": scores["f1"],
        "gold": scores["found_gold"],
        "predicted": scores["found_predicted"],
        "correct": scores["correct"],
    }


def cmrc_scores(dataset: Path, predictions: dict) -> dict:
    """EM and F1 (fractions) of `{id: answer}` on a SQuAD-style file, CMRC 2018's way."""
    from bertkit_tasks.span_qa import cmrc_eval

    em = f1 = total = 0
    for qa in _questions(dataset):
        total += 1
        if qa["id"] in predictions:
            golds = [answer["text"] for answer in qa["answers"]]
            exact, score = cmrc_eval.cmrc_scores(predictions[qa["id"]], golds)
            em, f1 = em + exact, f1 + score
    return {"em": em / total, "f1": f1 / total, "questions": total, "scorer": "cmrc_eval"}


def _questions(dataset: Path):
    data = json.loads(Path(dataset).read_text(encoding="utf-8"))["data"]
    for article in data:
        for paragraph in article["paragraphs"]:
            yield from paragraph["qas"]
