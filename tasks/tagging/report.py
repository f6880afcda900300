"""Tagging error analysis: per-type precision/recall/F1, the most common confusions, and the
sentences with wrong entities."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from bertkit.report import markdown_table
from bertkit_tasks.tagging.conlleval import extract_chunks


def entity_errors(gold: list[tuple], predicted: list[tuple]) -> list[str]:
    """What went wrong in one sentence, one label per wrong chunk (chunks: (type, start, end)).

    Example:
        >>> entity_errors([("PER", 0, 2), ("LOC", 3, 4), ("ORG", 5, 6)],
        ...               [("ORG", 0, 2), ("LOC", 3, 5), ("MISC", 7, 8)])
        ['PER -> ORG (same words)', 'LOC -> LOC (wrong boundary)', 'ORG missed', 'spurious MISC']
    """
    correct = set(gold) & set(predicted)
    wrong_predicted = [p for p in predicted if p not in correct]
    errors, explained = [], set()
    for chunk in (g for g in gold if g not in correct):
        same = [p for p in wrong_predicted if p[1:] == chunk[1:]]
        overlapping = same or [p for p in wrong_predicted if p[1] < chunk[2] and chunk[1] < p[2]]
        if overlapping:
            kind = "same words" if same else "wrong boundary"
            errors.append(f"{chunk[0]} -> {overlapping[0][0]} ({kind})")
            explained.update(overlapping)
        else:
            errors.append(f"{chunk[0]} missed")
    errors += [f"spurious {p[0]}" for p in wrong_predicted if p not in explained]
    return errors


def tagging_report(
    examples, predicted_tags: list[list[str]], directory, per_type: dict, shown: int = 10
) -> str:
    """Writes wrong_entities.txt; returns the Markdown section (tagged word lists)."""
    gold = [extract_chunks(list(sentence.tags)) for sentence in examples]
    predicted = [extract_chunks(tags) for tags in predicted_tags]
    return entity_report(examples, gold, predicted, directory, per_type, shown)


def entity_report(
    examples, gold: list, predicted: list, directory, per_type: dict, shown: int = 10
) -> str:
    """Writes wrong_entities.txt; returns the Markdown section.

    `gold` and `predicted` hold each sentence's chunks `(type, start, end)`: word
    indices for word lists, character offsets for examples with a `text`.
    """
    confusions: Counter = Counter()
    wrong = []
    for sentence, gold_chunks, predicted_chunks in zip(examples, gold, predicted, strict=True):
        errors = entity_errors(gold_chunks, predicted_chunks)
        confusions.update(errors)
        if errors:
            wrong.append((sentence, gold_chunks, predicted_chunks, errors))
    with open(Path(directory) / "wrong_entities.txt", "w") as file:
        for sentence, gold_chunks, predicted_chunks, errors in wrong:
            where = f"{sentence.source}:{sentence.line}  " if sentence.line else ""
            file.write(
                f"{where}{_sentence_text(sentence)}\n"
                f"  gold:      {_entities(sentence, gold_chunks)}\n"
                f"  predicted: {_entities(sentence, predicted_chunks)}\n"
                f"  errors:    {'; '.join(errors)}\n\n"
            )
    return _markdown(per_type, confusions, len(wrong), len(examples), shown)


def _markdown(per_type: dict, confusions: Counter, wrong: int, sentences: int, shown) -> str:
    rows = [
        [name, s["precision"], s["recall"], s["f1"], s["support"]]
        for name, s in sorted(per_type.items())
    ]
    lines = [
        "## Per entity type",
        "",
        markdown_table(["type", "precision", "recall", "F1", "support"], rows),
        "",
        f"## Most common confusions ({sum(confusions.values())} wrong entities)",
        "",
    ]
    if confusions:
        lines.append(markdown_table(["error", "count"], confusions.most_common(shown)))
    lines += [
        "",
        f"{wrong} of {sentences} sentences have a wrong entity; each is "
        "in `wrong_entities.txt` with its gold and predicted entities.",
    ]
    return "\n".join(lines)


def _sentence_text(sentence) -> str:
    text = getattr(sentence, "text", None)
    return " ".join(sentence.words) if text is None else text


def _entities(sentence, chunks) -> str:
    return " ".join(f"[{kind} {_cut(sentence, start, end)}]" for kind, start, end in chunks) or "-"


def _cut(sentence, start: int, end: int) -> str:
    text = getattr(sentence, "text", None)
    return " ".join(sentence.words[start:end]) if text is None else text[start:end]
