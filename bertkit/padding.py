"""Padding shared by training and inference: rows padded to a small fixed set of widths.

Padding every batch to `sequence_length` wastes most of the compute on real
sentence lengths; padding each batch to its own longest row, rounded up to one
of a few bucket lengths, keeps the number of compiled programs (XLA, JAX)
bounded. Training (`bertkit.batching.layouts`) and prediction (`bertkit.serving.inference`) pad
with the same functions, so a model sees the same shapes in both.
"""

from __future__ import annotations

import numpy as np

from bertkit.task import Features

_BASE_BUCKETS = (16, 32, 64, 128, 192, 256, 320, 384, 448, 512)


def bucket_lengths(sequence_length: int, buckets=None) -> tuple[int, ...]:
    """The lengths batches may be padded to.

    Example:
        >>> bucket_lengths(128)
        (16, 32, 64, 128)
        >>> bucket_lengths(100, (24, 48))
        (24, 48, 100)
    """
    chosen = [b for b in (buckets or _BASE_BUCKETS) if b < sequence_length]
    return tuple(sorted(set(chosen))) + (sequence_length,)


def accelerator_buckets(buckets: tuple[int, ...]) -> tuple[int, ...]:
    """The bucket lengths a run takes on an accelerator when the recipe sets none: none
    narrower than 64, and each at least twice the one before it (the longest kept), so
    that a run compiles fewer programs.

    Why: on one H200 (BERT-base, batch 32), SST-2 at length 64 trained its epoch in
    24.5 s of steps with one bucket of 64 against 32.8 s with 16, 32 and 64, and compiled
    2 programs before its first step instead of 6 (26 s against 45 s). Below about 128
    tokens a step costs nearly the same at any width there (11.6 ms at 64, 14.4 ms at
    128, 27.4 ms at 384), so narrower buckets save little and each costs a compilation
    of 20-35 s.

    Example:
        >>> accelerator_buckets((16, 32, 64))
        (64,)
        >>> accelerator_buckets((16, 32, 64, 128, 192, 256, 320, 384))
        (64, 128, 256, 384)
        >>> accelerator_buckets((16, 32))
        (32,)
    """
    longest = buckets[-1]
    doubled = {min(longest, 1 << (max(width, 64) - 1).bit_length()) for width in buckets}
    return tuple(sorted(doubled))


def padding_lengths(buckets: tuple[int, ...], compiles_each_shape: bool) -> tuple[int, ...]:
    """The widths batches are padded to: the bucket lengths where every new input shape
    compiles a program (XLA: JAX, TensorFlow with `jit_compile`), else every multiple
    of 8 up to the longest bucket as well.

    TensorFlow's own kernels take any shape without compiling (bertkit's traced step
    has no fixed length), so there a batch pads to its longest row rounded up to 8,
    not to the next bucket: the first 4,000 SST-2 sentences (13.3 tokens) pad to 16.9
    tokens a row instead of 22.3. Which rows form a batch does not change.

    Example:
        >>> padding_lengths((16, 32, 64), compiles_each_shape=True)
        (16, 32, 64)
        >>> padding_lengths((16, 32, 36), compiles_each_shape=False)
        (8, 16, 24, 32, 36)
    """
    if compiles_each_shape:
        return tuple(buckets)
    return tuple(sorted(set(range(8, buckets[-1], 8)) | set(buckets)))


def compiles_each_shape(model) -> bool:
    """Whether `model` compiles a new program for every new input shape (see
    `padding_lengths`)."""
    import keras

    return keras.backend.backend() == "jax" or bool(model.jit_compile)


def padded_length(longest: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket that holds `longest` tokens.

    Example:
        >>> padded_length(17, (16, 32, 64))
        32
    """
    index = int(np.searchsorted(buckets, longest))
    return buckets[min(index, len(buckets) - 1)]


def pad_batch(
    features: Features, rows: np.ndarray, buckets: tuple[int, ...], longest: int | None = None
) -> dict:
    """Columns of `rows` as arrays; sequence columns padded to a bucket length.

    The bucket is the one that holds the longest of `rows`, or `longest` tokens
    when given (a process's share of a batch is padded as the whole batch is).
    Adds `padding_mask` (1 for real tokens) and `row_index`.
    """
    lengths = features.lengths(rows)
    width = padded_length(int(lengths.max()) if longest is None else longest, buckets)
    batch = {
        "padding_mask": (np.arange(width)[None, :] < lengths[:, None]).astype(np.int32),
        "row_index": rows,
    }
    for name, column in features.columns.items():
        if features.is_sequence(name):
            values = [column[i] for i in rows]
            dtype = np.result_type(*[v.dtype for v in values[:1]])
            padded = np.full((len(rows), width), features.pad_values.get(name, 0), dtype=dtype)
            for j, value in enumerate(values):
                padded[j, : len(value)] = value
            batch[name] = padded
        else:
            batch[name] = np.asarray(column)[rows]
    return batch


def fill_rows(rows: np.ndarray, multiple: int) -> np.ndarray:
    """`rows` made a multiple of `multiple` long by repeating its first row.

    A batch spread over N devices must hold a multiple of N rows; the filler
    rows get weight 0 in training and their outputs are dropped in inference.

    Example:
        >>> fill_rows(np.array([7, 3, 5]), 2).tolist()
        [7, 3, 5, 7]
    """
    missing = -len(rows) % multiple
    return np.concatenate([rows, np.repeat(rows[:1], missing)]) if missing else rows


def inference_batches(lengths: np.ndarray, batch_size: int) -> list:
    """Batches of rows sorted by length (least padding); order does not matter for prediction."""
    order = np.argsort(lengths, kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
