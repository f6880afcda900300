"""The layouts a `BatchPlan` picks: how a step's rows become the model's arrays, padded
(`PaddedSteps`) or packed end to end into long rows (`PackedSteps`, see
`bertkit.batching.packing`).
"""

from __future__ import annotations

import numpy as np

from bertkit.batching.packing import (
    PACKING_INPUTS,
    pack_batch,
    pack_lengths,
    packed_row_count,
    packing_width,
)
from bertkit.padding import pad_batch, padded_length
from bertkit.task import Features


class PaddedSteps:
    """Layout: a step's rows padded to the smallest of `pad_lengths` that holds them."""

    def __init__(self, pad_lengths: tuple):
        self.pad_lengths = pad_lengths

    def make(self, task, features: Features, rows: np.ndarray, real: int, longest: int, rng):
        """The step of `rows`, of which those from `real` on are filler rows."""
        padded = pad_batch(features, rows, self.pad_lengths, longest=longest)
        return task.make_batch(padded, training=True, rng=rng)

    def model_to_fit(self, model, backbone):
        return model

    def step_shape(self, lengths: np.ndarray, real: int) -> tuple[int, int]:
        """(rows, width) of the step of rows with these token counts (fillers from `real`)."""
        return len(lengths), padded_length(int(lengths.max()), self.pad_lengths)


class PackedSteps:
    """Layout: a step's rows packed end to end into long rows (`bertkit.batching.packing`), for the
    task's model re-wired to take them (`bertkit.model.packed_backbone`)."""

    def __init__(self, pad_lengths: tuple, row_counts: tuple | None):
        self.pad_lengths, self.row_counts = pad_lengths, row_counts

    def make(self, task, features: Features, rows: np.ndarray, real: int, longest: int, rng):
        """The step of `rows`, of which those from `real` on are filler rows (not packed)."""
        packed = pack_batch(features, rows, self.pad_lengths, self.row_counts, real)
        inputs, targets, weights = task.make_batch(packed, training=True, rng=rng)
        return {**inputs, **{name: packed[name] for name in PACKING_INPUTS}}, targets, weights

    def model_to_fit(self, model, backbone):
        from bertkit.model.packed_backbone import packed_training_model

        return packed_training_model(model, backbone)

    def fixed_over(self, steps: list, devices: int = 1) -> PackedSteps:
        """This layout with one shape for every step of `steps` (each its rows' token
        counts): rows of the widest padding length, as many as the fullest step needs
        (a multiple of the `devices` sharing each step).

        Why on an accelerator: each packed shape compiles a program (20-35 s for
        BERT-base on a GPU): the powers of two of rows and the several widths made
        CoNLL-2003 compile 5 training programs (82 s) before its first step on an H200.
        Packed steps there are far below the rows a step must have to cost more, so
        the empty packed rows of a fixed shape cost little.

            >>> fixed = PackedSteps((64, 128), (1, 2, 4)).fixed_over([np.array([60, 60, 60])])
            >>> fixed.step_shape(np.array([10]), 1), fixed.step_shape(np.array([60, 60, 60]), 3)
            ((1, 2, 128), (3, 2, 128))
        """
        widest = self.pad_lengths[-1:]
        needed = max(len(pack_lengths(lengths, widest[0])) for lengths in steps)
        return PackedSteps(widest, (-(-needed // devices) * devices,))

    def step_shape(self, lengths: np.ndarray, real: int) -> tuple[int, int, int]:
        """(rows, packed rows, width) of the step of rows with these token counts (fillers
        from `real`)."""
        width = packing_width(int(lengths.max()), self.pad_lengths)
        packed = len(pack_lengths(lengths[:real], width))
        return len(lengths), packed_row_count(packed, self.row_counts), width
