"""Padded batches over a small fixed set of lengths, in a seeded, resumable order.

Padding every batch to `sequence_length` wastes most of the compute on real
sentence lengths; padding each batch to its own longest row, rounded up to one
of a few bucket lengths, keeps the number of compiled programs (XLA, JAX)
bounded. Each training batch takes rows whose lengths pad to the same bucket
(length bucketing), drawn at random within that bucket: the same padding as
sorting rows by length, without batches of near-identical rows (sorted pools
put, say, all of CoNLL's two-word bylines in one batch, and cost entity F1).

The order of epoch `e` depends only on (seed, e): a resumed run sees the same
batches as an uninterrupted one.
"""

from __future__ import annotations

import keras
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


def padded_length(longest: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket that holds `longest` tokens.

    Example:
        >>> padded_length(17, (16, 32, 64))
        32
    """
    index = int(np.searchsorted(buckets, longest))
    return buckets[min(index, len(buckets) - 1)]


def pad_batch(features: Features, rows: np.ndarray, buckets: tuple[int, ...]) -> dict:
    """Columns of `rows` as arrays; sequence columns padded to a bucket length.

    Adds `padding_mask` (1 for real tokens) and `row_index`.
    """
    lengths = features.lengths()[rows]
    width = padded_length(int(lengths.max()), buckets)
    batch = {"padding_mask": (np.arange(width)[None, :] < lengths[:, None]).astype(np.int32),
             "row_index": rows}
    for name, column in features.columns.items():
        if features.is_sequence(name):
            values = [column[i] for i in rows]
            dtype = np.result_type(*[v.dtype for v in values[:1]])
            padded = np.full((len(rows), width), features.pad_values.get(name, 0), dtype=dtype)
            for j, value in enumerate(values):
                padded[j, :len(value)] = value
            batch[name] = padded
        else:
            batch[name] = np.asarray(column)[rows]
    return batch


def epoch_batches(lengths: np.ndarray, batch_size: int, buckets: tuple[int, ...], seed: int,
                  epoch: int) -> list:
    """Row indices of each training batch of one epoch: bucketed by length, shuffled.

    Rows are grouped by the bucket their length pads to, shuffled within the
    group and cut into full batches; the groups' remainders are batched
    together, shortest first. The batch order is shuffled too. The number of
    batches depends only on `lengths`, not on the epoch.

    Example:
        >>> lengths = np.array([5, 50, 6, 51])
        >>> sorted(sorted(b.tolist()) for b in epoch_batches(lengths, 2, (16, 64), 0, 0))
        [[0, 2], [1, 3]]
    """
    rng = np.random.default_rng([seed, epoch])
    bucket_of_row = np.searchsorted(buckets, lengths)
    batches, remainders = [], []
    for bucket in np.unique(bucket_of_row):
        rows = rng.permutation(np.flatnonzero(bucket_of_row == bucket))
        full = len(rows) - len(rows) % batch_size
        batches += [rows[i:i + batch_size] for i in range(0, full, batch_size)]
        remainders.append(rows[full:])
    rest = np.concatenate(remainders)
    rest = rest[np.argsort(lengths[rest], kind="stable")]
    batches += [rest[i:i + batch_size] for i in range(0, len(rest), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def inference_batches(lengths: np.ndarray, batch_size: int) -> list:
    """Batches of rows sorted by length (least padding); order does not matter for prediction."""
    order = np.argsort(lengths, kind="stable")
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


class TrainingBatches:
    """The training batches of every epoch, made by the task from padded columns.

    `set_epoch` is called by a callback at the start of each epoch, so the data
    order follows the epoch number even when training resumes mid-run.
    """

    def __init__(self, task, features: Features, batch_size: int, buckets, seed: int):
        self.task, self.features, self.batch_size = task, features, batch_size
        self.buckets, self.seed = tuple(buckets), seed
        self.lengths = features.lengths()
        self.epoch = 0
        self._steps = len(epoch_batches(self.lengths, batch_size, self.buckets, seed, 0))

    def __len__(self) -> int:
        return self._steps

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        return (self.batch(step) for step in range(len(self)))

    def batch(self, step: int):
        """Batch `step` of the current epoch, as Keras `fit` takes it."""
        if getattr(self, "_plan_epoch", None) != self.epoch:
            self._plan = epoch_batches(self.lengths, self.batch_size, self.buckets, self.seed,
                                       self.epoch)
            self._plan_epoch = self.epoch
        rng = np.random.default_rng([self.seed, self.epoch, step, 1])
        batch = pad_batch(self.features, self._plan[step], self.buckets)
        inputs, targets, weights = self.task.make_batch(batch, training=True, rng=rng)
        return (inputs, targets) if weights is None else (inputs, targets, weights)

    def as_dataset(self):
        """A `tf.data.Dataset` with unknown lengths on TensorFlow, a `PyDataset` elsewhere."""
        if keras.backend.backend() != "tensorflow":
            return BatchesPyDataset(self)
        import tensorflow as tf

        def spec(value):
            return tf.nest.map_structure(
                lambda v: tf.TensorSpec((None,) * np.ndim(v), tf.as_dtype(np.asarray(v).dtype)),
                value)

        first = next(iter(self))
        dataset = tf.data.Dataset.from_generator(self.__iter__, output_signature=spec(first))
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(len(self)))
        return dataset.prefetch(2)



class BatchesPyDataset(keras.utils.PyDataset):
    """Keras's backend-neutral input, for JAX and PyTorch (no TensorFlow needed)."""

    def __init__(self, batches: TrainingBatches):
        super().__init__()
        self.batches = batches

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, step):
        return self.batches.batch(step)
