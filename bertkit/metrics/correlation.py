"""Correlations of predicted scores with gold scores, in NumPy: Pearson's and Spearman's
(SciPy's `pearsonr` / `spearmanr` values, without SciPy)."""

from __future__ import annotations

import numpy as np


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of `values`, tied values sharing the mean of their ranks.

    Example:
        >>> average_ranks(np.array([0.5, 0.1, 0.5, 0.9])).tolist()
        [2.5, 1.0, 2.5, 4.0]
    """
    values = np.asarray(values, dtype=float)
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    _, group, counts = np.unique(values, return_inverse=True, return_counts=True)
    return np.bincount(group, weights=ranks)[group] / counts[group]


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson's correlation; 0 when either side is constant.

    Example:
        >>> pearson(np.array([1.0, 2.0, 3.0]), np.array([2.0, 4.0, 7.0]))  # doctest: +ELLIPSIS
        0.993...
    """
    x, y = np.asarray(x, dtype=float) - np.mean(x), np.asarray(y, dtype=float) - np.mean(y)
    denominator = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / denominator) if denominator > 0 else 0.0


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (Pearson's of the average ranks, as SciPy's).

    Example:
        >>> spearman(np.array([1.0, 2.0, 3.0]), np.array([2.0, 4.0, 70.0]))
        1.0
    """
    return pearson(average_ranks(x), average_ranks(y))
