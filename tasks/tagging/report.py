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
    """Writes wrong_entities.txt; returns the Markdown section."""
    confusions: Counter = Counter()
    wrong = []
    for sentence, tags in zip(examples, predicted_tags, strict=True):
        gold, predicted = extract_chunks(list(sentence.tags)), extract_chunks(tags)
        errors = entity_errors(gold, predicted)
        confusions.update(errors)
        if errors:
            wrong.append((sentence, gold, predicted, errors))
    with open(Path(directory) / "wrong_entities.txt", "w") as file:
        for sentence, gold, predicted, errors in wrong:
            where = f"{sentence.source}:{sentence.line}  " if sentence.line else ""
            file.write(
                f"{where}{' '.join(sentence.words)}\n"
                f"  gold:      {_entities(sentence.words, gold)}\n"
                f"  predicted: {_entities(sentence.words, predicted)}\n"
                f"  errors:    {'; '.join(errors)}\n\n"
            )
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
        f"{len(wrong)} of {len(examples)} sentences have a wrong entity; each is "
        "in `wrong_entities.txt` with its gold and predicted entities.",
    ]
    return "\n".join(lines)


def _entities(words, chunks) -> str:
    return " ".join(f"[{kind} {' '.join(words[start:end])}]" for kind, start, end in chunks) or "-"
