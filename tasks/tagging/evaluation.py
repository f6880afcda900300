"""Tagging's metrics and report: conlleval's entity F1 on tagged words, or entity F1 on
character spans for span data (`bertkit_tasks.tagging.span_eval`), with the same keys:
`precision`, `recall`, `f1`, `accuracy`, `per_type` and `counts` (`tokens`, or
`characters` for span data, `found_gold`, `found_predicted`, `correct`).

An evaluation file is one format: its first example says which.
"""

from __future__ import annotations

from bertkit_tasks.tagging import span_eval
from bertkit_tasks.tagging.conlleval import evaluate as conll_evaluate
from bertkit_tasks.tagging.conlleval import format_report
from bertkit_tasks.tagging.schemes import chunks_to_tags
from bertkit_tasks.tagging.spans import SpanSentence


def tagging_metrics(examples: list, predictions: list[dict], data_scheme: str) -> dict:
    """The metrics of predictions against the examples' gold entities.

    Args:
        examples: `TaggedSentence`s, or `SpanSentence`s.
        predictions: `predict`'s, one per example.
        data_scheme: the tag scheme of the files (`data.scheme`), to read the gold tags.
    """
    if _are_spans(examples):
        result = span_eval.evaluate_spans(
            [sentence.text for sentence in examples],
            [span_eval.gold_spans(sentence) for sentence in examples],
            [span_eval.predicted_spans(prediction) for prediction in predictions],
        )
        result["characters"] = result.pop("tokens")
        return _with_counts(result, "characters")
    predicted = [
        predicted_tags(sentence, prediction, data_scheme)
        for sentence, prediction in zip(examples, predictions, strict=True)
    ]
    result = conll_evaluate([list(sentence.tags) for sentence in examples], predicted)
    return _with_counts(result, "tokens")


def format_tagging_metrics(metrics: dict) -> str:
    """The metrics as conlleval prints them (`processed N characters` for span data)."""
    counts = metrics["counts"]
    unit = "characters" if "characters" in counts else "tokens"
    return format_report({**metrics, **counts, "tokens": counts[unit]}, unit)


def tagging_report_section(examples, predictions, directory, data_scheme: str) -> str:
    """The report's Markdown; writes wrong_entities.txt into `directory`."""
    from bertkit_tasks.tagging.report import entity_report, tagging_report

    per_type = tagging_metrics(examples, predictions, data_scheme)["per_type"]
    if _are_spans(examples):
        return entity_report(
            examples,
            [span_eval.gold_spans(sentence) for sentence in examples],
            [span_eval.predicted_spans(prediction) for prediction in predictions],
            directory,
            per_type,
        )
    predicted = [
        predicted_tags(sentence, prediction, data_scheme)
        for sentence, prediction in zip(examples, predictions, strict=True)
    ]
    return tagging_report(examples, predicted, directory, per_type)


def predicted_tags(sentence, prediction: dict, scheme: str) -> list[str]:
    """A word list's predicted entities as its tags in `scheme`."""
    return chunks_to_tags(
        [(e["type"], e["start"], e["end"]) for e in prediction["entities"]],
        len(sentence.tags),
        scheme,
    )


def _are_spans(examples: list) -> bool:
    return bool(examples) and isinstance(examples[0], SpanSentence)


def _with_counts(result: dict, unit: str) -> dict:
    counts = {key: result.pop(key) for key in (unit, "found_gold", "found_predicted", "correct")}
    return {**result, "counts": counts}
