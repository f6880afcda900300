"""Numeric targets: read from a data file's cell, and their training statistics."""

from __future__ import annotations

import math

import numpy as np

from bertkit.errors import UserError


def parse_target(value, *, source=None, line=None, key=None) -> float:
    """A cell as a finite number: a number, or a string that reads as one.

    Example:
        >>> parse_target("3.800"), parse_target(2)
        (3.8, 2.0)
        >>> parse_target("high", source="train.tsv", line=4, key="score")
        Traceback (most recent call last):
        ...
        bertkit.errors.UserError: train.tsv:4: score: expected a number as the target, got 'high'
    """
    number = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            pass
    if number is None or not math.isfinite(number):
        raise UserError(
            f"expected a number as the target, got {value!r:.40}", source=source, line=line, key=key
        )
    return number


def target_statistics(targets: list[float], normalize: bool, *, source=None, key=None) -> dict:
    """`{"target_mean", "target_std"}` the model learns targets in units of: the training
    targets' mean and standard deviation, or 0 and 1 where `normalize` is off. Refuses a
    training set whose targets are all one value (nothing to learn).

    Example:
        >>> target_statistics([1.0, 3.0], normalize=True)
        {'target_mean': 2.0, 'target_std': 1.0}
        >>> target_statistics([1.0, 3.0], normalize=False)
        {'target_mean': 0.0, 'target_std': 1.0}
    """
    values = np.asarray(targets, dtype=np.float64)
    if len(values) and float(values.std()) == 0.0:
        raise UserError(
            f"every training target is {values[0]:g}: there is nothing to learn",
            source=source,
            key=key,
        )
    if not normalize or not len(values):
        return {"target_mean": 0.0, "target_std": 1.0}
    return {"target_mean": float(values.mean()), "target_std": float(values.std())}
