"""Classification error analysis: per-class report, confusion matrix, misclassified examples."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from bertkit.report import markdown_table, pyplot
from bertkit_tasks.classification.metrics import confusion_matrix


def per_class_rows(matrix: np.ndarray, labels: list[str]) -> list[list]:
    """[label, precision, recall, F1, support] per class, from a gold x predicted matrix.

    Example:
        >>> per_class_rows(np.array([[1, 1], [0, 1]]), ["neg", "pos"])
        [['neg', 1.0, 0.5, 0.6667, 2], ['pos', 0.5, 1.0, 0.6667, 1]]
    """
    rows = []
    for i, label in enumerate(labels):
        correct, gold, predicted = matrix[i, i], matrix[i].sum(), matrix[:, i].sum()
        precision = correct / predicted if predicted else 0.0
        recall = correct / gold if gold else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        rows.append(
            [
                label,
                round(float(precision), 4),
                round(float(recall), 4),
                round(float(f1), 4),
                int(gold),
            ]
        )
    return rows


def plot_confusion_matrix(matrix: np.ndarray, labels: list[str], path) -> None:
    """Counts with row-normalized shading (rows = gold), readable up to ~30 labels."""
    plt = pyplot()
    size = min(3 + 0.45 * len(labels), 14)
    figure, axes = plt.subplots(figsize=(size + 1, size))
    shares = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    image = axes.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    axes.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
    axes.set_yticks(range(len(labels)), labels)
    axes.set_xlabel("predicted")
    axes.set_ylabel("gold")
    axes.set_title("confusion matrix\n(counts; shade: share of the gold row)", fontsize=10)
    if len(labels) <= 30:
        for (i, j), count in np.ndenumerate(matrix):
            axes.text(
                j,
                i,
                str(count),
                ha="center",
                va="center",
                color="white" if shares[i, j] > 0.6 else "black",
            )
    figure.colorbar(image, ax=axes, fraction=0.046)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def classification_report(
    examples, predictions, labels: list[str], directory, shown_errors: int = 10
) -> str:
    """Writes confusion_matrix.png and misclassified.tsv; returns the Markdown section."""
    directory = Path(directory)
    gold = np.array([labels.index(e.label) for e in examples])
    predicted = np.array([labels.index(p["label"]) for p in predictions])
    matrix = confusion_matrix(gold, predicted, len(labels))
    plot_confusion_matrix(matrix, labels, directory / "confusion_matrix.png")
    errors = sorted(
        (
            (p["score"], e, p)
            for e, p in zip(examples, predictions, strict=True)
            if p["label"] != e.label
        ),
        key=lambda item: -item[0],
    )
    with open(directory / "misclassified.tsv", "w", newline="") as file:
        writer = csv.writer(file, delimiter="\t", lineterminator="\n")
        writer.writerow(["text", "text_pair", "gold", "predicted", "score"])
        for score, example, prediction in errors:
            writer.writerow(
                [
                    _one_line(example.text),
                    _one_line(example.text_pair or ""),
                    example.label,
                    prediction["label"],
                    f"{score:.4f}",
                ]
            )
    header = [str(label) for label in labels]
    lines = [
        "## Per class",
        "",
        markdown_table(
            ["label", "precision", "recall", "F1", "support"], per_class_rows(matrix, labels)
        ),
        "",
        "## Confusion matrix (rows: gold, columns: predicted)",
        "",
        markdown_table(
            ["gold \\ predicted", *header],
            [[label, *map(int, row)] for label, row in zip(labels, matrix, strict=True)],
        ),
        "",
        "![confusion matrix](confusion_matrix.png)",
        "",
        f"## Misclassified: {len(errors)} of {len(examples)}",
        "",
    ]
    if errors:
        lines += [
            f"The {min(shown_errors, len(errors))} most confident mistakes "
            "(all in `misclassified.tsv`):",
            "",
            markdown_table(
                ["text", "gold", "predicted", "score"],
                [
                    [_shorten(_one_line(e.text)), e.label, p["label"], f"{s:.3f}"]
                    for s, e, p in errors[:shown_errors]
                ],
            ),
        ]
    return "\n".join(lines)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _shorten(text: str, width: int = 80) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
