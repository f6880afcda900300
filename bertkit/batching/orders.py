"""The orders of training rows a `BatchPlan` picks: which rows form each step of an epoch.

Steps are padded to a few bucket lengths (`bertkit.padding`), so the number of
compiled programs (XLA, JAX) stays bounded. In the default order
(`LengthBuckets`) each training batch takes rows whose lengths pad to the same bucket
(length bucketing), drawn at random within that bucket: the same padding as
sorting rows by length, without batches of near-identical rows (sorted pools
put, say, all of CoNLL's two-word bylines in one batch, and cost entity F1).

Length buckets still make batches of similar lengths, which costs a little
accuracy on some data (CoNLL-2003). The `random` order (`RandomMicroBatches`) draws
each batch's rows at random, as `transformers`' Trainer does, and splits it into `micro_batches`
by length (`split_by_length`: as little padding as length buckets), their
gradients are accumulated, and the update is the one the whole batch would
give (`bertkit.batching.steps.normalize_weights`).

The order of epoch `e` depends only on (seed, e): a resumed run sees the same
batches as an uninterrupted one.
"""

from __future__ import annotations

import numpy as np

from bertkit.padding import padded_length


def epoch_batches(
    lengths: np.ndarray, batch_size: int, buckets: tuple[int, ...], seed: int, epoch: int
) -> list:
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
        batches += [rows[i : i + batch_size] for i in range(0, full, batch_size)]
        remainders.append(rows[full:])
    rest = np.concatenate(remainders)
    rest = rest[np.argsort(lengths[rest], kind="stable")]
    batches += [rest[i : i + batch_size] for i in range(0, len(rest), batch_size)]
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


def split_by_length(
    rows: np.ndarray, lengths: np.ndarray, parts: int, buckets: tuple[int, ...]
) -> list:
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


class LengthBuckets:
    """Order: each batch's rows pad to one bucket, drawn at random within it (`epoch_batches`)."""

    def __init__(self, lengths: np.ndarray, batch_size: int, buckets: tuple, seed: int):
        self.lengths, self.batch_size, self.buckets, self.seed = lengths, batch_size, buckets, seed

    def batches(self, epoch: int) -> list:
        return epoch_batches(self.lengths, self.batch_size, self.buckets, self.seed, epoch)

    def step_rows(self, epoch: int) -> list:
        return self.batches(epoch)


class RandomMicroBatches:
    """Order: batches drawn at random (`random_batches`), each split into `parts` steps of
    similar lengths (`split_by_length`) whose gradients are accumulated."""

    def __init__(
        self, lengths: np.ndarray, batch_size: int, seed: int, parts: int, pad_lengths: tuple
    ):
        self.lengths, self.batch_size, self.seed = lengths, batch_size, seed
        self.parts, self.pad_lengths = parts, pad_lengths

    def batches(self, epoch: int) -> list:
        return random_batches(len(self.lengths), self.batch_size, self.seed, epoch)

    def step_rows(self, epoch: int) -> list:
        if self.parts == 1:
            return self.batches(epoch)
        return [
            part
            for rows in self.batches(epoch)
            for part in split_by_length(rows, self.lengths, self.parts, self.pad_lengths)
        ]
