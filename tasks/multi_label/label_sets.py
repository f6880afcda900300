"""Multi-label metrics and decision thresholds, in NumPy, over (examples, labels) arrays of
gold 0/1 and predicted probabilities."""

from __future__ import annotations

import numpy as np

# The thresholds tried when tuning: from 0.05 to 0.95 by 0.05 (transformers' multi-label
# examples and setfit fix 0.5; a tuned threshold is the common fix for rare labels).
CANDIDATES = np.round(np.arange(0.05, 0.951, 0.05), 2)


def f1_scores(gold: np.ndarray, predicted: np.ndarray) -> dict:
    """Micro F1 over every (example, label) decision, macro F1 (the mean of the labels'
    F1, a label without gold or predicted examples counting 1) and each label's F1.

    Example:
        >>> gold = np.array([[1, 0], [1, 1]]); predicted = np.array([[1, 1], [0, 1]])
        >>> scores = f1_scores(gold, predicted)
        >>> round(scores["micro_f1"], 4), [round(float(f), 4) for f in scores["per_label"]]
        (0.6667, [0.6667, 0.6667])
    """
    gold, predicted = gold.astype(bool), predicted.astype(bool)
    true = (gold & predicted).sum(axis=0).astype(float)
    both = gold.sum(axis=0) + predicted.sum(axis=0)
    per_label = np.divide(2 * true, both, out=np.ones_like(true), where=both > 0)
    micro = 2 * true.sum() / both.sum() if both.sum() else 1.0
    return {"micro_f1": float(micro), "macro_f1": float(per_label.mean()), "per_label": per_label}


def tuned_thresholds(gold: np.ndarray, probabilities: np.ndarray, per_label: bool) -> list:
    """The thresholds (one per label) of the best validation F1 among `CANDIDATES`: one for
    every label by micro F1, or each label's own by its F1 (the first best: ties keep the
    lower threshold).

    Example:
        >>> gold = np.array([[1, 0], [0, 1], [1, 0]])
        >>> probabilities = np.array([[0.3, 0.2], [0.1, 0.9], [0.4, 0.6]])
        >>> tuned_thresholds(gold, probabilities, per_label=True)
        [0.15, 0.65]
    """
    if per_label:
        return [
            float(CANDIDATES[np.argmax([_label_f1(gold[:, j], probabilities[:, j], t)
                                        for t in CANDIDATES])])
            for j in range(gold.shape[1])
        ]  # fmt: skip
    scores = [f1_scores(gold, probabilities >= t)["micro_f1"] for t in CANDIDATES]
    return [float(CANDIDATES[int(np.argmax(scores))])] * gold.shape[1]


def _label_f1(gold: np.ndarray, probabilities: np.ndarray, threshold: float) -> float:
    predicted = probabilities >= threshold
    both = gold.sum() + predicted.sum()
    return 2 * float((gold.astype(bool) & predicted).sum()) / both if both else 1.0
