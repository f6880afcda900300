"""Sequence packing: a training batch's short rows laid end to end in a few long rows.

A random batch of 32 CoNLL-2003 sentences is mostly padding when each row is padded
to the batch's longest (25% real tokens here), and splitting it into length-sorted
micro-batches (`training.micro_batches`) trades that padding for four small steps.
Packing puts several rows into one model row instead (`training.packing: true`), as
transformers' `DataCollatorWithFlattening` does: each packed row holds whole rows
back to back, every token attends only to the tokens of its own row (a
block-diagonal attention mask), and positions restart at 0 for each row. With
dropout off the packed model computes every row's outputs exactly as the padded
model does (`tests/test_packing.py`), so the update is the one the batch would give
unpacked; the step multiplies fewer and larger matrices.

The packed model is the task's model re-wired (`bertkit.model.packed_backbone`): the same
layers and weights, three more inputs. Only training uses it; evaluation, the saved
weights and the export use the task's model as it is. A task packs when its
outputs are per token (tagging) or read the [CLS] vector of each row
(classification: the packed model gathers it with `first_token_index`); tasks whose
loss spans a whole row's positions (span QA's softmax over the window) do not.
"""

from __future__ import annotations

import numpy as np

from bertkit.task import Features

PACKING_INPUTS = ("position_ids", "sequence_index", "first_token_index")


def pack_lengths(lengths: np.ndarray, width: int) -> list[list[int]]:
    """Rows (indices into `lengths`) grouped into packed rows of at most `width` tokens.

    First-fit decreasing: the longest row first, each into the first packed row with
    room. Deterministic; within a packed row, rows keep that order.

    Example:
        >>> pack_lengths(np.array([5, 60, 30, 20, 40]), 64)
        [[1], [4, 3], [2, 0]]
    """
    order = np.argsort(-np.asarray(lengths), kind="stable")
    packed, room = [], []
    for row in order.tolist():
        size = int(lengths[row])
        if size > width:
            raise ValueError(f"a row of {size} tokens does not fit in {width}")
        for k, left in enumerate(room):
            if size <= left:
                packed[k].append(row)
                room[k] -= size
                break
        else:
            packed.append([row])
            room.append(width - size)
    return packed


def packing_width(longest: int, pad_lengths: tuple[int, ...], least: int = 64) -> int:
    """The length of a batch's packed rows: the padding length that holds its longest row,
    and at least `least` tokens (or the longest padding length, if shorter).

    Wider rows take more rows each; the block-diagonal attention over a row costs
    `width` per token and layer against about `24 * hidden` for the dense layers.

    Example:
        >>> packing_width(20, (16, 32, 64, 128))
        64
        >>> packing_width(70, (16, 32, 64, 128))
        128
    """
    wanted = max(longest, min(least, pad_lengths[-1]))
    index = int(np.searchsorted(pad_lengths, wanted))
    return pad_lengths[min(index, len(pad_lengths) - 1)]


def packed_row_counts(batch_size: int, devices: int = 1) -> tuple[int, ...]:
    """The numbers of packed rows a step may have where each input shape compiles anew
    (JAX, XLA): powers of two up to `batch_size`, so a run compiles a few programs;
    over several `devices` sharing each step, their multiples (each gets equal rows).

    Example:
        >>> packed_row_counts(24), packed_row_counts(24, devices=4)
        ((1, 2, 4, 8, 16, 24), (4, 8, 16, 24))
    """
    counts = [2**k for k in range(batch_size.bit_length()) if 2**k < batch_size]
    return tuple(sorted({-(-count // devices) * devices for count in (*counts, batch_size)}))


def pack_batch(
    features: Features,
    rows: np.ndarray,
    pad_lengths: tuple[int, ...],
    row_counts: tuple[int, ...] | None = None,
    real: int | None = None,
) -> dict:
    """Columns of `rows` packed into rows of `packing_width` tokens.

    Sequence columns become (packed rows, width) arrays, padded with their
    `pad_values`; per-row columns stay one value per row, in the order of `rows`.
    Adds `padding_mask`, `position_ids` (restarting at each row), `sequence_index`
    (1, 2, ... for the rows of a packed row, 0 on padding), `first_token_index`
    (each row's first token in the flattened packed batch, in the order of `rows`)
    and `row_index`. `row_counts`, when given, are the numbers of packed rows
    allowed (JAX compiles each shape): empty packed rows fill up to the next.
    Rows from `real` on are filler rows (`bertkit.padding.fill_rows`, so that the rows
    split evenly over devices): they get their per-row values and `first_token_index`
    0 but take no tokens, so they add no packed rows (their weight is 0).

    Example:
        >>> features = Features({"token_ids": [np.array([2, 5, 3]), np.array([2, 3])],
        ...                      "segment_ids": [np.zeros(3, int), np.zeros(2, int)]},
        ...                     example_index=np.arange(2))
        >>> packed = pack_batch(features, np.array([0, 1]), (8,))
        >>> packed["token_ids"].tolist(), packed["position_ids"].tolist()
        ([[2, 5, 3, 2, 3, 0, 0, 0]], [[0, 1, 2, 0, 1, 0, 0, 0]])
        >>> packed["sequence_index"].tolist(), packed["first_token_index"].tolist()
        ([[1, 1, 1, 2, 2, 0, 0, 0]], [0, 3])
    """
    lengths = features.lengths(rows)
    width = packing_width(int(lengths.max()), pad_lengths)
    layout = pack_lengths(lengths[:real], width)
    columns = _sequence_columns(features)
    batch = _empty_packed_batch(
        features, columns, rows, (packed_row_count(len(layout), row_counts), width)
    )
    for packed_row, members in enumerate(layout):
        _place_rows(batch, columns, rows, lengths, packed_row, members)
    return {**batch, **_per_row_columns(features, rows)}


def packed_row_count(count: int, row_counts: tuple[int, ...] | None) -> int:
    """`count` packed rows, or the next number of `row_counts` that holds them."""
    if not row_counts:
        return count
    allowed = row_counts[min(int(np.searchsorted(row_counts, count)), len(row_counts) - 1)]
    return max(allowed, count)


def _sequence_columns(features: Features) -> dict:
    """{name: column} of the columns of `features` that hold a sequence per row."""
    return {name: column for name, column in features.columns.items() if features.is_sequence(name)}


def _per_row_columns(features: Features, rows: np.ndarray) -> dict:
    """{name: one value per row of `rows`} of the columns that hold one value per row."""
    return {
        name: np.asarray(column)[rows]
        for name, column in features.columns.items()
        if not features.is_sequence(name)
    }


def _empty_packed_batch(
    features: Features, columns: dict, rows: np.ndarray, shape: tuple[int, int]
) -> dict:
    """The packing inputs, zeros, and each sequence column of `columns` as its padding."""
    batch = {
        "padding_mask": np.zeros(shape, np.int32),
        "position_ids": np.zeros(shape, np.int32),
        "sequence_index": np.zeros(shape, np.int32),
        "first_token_index": np.zeros(len(rows), np.int32),
        "row_index": rows,
    }
    for name, column in columns.items():
        dtype = np.asarray(column[rows[0]]).dtype
        batch[name] = np.full(shape, features.pad_values.get(name, 0), dtype=dtype)
    return batch


def _place_rows(
    batch: dict,
    columns: dict,
    rows: np.ndarray,
    lengths: np.ndarray,
    packed_row: int,
    members: list[int],
) -> None:
    """Writes `members` (indices into `rows`) end to end into packed row `packed_row`."""
    width = batch["padding_mask"].shape[1]
    start = 0
    for number, member in enumerate(members, start=1):
        size = int(lengths[member])
        span = slice(start, start + size)
        for name, column in columns.items():
            batch[name][packed_row, span] = column[rows[member]]
        batch["padding_mask"][packed_row, span] = 1
        batch["position_ids"][packed_row, span] = np.arange(size)
        batch["sequence_index"][packed_row, span] = number
        batch["first_token_index"][member] = packed_row * width + start
        start += size
