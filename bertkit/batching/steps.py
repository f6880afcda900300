"""Training batches of every epoch, in a seeded, resumable order: `TrainingBatches`.

A `BatchPlan` picks the order (`bertkit.batching.orders`: which rows form each step)
and the layout (`bertkit.batching.layouts`: padded or packed); the task makes each
step's inputs, targets and weights.

With micro-batches, sample weights are normalized over the whole batch
(`normalize_weights`), so its loss is the weighted mean over all its targets, however
it is split and padded; a task without weights gets one weight per row when batches
are split. That is exact for losses that average over rows or over the weighted
positions (tagging, masked LM); a loss that averages over positions it picks
itself (Keras' `ignore_class`) would be averaged per part, so tasks give
weights instead.
"""

from __future__ import annotations

import concurrent.futures
import threading

import keras
import numpy as np

from bertkit.errors import UserError
from bertkit.padding import fill_rows
from bertkit.parallel.multi_process import process_index, process_share
from bertkit.task import Features


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


def _zero_filler_rows(weights, count: int):
    """`weights` (an array, or a dict of them) with rows from `count` on set to 0."""
    if isinstance(weights, dict):
        return {name: _zero_filler_rows(value, count) for name, value in weights.items()}
    weights = np.array(weights, np.float32)
    weights[count:] = 0.0
    return weights


class TrainingBatches:
    """The training batches of every epoch, as a `BatchPlan` makes them from `features`.

    One step is one micro-batch: with `micro_batches` N, steps `kN .. kN+N-1`
    are the parts of batch `k` (the optimizer accumulates N steps, see
    `bertkit.training.optimization.make_optimizer`). The plan's order strategy picks each
    step's rows, its layout pads or packs them, and the task makes the model's
    inputs, targets and weights (`Task.make_batch`). `set_epoch` is called by a
    callback at the start of each epoch, so the data order follows the epoch
    number even when training resumes mid-run.
    """

    def __init__(self, task, features: Features, plan):
        self.task, self.features, self.plan = task, features, plan
        self.seed, self.micro_batches = plan.seed, plan.micro_batches
        self.row_multiple = plan.row_multiple  # each step filled to a multiple (fill_rows)
        self.lengths = features.lengths()
        self.order, self.layout = plan.order_strategy(self.lengths), plan.layout()
        if plan.packing and plan.fixed_packing_epochs:  # one shape for the run's steps
            steps = self._step_lengths(plan.fixed_packing_epochs)
            self.layout = self.layout.fixed_over(steps, plan.devices)
        self.epoch = 0
        batches = self.order.batches(0)
        smallest = min(len(rows) for rows in batches)
        if smallest < self.micro_batches:
            raise UserError(
                f"a batch of {smallest} training rows cannot be split into "
                f"{self.micro_batches} micro-batches",
                key="training.micro_batches",
            )
        self._steps = len(batches) * self.micro_batches
        self._made = (None, None)  # ((epoch, first step of a batch), its made parts)
        self._lock = threading.Lock()
        self._epoch_steps, self._steps_epoch = None, None  # the current epoch's step rows

    def _step_lengths(self, epochs: int) -> list:
        """The token counts of each step's rows over the first `epochs` epochs."""
        return [self.lengths[rows] for epoch in range(epochs) for rows in self.step_rows(epoch)]

    def step_rows(self, epoch: int) -> list:
        """Row indices of each step of `epoch`: its batches, or their micro-batches in turn."""
        return self.order.step_rows(epoch)

    def __len__(self) -> int:
        return self._steps

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        return (self.batch(step) for step in range(len(self)))

    def batch(self, step: int, epoch: int | None = None):
        """Step `step` of `epoch` (default: the current epoch), as Keras `fit` takes it."""
        epoch = self.epoch if epoch is None else epoch
        first = step - step % self.micro_batches
        with self._lock:  # the batch ahead is made on another thread (BatchesPyDataset)
            if self._made[0] != (epoch, first):
                self._made = ((epoch, first), self._make_parts(epoch, first))
            return self._made[1][step - first]

    def _make_parts(self, epoch: int, first: int) -> list:
        """The steps of the batch that starts at step `first`, weights normalized over it."""
        if self._steps_epoch != epoch:
            self._epoch_steps, self._steps_epoch = self.step_rows(epoch), epoch
        made, counts = [], []
        for step in range(first, first + self.micro_batches):
            rows = fill_rows(self._epoch_steps[step], self.row_multiple)
            share = process_share(len(rows))  # this process's rows; all of them in one
            real = len(self._epoch_steps[step])  # the filler rows come after these
            real = min(max(real - share.start, 0), len(rows[share]))  # within the share
            longest = int(self.lengths[rows].max())
            rng = self._rng(epoch, step)
            made.append(self.layout.make(self.task, self.features, rows[share], real, longest, rng))
            counts.append((real, len(rows[share])))
        filled = any(real < size for real, size in counts)
        if made[0][2] is None:
            if self.micro_batches == 1 and self.row_multiple == 1:
                return [(inputs, targets) for inputs, targets, _ in made]
            # Parts differ in size, or some may get filler rows: weigh rows so that
            # each counts once in the update (and every step has the same structure,
            # which Keras's distributed input needs).
            made = [(inputs, targets, _row_weights(targets)) for inputs, targets, _ in made]
        if filled:  # filler rows (see fill_rows) weigh nothing
            made = [
                (inputs, targets, _zero_filler_rows(w, real))
                for (inputs, targets, w), (real, _) in zip(made, counts, strict=True)
            ]
        weights = _normalize_each_output([w for _, _, w in made])
        return [(inputs, targets, w) for (inputs, targets, _), w in zip(made, weights, strict=True)]

    def _rng(self, epoch: int, step: int):
        """The random draws of a step's batch (e.g. masked positions), per process share."""
        key = [self.seed, epoch, step, 1]
        return np.random.default_rng(key + [process_index()] if process_index() else key)

    def as_dataset(self, first_step: int = 0):
        """A `tf.data.Dataset` with unknown lengths on TensorFlow, a `PyDataset` elsewhere:
        each epoch's steps from `first_step` on (a run resumed mid-epoch starts one there)."""
        if keras.backend.backend() != "tensorflow":
            return BatchesPyDataset(self, first_step)
        import tensorflow as tf

        def spec(value):
            return tf.nest.map_structure(
                lambda v: tf.TensorSpec((None,) * np.ndim(v), tf.as_dtype(np.asarray(v).dtype)),
                value,
            )

        def steps():
            return (self.batch(step) for step in range(first_step, len(self)))

        dataset = tf.data.Dataset.from_generator(steps, output_signature=spec(next(steps())))
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(len(self) - first_step))
        # Keras drops each epoch's iterator (at the next epoch's start and at the end of
        # `fit`), and dropping one waits for tf.data's autotuning thread: 4-17 s each
        # time here. A fixed prefetch and no parallel map leave it nothing to tune.
        options = tf.data.Options()
        options.autotune.enabled = False
        return dataset.prefetch(2).with_options(options)


class BatchesPyDataset(keras.utils.PyDataset):
    """Keras's backend-neutral input, for JAX and PyTorch (no TensorFlow needed).

    While Keras trains on step N, the batch of step N + 1 is made on a background
    thread (padding, packing and the task's `make_batch` are NumPy and Python), so the
    host work of a step overlaps the device's. Keras's own workers (`workers=2`) would
    make batches of the next epoch before `SetEpoch` has set it.
    """

    def __init__(self, batches: TrainingBatches, first_step: int = 0):
        super().__init__()
        self.batches, self.first_step = batches, first_step  # item i: step first_step + i
        self._ahead = None  # ((epoch, step), future) of the batch being made ahead
        self._executor = None

    def __len__(self):
        return len(self.batches) - self.first_step

    def __getitem__(self, index):
        step = self.first_step + index
        epoch, ahead = self.batches.epoch, self._ahead
        if ahead is not None and ahead[0] == (epoch, step):
            made = ahead[1].result()
        else:
            made = self.batches.batch(step, epoch)
        self._ahead = None
        if step + 1 < len(self.batches):
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="bertkit-batches"
                )
            self._ahead = (
                (epoch, step + 1),
                self._executor.submit(self.batches.batch, step + 1, epoch),
            )
        return made

    def __del__(self):
        if getattr(self, "_executor", None) is not None:
            self._executor.shutdown(wait=False)
