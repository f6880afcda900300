"""Class-balanced loss weights for tagging (`task.class_weights: balanced`).

On small, noisy sets most words are `O` and a rare type has a few dozen mentions: the mean
loss is then nearly all `O`, and a model that never predicts the rare tags loses little.
Weighting each labelled word by its tag's inverse square root frequency (the "effective"
middle ground between no weighting and inverse frequency, which over-weights tags seen a
handful of times) lets the rare tags count. The weights are normalised to a mean of 1 over
the training words, so the loss keeps its scale:

    weight[tag] = count[tag] ** -0.5 * total / sum(count[t] ** 0.5 for t in tags)

where `count[tag]` is how many training words carry `tag` (in the model's tag scheme) and
`total` the number of training words: `sum(count[t] * weight[t]) == total`.
"""

from __future__ import annotations

from collections import Counter

import numpy as np


def balanced_class_weights(tag_counts: Counter, labels: list[str]) -> list[float]:
    """Each label's weight, in the order of `labels`, from the training words' tag counts.

    Example:
        >>> weights = balanced_class_weights(Counter({"O": 90, "B-PER": 9, "I-PER": 1}),
        ...                                  ["O", "B-PER", "I-PER"])
        >>> [round(w, 3) for w in weights]
        [0.782, 2.472, 7.415]
        >>> round(90 * weights[0] + 9 * weights[1] + 1 * weights[2], 6)  # mean 1 over words
        100.0
    """
    counts = np.array([tag_counts[label] for label in labels], dtype=np.float64)
    counts = np.maximum(counts, 1.0)  # a label with no training word: as rare as one word
    weights = counts**-0.5 * counts.sum() / np.sqrt(counts).sum()
    return [float(weight) for weight in weights]
