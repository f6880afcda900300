"""Padded batches over a small fixed set of lengths, in a seeded, resumable order.

Padding every batch to `sequence_length` wastes most of the compute on real
sentence lengths; padding each batch to its own longest row, rounded up to one
of a few bucket lengths, keeps the number of compiled programs (XLA, JAX)
bounded. Each training batch takes rows whose lengths pad to the same bucket
(length bucketing), drawn at random within that bucket: the same padding as
sorting rows by length, without batches of near-identical rows (sorted pools
put, say, all of CoNLL's two-word bylines in one batch, and cost entity F1).

Length buckets still make batches of similar lengths, which costs a little
accuracy on some data (CoNLL-2003). The `random` order draws each batch's rows
at random, as `transformers`' Trainer does, and splits it into `micro_batches`
by length (`split_by_length`: as little padding as length buckets), their
gradients are accumulated, and the update is the one the whole batch would
give. Sample weights are normalized over the whole batch (`normalize_weights`),
so its loss is the weighted mean over all its targets, however it is split and
padded; a task without weights gets one weight per row when batches are split.
That is exact for losses that average over rows or over the weighted
positions (tagging, masked LM); a loss that averages over positions it picks
itself (Keras' `ignore_class`) would be averaged per part, so tasks give
weights instead.

The order of epoch `e` depends only on (seed, e): a resumed run sees the same
batches as an uninterrupted one.
"""

from __future__ import annotations

import keras
import numpy as np

from bertkit.errors import UserError
from bertkit.multi_process import process_index, process_share
from bertkit.packing import PACKING_INPUTS, pack_batch
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
    return keras.backend.backend() == "jax" or bool(model.jit_compile)


def padded_length(longest: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket that holds `longest` tokens.

    Example:
        >>> padded_length(17, (16, 32, 64))
        32
    """
    index = int(np.searchsorted(buckets, longest))
    return buckets[min(index, len(buckets) - 1)]


def pad_batch(features: Features, rows: np.ndarray, buckets: tuple[int, ...],
              longest: int | None = None) -> dict:
    """Columns of `rows` as arrays; sequence columns padded to a bucket length.

    The bucket is the one that holds the longest of `rows`, or `longest` tokens
    when given (a process's share of a batch is padded as the whole batch is).
    Adds `padding_mask` (1 for real tokens) and `row_index`.
    """
    lengths = features.lengths(rows)
    width = padded_length(int(lengths.max()) if longest is None else longest, buckets)
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


def random_batches(num_rows: int, batch_size: int, seed: int, epoch: int) -> list:
    """Row indices of each training batch of one epoch, drawn at random, whatever their length.

    `ceil(num_rows / batch_size)` batches whose sizes differ by at most one, so
    that no batch is a small remainder (each must split into micro-batches).

    Example:
        >>> [len(rows) for rows in random_batches(10, 4, seed=0, epoch=0)]
        [4, 3, 3]
    """
    rng = np.random.default_rng([seed, epoch])
    return np.array_split(rng.permutation(num_rows), -(-num_rows // batch_size))


def split_by_length(rows: np.ndarray, lengths: np.ndarray, parts: int,
                    buckets: tuple[int, ...]) -> list:
    """`rows` cut into `parts` micro-batches with the fewest padded tokens in all.

    Rows are sorted by length and cut where the padded total (each part padded
    to its bucket) is smallest, found by dynamic programming over the cut
    points; among equal totals, the most even sizes. With one part per bucket
    in use, every row pads to its own bucket: on CoNLL-2003, 4 parts of random
    batches of 32 pad no more than length buckets do (29.6 tokens a row
    against 29.8).

    Example:
        >>> lengths = np.array([40, 5, 30, 6, 7])
        >>> [m.tolist() for m in split_by_length(np.arange(5), lengths, 2, (16, 64))]
        [[1, 3, 4], [2, 0]]
    """
    ordered = rows[np.argsort(lengths[rows], kind="stable")]
    width = [padded_length(int(n), buckets) for n in lengths[ordered]]  # of a part ending here
    count = len(ordered)
    # cost[k][j]: fewest padded tokens for the first j rows in k parts; cut[k][j]: the last cut
    cost = [[0.0] + [np.inf] * count] + [[np.inf] * (count + 1) for _ in range(parts)]
    cut = [[0] * (count + 1) for _ in range(parts + 1)]
    for k in range(1, parts + 1):
        for j in range(k, count + 1):
            for i in range(k - 1, j):
                size = j - i  # ties (rows of one bucket) go to the more even parts
                total = cost[k - 1][i] + size * width[j - 1] + 1e-4 * size * size
                if total < cost[k][j]:
                    cost[k][j], cut[k][j] = total, i
    ends = [count]
    for k in range(parts, 1, -1):
        ends.append(cut[k][ends[-1]])
    bounds = [0, *reversed(ends)]
    return [ordered[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def normalize_weights(weights: list) -> list:
    """Sample weights of a batch's micro-batches, scaled to make its loss their weighted mean.

    Keras averages a loss over all target positions (`sum_over_batch_size`),
    and accumulation averages the micro-batches' losses. Scaling micro-batch
    `k`'s weights `w_k` (`P_k` positions) by `N * P_k / sum(all w)` makes that
    average `sum(w * loss) / sum(w)` over the whole batch: each labelled token
    counts once, however long its micro-batch is padded.

    Example:
        >>> whole = normalize_weights([np.array([[1.0, 1.0, 0.0, 0.0]])])
        >>> whole[0].tolist()  # 4 positions, 2 labelled: each counts 2 in the mean over 4
        [[2.0, 2.0, 0.0, 0.0]]
        >>> parts = normalize_weights([np.array([1.0, 1.0]), np.array([1.0, 1.0, 0.0, 0.0])])
        >>> [w.tolist() for w in parts]  # the part padded wider gets larger weights
        [[1.0, 1.0], [2.0, 2.0, 0.0, 0.0]]
    """
    total = max(float(sum(np.sum(w) for w in weights)), 1e-12)
    return [(w * (len(weights) * np.size(w) / total)).astype(np.float32) for w in weights]


def _row_weights(targets):
    """Weight 1 for every row, for each output of `targets` (an array or a dict of them)."""
    if isinstance(targets, dict):
        return {name: _row_weights(value) for name, value in targets.items()}
    return np.ones(len(targets), np.float32)


def _normalize_each_output(weights: list) -> list:
    if isinstance(weights[0], dict):
        by_output = {name: normalize_weights([w[name] for w in weights]) for name in weights[0]}
        return [{name: by_output[name][k] for name in by_output} for k in range(len(weights))]
    return normalize_weights(weights)


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


def _zero_filler_rows(weights, count: int):
    """`weights` (an array, or a dict of them) with rows from `count` on set to 0."""
    if isinstance(weights, dict):
        return {name: _zero_filler_rows(value, count) for name, value in weights.items()}
    weights = np.array(weights, np.float32)
    weights[count:] = 0.0
    return weights


def inference_batches(lengths: np.ndarray, batch_size: int) -> list:
    """Batches of rows sorted by length (least padding); order does not matter for prediction."""
    order = np.argsort(lengths, kind="stable")
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


class TrainingBatches:
    """The training batches of every epoch, made by the task from padded columns.

    One step is one micro-batch: with `micro_batches` N, steps `kN .. kN+N-1`
    are the parts of batch `k` (the optimizer accumulates N steps, see
    `bertkit.optimization.make_optimizer`). `buckets` decide which rows form a
    `length_buckets` batch; each step is padded to the smallest of `pad_lengths`
    (default: `buckets`, see `padding_lengths`) that holds its rows. `set_epoch`
    is called by a callback at the start of each epoch, so the data order follows
    the epoch number even when training resumes mid-run. With `packing`, each step's
    rows are packed into long rows (`bertkit.packing.pack_batch`; `row_counts`: the
    numbers of packed rows allowed) for the model `packed_training_model` makes.
    """

    def __init__(self, task, features: Features, batch_size: int, buckets, seed: int,
                 order: str = "length_buckets", micro_batches: int = 1, row_multiple: int = 1,
                 pad_lengths=None, packing: bool = False, row_counts=None):
        if order not in ("length_buckets", "random"):
            raise ValueError(f"unknown batch order {order!r}")
        self.task, self.features, self.batch_size = task, features, batch_size
        self.buckets, self.seed = tuple(buckets), seed
        self.pad_lengths = tuple(pad_lengths or buckets)
        self.order, self.micro_batches = order, micro_batches
        self.row_multiple = row_multiple  # devices sharing each step (see fill_rows)
        if packing and row_multiple > 1:
            raise ValueError("packed batches cannot be shared by several devices")
        self.packing, self.row_counts = packing, row_counts
        self.lengths = features.lengths()
        self.epoch = 0
        batches = self._batches(0)
        smallest = min(len(rows) for rows in batches)
        if smallest < micro_batches:
            raise UserError(f"a batch of {smallest} training rows cannot be split into "
                            f"{micro_batches} micro-batches", key="training.micro_batches")
        self._steps = len(batches) * micro_batches
        self._made = (None, None)  # ((epoch, first step of a batch), its made parts)
        self._plan, self._plan_epoch = None, None  # the current epoch's step rows

    def _batches(self, epoch: int) -> list:
        if self.order == "random":
            return random_batches(len(self.lengths), self.batch_size, self.seed, epoch)
        return epoch_batches(self.lengths, self.batch_size, self.buckets, self.seed, epoch)

    def step_rows(self, epoch: int) -> list:
        """Row indices of each step of `epoch`: its batches, or their micro-batches in turn."""
        if self.micro_batches == 1:
            return self._batches(epoch)
        return [part for rows in self._batches(epoch)
                for part in split_by_length(rows, self.lengths, self.micro_batches,
                                            self.pad_lengths)]

    def __len__(self) -> int:
        return self._steps

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        return (self.batch(step) for step in range(len(self)))

    def batch(self, step: int):
        """Step `step` of the current epoch, as Keras `fit` takes it."""
        first = step - step % self.micro_batches
        made = self._made  # one read: a PyDataset may call from several threads
        if made[0] != (self.epoch, first):
            made = self._made = ((self.epoch, first), self._make_parts(first))
        return made[1][step - first]

    def _make_parts(self, first: int) -> list:
        """The steps of the batch that starts at step `first`, weights normalized over it."""
        if self._plan_epoch != self.epoch:
            self._plan = self.step_rows(self.epoch)
            self._plan_epoch = self.epoch
        made, counts = [], []
        for step in range(first, first + self.micro_batches):
            rows = fill_rows(self._plan[step], self.row_multiple)
            share = process_share(len(rows))  # this process's rows; all of them in one
            made.append(self._make_step(rows[share], int(self.lengths[rows].max()), step))
            real = len(self._plan[step])  # the filler rows come after these
            counts.append((min(max(real - share.start, 0), len(rows[share])), len(rows[share])))
        filled = any(real < size for real, size in counts)
        if made[0][2] is None:
            if self.micro_batches == 1 and self.row_multiple == 1:
                return [(inputs, targets) for inputs, targets, _ in made]
            # Parts differ in size, or some may get filler rows: weigh rows so that
            # each counts once in the update (and every step has the same structure,
            # which Keras's distributed input needs).
            made = [(inputs, targets, _row_weights(targets)) for inputs, targets, _ in made]
        if filled:  # filler rows (see fill_rows) weigh nothing
            made = [(inputs, targets, _zero_filler_rows(w, real))
                    for (inputs, targets, w), (real, _) in zip(made, counts, strict=True)]
        weights = _normalize_each_output([w for _, _, w in made])
        return [(inputs, targets, w) for (inputs, targets, _), w in zip(made, weights, strict=True)]

    def _make_step(self, rows: np.ndarray, longest: int, step: int):
        """(inputs, targets, weights) of one step's rows, padded or packed."""
        if not self.packing:
            padded = pad_batch(self.features, rows, self.pad_lengths, longest=longest)
            return self.task.make_batch(padded, training=True, rng=self._rng(step))
        packed = pack_batch(self.features, rows, self.pad_lengths, self.row_counts)
        inputs, targets, weights = self.task.make_batch(packed, training=True, rng=self._rng(step))
        return {**inputs, **{name: packed[name] for name in PACKING_INPUTS}}, targets, weights

    def _rng(self, step: int):
        """The random draws of a step's batch (e.g. masked positions), per process share."""
        key = [self.seed, self.epoch, step, 1]
        return np.random.default_rng(key + [process_index()] if process_index() else key)

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
        # Keras drops each epoch's iterator (at the next epoch's start and at the end of
        # `fit`), and dropping one waits for tf.data's autotuning thread: 4-17 s each
        # time here. A fixed prefetch and no parallel map leave it nothing to tune.
        options = tf.data.Options()
        options.autotune.enabled = False
        return dataset.prefetch(2).with_options(options)



class BatchesPyDataset(keras.utils.PyDataset):
    """Keras's backend-neutral input, for JAX and PyTorch (no TensorFlow needed)."""

    def __init__(self, batches: TrainingBatches):
        super().__init__()
        self.batches = batches

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, step):
        return self.batches.batch(step)
