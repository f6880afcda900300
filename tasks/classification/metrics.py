"""Classification metrics on label ids, in NumPy (scikit-learn semantics)."""

from __future__ import annotations

import numpy as np


def confusion_matrix(gold: np.ndarray, predicted: np.ndarray, num_labels: int) -> np.ndarray:
    """(num_labels, num_labels) counts, rows = gold, columns = predicted.

    Example:
        >>> confusion_matrix(np.array([0, 0, 1]), np.array([0, 1, 1]), 2).tolist()
        [[1, 1], [0, 1]]
    """
    matrix = np.zeros((num_labels, num_labels), dtype=np.int64)
    np.add.at(matrix, (gold, predicted), 1)
    return matrix


def macro_f1(matrix: np.ndarray) -> float:
    """Unweighted mean of per-label F1 over labels seen in gold or predictions.

    Example:
        >>> round(macro_f1(np.array([[1, 1], [0, 1]])), 4)  # F1s 2/3 and 2/3
        0.6667
    """
    true_positive = np.diag(matrix).astype(float)
    support = matrix.sum(axis=1) + matrix.sum(axis=0)
    present = support > 0
    f1 = np.divide(2 * true_positive, support, out=np.zeros_like(true_positive), where=present)
    return float(f1[present].mean()) if present.any() else 0.0


def matthews_corrcoef(matrix: np.ndarray) -> float:
    """Matthews correlation coefficient of a 2x2 (or multi-class) confusion matrix.

    Example:
        >>> round(matthews_corrcoef(np.array([[1, 1], [0, 1]])), 4)  # (1-0)/sqrt(2*1*2*1)
        0.5
    """
    matrix = matrix.astype(float)
    total = matrix.sum()
    correct = np.trace(matrix)
    gold, predicted = matrix.sum(axis=1), matrix.sum(axis=0)
    numerator = correct * total - gold @ predicted
    denominator = np.sqrt((total**2 - predicted @ predicted) * (total**2 - gold @ gold))
    return float(numerator / denominator) if denominator > 0 else 0.0
