"""Training batch plans: every row once, one bucket per batch, random within a bucket."""

import keras
import numpy as np
import pytest

from bertkit.batching.orders import epoch_batches
from bertkit.batching.plan import BatchPlan
from bertkit.padding import bucket_lengths, padded_length, padding_lengths
from bertkit.task import Features

BUCKETS = bucket_lengths(128)  # (16, 32, 64, 128)


def corpus_lengths(rows=1000, seed=0):
    """Lengths like real sentences: many short rows, a long tail up to 128."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(3.0, 0.7, rows).astype(int), 3, 128)


def features_of(lengths):
    """Feature rows of the given lengths (token ids all 1)."""
    return Features(
        columns={
            "token_ids": [np.ones(n, np.int32) for n in lengths],
            "segment_ids": [np.zeros(n, np.int32) for n in lengths],
        },
        example_index=np.arange(len(lengths)),
    )


@pytest.mark.parametrize("batch_size", [1, 7, 32])
def test_every_row_once_per_epoch(batch_size):
    lengths = corpus_lengths()
    for epoch in range(3):
        plan = epoch_batches(lengths, batch_size, BUCKETS, seed=1, epoch=epoch)
        rows = np.concatenate(plan)
        assert sorted(rows.tolist()) == list(range(len(lengths)))
        assert all(0 < len(batch) <= batch_size for batch in plan)


def test_full_batches_hold_one_bucket_and_padding_is_minimal():
    lengths = corpus_lengths()
    plan = epoch_batches(lengths, 32, BUCKETS, seed=1, epoch=0)
    own_bucket = np.searchsorted(BUCKETS, lengths)
    mixed = [batch for batch in plan if len(set(own_bucket[batch])) > 1]
    # Only the batches of the buckets' remainders may mix buckets: at most one per bucket.
    assert len(mixed) <= len(BUCKETS)
    padded = sum(padded_length(int(lengths[b].max()), BUCKETS) * len(b) for b in plan)
    each_row_own_bucket = sum(np.array(BUCKETS)[own_bucket])
    assert padded <= each_row_own_bucket + 32 * len(mixed) * max(BUCKETS)
    assert padded < 128 * len(lengths) * 0.5  # far below padding to sequence_length


def test_rows_are_drawn_at_random_within_a_bucket():
    lengths = np.arange(17, 33).repeat(20)  # 320 rows, all in bucket 32, lengths 17..32
    plan = epoch_batches(lengths, 32, BUCKETS, seed=3, epoch=0)
    spreads = [np.ptp(lengths[batch]) for batch in plan]
    # Sorted pools would give batches spanning 1-2 lengths; random draws span nearly all 16.
    assert np.mean(spreads) > 12


def test_order_depends_on_seed_and_epoch_only():
    lengths = corpus_lengths()
    first = epoch_batches(lengths, 16, BUCKETS, seed=5, epoch=2)
    again = epoch_batches(lengths, 16, BUCKETS, seed=5, epoch=2)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    other_epoch = epoch_batches(lengths, 16, BUCKETS, seed=5, epoch=3)
    assert not all(np.array_equal(a, b) for a, b in zip(first, other_epoch, strict=True))


def test_training_batches_length_matches_every_epoch_plan():
    lengths = corpus_lengths(rows=333)
    features = features_of(lengths)

    class Passthrough:
        def make_batch(self, batch, training, rng):
            return batch, None, None

    batches = BatchPlan(32, BUCKETS, seed=0).training_batches(Passthrough(), features)
    for epoch in range(3):
        batches.set_epoch(epoch)
        plan = epoch_batches(lengths, 32, BUCKETS, 0, epoch)
        assert len(batches) == len(plan)
        widths = [batch["token_ids"].shape[1] for batch, _ in batches]
        assert widths == [padded_length(int(lengths[rows].max()), BUCKETS) for rows in plan]


def test_pad_lengths_change_the_padding_not_the_rows_of_a_batch():
    lengths = corpus_lengths(rows=333)
    features = Features(
        columns={"token_ids": [np.ones(n, np.int32) for n in lengths]},
        example_index=np.arange(len(lengths)),
    )

    class Passthrough:
        def make_batch(self, batch, training, rng):
            return batch, np.zeros(len(batch["row_index"])), None

    def steps(order, micro_batches, pad_lengths=None):
        return [
            step[0]
            for step in BatchPlan(
                32,
                BUCKETS,
                seed=0,
                order=order,
                micro_batches=micro_batches,
                pad_lengths=pad_lengths,
            ).training_batches(Passthrough(), features)
        ]

    def batches_rows(plan, parts):  # the rows of each batch, whatever its parts
        return [
            sorted(np.concatenate([b["row_index"] for b in plan[i : i + parts]]).tolist())
            for i in range(0, len(plan), parts)
        ]

    fine = padding_lengths(BUCKETS, compiles_each_shape=False)
    for order, parts in (("length_buckets", 1), ("random", 4)):
        bucketed, padded = steps(order, parts), steps(order, parts, fine)
        assert batches_rows(padded, parts) == batches_rows(bucketed, parts)
        for batch in padded:
            longest = int(lengths[batch["row_index"]].max())
            assert batch["token_ids"].shape[1] == min(-(-longest // 8) * 8, 128)
    # micro-batches of random batches are cut by length: there the finer padding pays
    tokens = [sum(b["token_ids"].size for b in plan) for plan in (padded, bucketed)]
    assert tokens[0] < 0.95 * tokens[1]


def test_tensorflow_dataset_gives_the_plan_and_leaves_autotuning_off():
    if keras.backend.backend() != "tensorflow":
        pytest.skip("a tf.data pipeline is made on the TensorFlow backend only")
    lengths = corpus_lengths(rows=100)
    features = features_of(lengths)

    class Passthrough:
        def make_batch(self, batch, training, rng):
            return batch["token_ids"], batch["segment_ids"], None

    batches = BatchPlan(16, BUCKETS, seed=0).training_batches(Passthrough(), features)
    dataset = batches.as_dataset()
    assert [a.shape for a, _ in dataset.as_numpy_iterator()] == [a.shape for a, _ in batches]
    # Dropping an iterator waits for tf.data's autotuning thread: seconds per epoch in fit
    assert dataset.options().autotune.enabled is False


@pytest.mark.parametrize("order, micro_batches", [("length_buckets", 1), ("random", 4)])
def test_the_batch_made_ahead_is_the_batch_of_its_step(order, micro_batches):
    """`BatchesPyDataset` makes step N + 1 on a thread while step N trains: the same
    batches, in order, epoch after epoch (random draws included)."""
    from bertkit.batching.steps import BatchesPyDataset

    lengths = corpus_lengths(rows=300)
    features = features_of(lengths)

    class Masking:  # a draw per step, as MLM's masking makes
        def make_batch(self, batch, training, rng):
            return batch, rng.integers(0, 1000, len(batch["row_index"])), None

    plan = BatchPlan(32, BUCKETS, seed=3, order=order, micro_batches=micro_batches)
    ahead = BatchesPyDataset(plan.training_batches(Masking(), features))
    direct = plan.training_batches(Masking(), features)
    for epoch in range(2):
        ahead.batches.set_epoch(epoch)
        for step in range(len(direct)):
            got, expected = ahead[step], direct.batch(step, epoch)
            np.testing.assert_array_equal(got[0]["row_index"], expected[0]["row_index"])
            np.testing.assert_array_equal(got[1], expected[1])
