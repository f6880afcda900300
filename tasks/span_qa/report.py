"""Question-answering error analysis: F1 by question word, and for SQuAD v2.0 the
has-answer / no-answer split with the no-answer threshold."""

from __future__ import annotations

import re

from bertkit.report import markdown_table
from bertkit_tasks.span_qa.squad_eval import question_scores

QUESTION_WORDS = ("what", "which", "who", "whom", "whose", "when", "where", "why", "how")


def question_word(question: str) -> str:
    """The first wh-word of a question, else "other".

    Example:
        >>> question_word("In which year did it open?"), question_word("Is it red?")
        ('which', 'other')
    """
    for word in re.findall(r"[a-z]+", question.lower()):
        if word in QUESTION_WORDS:
            return word
    return "other"


def scores_by_question_word(
    examples, answers: list[str], version: str, metric: str = "squad"
) -> list[list]:
    """[question word, questions, EM, F1] rows (percentages, with `metric`'s scores),
    most frequent first."""
    groups: dict[str, list[tuple[float, float]]] = {}
    for example, answer in zip(examples, answers, strict=True):
        scores = question_scores(answer, example.answers, version, metric)
        groups.setdefault(question_word(example.question), []).append(scores)
    rows = [
        [
            word,
            len(scores),
            100 * sum(s[0] for s in scores) / len(scores),
            100 * sum(s[1] for s in scores) / len(scores),
        ]
        for word, scores in groups.items()
    ]
    return sorted(rows, key=lambda row: (-row[1], row[0]))


def qa_report(examples, predictions, metrics: dict, version: str, threshold: float) -> str:
    answers = [p["answer"] for p in predictions]
    lines = [
        "## Exact match and F1 by question word",
        "",
        markdown_table(
            ["question word", "questions", "exact match", "F1"],
            scores_by_question_word(examples, answers, version, metrics.get("metric", "squad")),
        ),
    ]
    if version == "2.0":
        rows = [
            [
                split,
                metrics.get(f"{split}_total", ""),
                metrics.get(f"{split}_exact", ""),
                metrics.get(f"{split}_f1", ""),
            ]
            for split in ("HasAns", "NoAns")
            if f"{split}_total" in metrics
        ]
        lines += [
            "",
            "## Has answer / no answer",
            "",
            f'No-answer threshold: {threshold:.4f} (a question is answered "" when '
            "null score - best span score exceeds it).",
            "",
            markdown_table(["questions", "count", "exact match", "F1"], rows),
        ]
    return "\n".join(lines)
