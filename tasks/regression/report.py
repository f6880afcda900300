"""Regression error analysis: errors by gold range, a scatter plot, the largest errors."""

from __future__ import annotations

import numpy as np

from bertkit.report import markdown_table, pyplot

SHOWN_ERRORS = 10


def error_by_range(gold: np.ndarray, predicted: np.ndarray, bins: int = 5) -> list[list]:
    """[gold range, examples, mean error, mean absolute error] over `bins` equal-width
    ranges of the gold targets (empty ranges left out).

    Example:
        >>> error_by_range(np.array([0.0, 1.0, 4.0, 5.0]), np.array([1.0, 1.0, 4.0, 3.0]), 2)
        [['0-2.5', 2, 0.5, 0.5], ['2.5-5', 2, -1.0, 1.0]]
    """
    edges = np.linspace(gold.min(), gold.max(), bins + 1)
    which = np.clip(np.searchsorted(edges, gold, side="right") - 1, 0, bins - 1)
    rows = []
    for index in range(bins):
        inside = which == index
        if inside.any():
            errors = predicted[inside] - gold[inside]
            span = f"{edges[index]:.3g}-{edges[index + 1]:.3g}"
            rows.append(
                [span, int(inside.sum()), round(float(errors.mean()), 4),
                 round(float(np.abs(errors).mean()), 4)]
            )  # fmt: skip
    return rows


def plot_predictions(gold: np.ndarray, predicted: np.ndarray, path) -> None:
    """Predicted against gold, with the diagonal of perfect predictions."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(5, 5))
    axes.scatter(gold, predicted, s=6, alpha=0.4)
    low, high = min(gold.min(), predicted.min()), max(gold.max(), predicted.max())
    axes.plot([low, high], [low, high], color="black", linewidth=1)
    axes.set_xlabel("gold")
    axes.set_ylabel("predicted")
    axes.set_title("predictions against gold targets", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def regression_report(examples: list, predictions: list[dict], directory) -> str:
    """The report's Markdown: errors by gold range, the scatter plot (written into
    `directory`), and the examples with the largest errors."""
    gold = np.array([e.target for e in examples], dtype=np.float64)
    predicted = np.array([p["score"] for p in predictions], dtype=np.float64)
    plot_predictions(gold, predicted, directory / "predictions.png")
    worst = np.argsort(-np.abs(predicted - gold), kind="stable")[:SHOWN_ERRORS]
    rows = [
        [_shorten(examples[i].text), _shorten(examples[i].text_pair or ""),
         f"{gold[i]:.3g}", f"{predicted[i]:.3g}"]
        for i in worst
    ]  # fmt: skip
    return "\n".join(
        [
            "## Errors by gold range",
            "",
            markdown_table(
                ["gold range", "examples", "mean error", "mean absolute error"],
                error_by_range(gold, predicted),
            ),
            "",
            "![predictions against gold](predictions.png)",
            "",
            f"## The {len(worst)} largest errors",
            "",
            markdown_table(["text", "text pair", "gold", "predicted"], rows),
        ]
    )


def _shorten(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
