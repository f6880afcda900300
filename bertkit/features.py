"""`Features`: a task's tokenized model rows, what `Task.featurize` returns and the batching
strategies, `fit` and `Task.decode` read (re-exported as `bertkit.task.Features`)."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class Features:
    """Tokenized model rows, unpadded; several rows may come from one example (windows).

    Attributes:
        columns: name -> per-row values. `token_ids` and `segment_ids` are
            required; a column is either a list of 1-D arrays as long as the row's
            `token_ids` (padded at batching time with `pad_values[name]`, default 0)
            or a 1-D array with one value per row.
        example_index: for each row, the index of the example it came from.
        pad_values: padding value per sequence column.
        extras: anything `decode` needs and the model does not (offsets, ...).
    """

    columns: dict
    example_index: np.ndarray
    pad_values: dict = dataclasses.field(default_factory=dict)
    extras: dict = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.columns["token_ids"])

    def lengths(self, rows=None) -> np.ndarray:
        """Token counts of all rows, or of `rows` (indices) only: a batch need not count
        every row of the data."""
        token_ids = self.columns["token_ids"]
        picked = range(len(self)) if rows is None else rows
        return np.fromiter((len(token_ids[i]) for i in picked), dtype=np.int64, count=len(picked))

    def is_sequence(self, name: str) -> bool:
        return isinstance(self.columns[name], list)
