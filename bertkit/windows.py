"""Overlapping windows over long token sequences, and which window "owns" a token.

Google BERT's `run_squad.py` rule, shared by span QA and tagging: windows of at
most `window_size` tokens start `stride` tokens apart, the last one ends at the
end of the sequence, and a token seen by several windows is scored by the window
where it has the most context on both sides.
"""

from __future__ import annotations


def sliding_windows(length: int, window_size: int, stride: int) -> list[tuple[int, int]]:
    """Splits `range(length)` into `(start, end)` windows, end exclusive.

    Example:
        >>> sliding_windows(10, window_size=4, stride=3)
        [(0, 4), (3, 7), (6, 10)]
        >>> sliding_windows(3, window_size=4, stride=2)
        [(0, 3)]
        >>> sliding_windows(0, window_size=4, stride=2)
        [(0, 0)]
    """
    if window_size < 1 or stride < 1:
        raise ValueError("window_size and stride must be positive")
    windows, start = [], 0
    while True:
        end = min(start + window_size, length)
        windows.append((start, end))
        if end >= length:
            return windows
        start += min(stride, end - start)


def context_score(window: tuple[int, int], position: int) -> float:
    """How much context `position` has inside `window` (higher is better).

    min(left, right) context plus a small bonus for longer windows, as in
    Google BERT's `_check_is_max_context`.

    Example:
        >>> context_score((0, 4), 1), context_score((0, 4), 3)
        (1.04, 0.04)
    """
    start, end = window
    left, right = position - start, end - 1 - position
    return min(left, right) + 0.01 * (end - start)


def max_context_windows(windows: list[tuple[int, int]], length: int) -> list[int]:
    """For every position in `range(length)`, the index of the window that owns it.

    Example:
        >>> max_context_windows([(0, 4), (3, 7), (6, 10)], 10)
        [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    """
    owners = []
    for position in range(length):
        candidates = [i for i, (s, e) in enumerate(windows) if s <= position < e]
        owners.append(max(candidates, key=lambda i: (context_score(windows[i], position), -i)))
    return owners
