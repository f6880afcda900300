"""Random batch order split into micro-batches: same rows, less padding, the same update."""

import keras
import numpy as np
import pytest

from bertkit.batching.orders import random_batches, split_by_length
from bertkit.batching.plan import BatchPlan
from bertkit.batching.steps import normalize_weights
from bertkit.errors import UserError
from bertkit.padding import bucket_lengths, padded_length
from bertkit.recipes.recipe import TrainingConfig, load_recipe
from bertkit.task import Features
from bertkit.training.optimization import make_optimizer

BUCKETS = bucket_lengths(128)  # (16, 32, 64, 128)


def corpus(rows=203, seed=0):
    """Token ids and per-token labels (-1 on unlabelled pieces) of sentence-like lengths."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(3.0, 0.7, rows).astype(int), 3, 128)
    labels = [np.where(rng.random(n) < 0.7, rng.integers(0, 3, n), -1) for n in lengths]
    return Features(
        columns={
            "token_ids": [rng.integers(1, 50, n).astype(np.int32) for n in lengths],
            "labels": [label.astype(np.int32) for label in labels],
        },
        example_index=np.arange(rows),
        pad_values={"labels": -1},
    )


class TokenTagging:
    """A task's make_batch as tagging's: weight 1 on labelled pieces, 0 elsewhere."""

    def make_batch(self, batch, training, rng):
        labelled = (batch["labels"] >= 0).astype(np.float32)
        return batch["token_ids"], np.maximum(batch["labels"], 0), labelled


def test_random_batches_hold_every_row_once_in_near_equal_batches():
    for epoch in range(3):
        plan = random_batches(1000, 32, seed=1, epoch=epoch)
        assert sorted(np.concatenate(plan).tolist()) == list(range(1000))
        assert len(plan) == 32 and {len(rows) for rows in plan} <= {31, 32}
    assert not np.array_equal(random_batches(1000, 32, 1, 0)[0], random_batches(1000, 32, 1, 1)[0])


def test_each_batch_is_split_by_length_and_each_part_padded_to_its_bucket():
    features = corpus()
    lengths = features.lengths()
    batches = BatchPlan(32, BUCKETS, seed=0, order="random", micro_batches=4).training_batches(
        TokenTagging(), features
    )
    plan = random_batches(len(lengths), 32, seed=0, epoch=0)
    assert len(batches) == 4 * len(plan)
    steps = list(batches)
    padded = 0
    for k, rows in enumerate(plan):
        parts = steps[4 * k : 4 * k + 4]
        widths = [inputs.shape[1] for inputs, _, _ in parts]
        assert sum(inputs.shape[0] for inputs, _, _ in parts) == len(rows)
        assert widths == sorted(widths) and widths[-1] == padded_length(
            int(lengths[rows].max()), BUCKETS
        )
        padded += sum(inputs.size for inputs, _, _ in parts)
        # The weights make the mean over each part's positions, averaged over the parts,
        # the mean over the batch's labelled pieces.
        means = [np.mean(w * targets) for _, targets, w in parts]
        labelled = np.concatenate([np.asarray(features.columns["labels"][i]) for i in rows])
        assert np.mean(means) == pytest.approx(labelled[labelled >= 0].mean(), rel=1e-5)
    # 4 parts of these batches (lengths in 3 buckets) pad each row to its own bucket.
    assert padded == sum(padded_length(int(n), BUCKETS) for n in lengths)


def test_split_finds_the_least_padding_and_evens_out_ties():
    lengths = np.array([3, 50, 20, 5, 18, 100, 4, 40])
    parts = split_by_length(np.arange(8), lengths, 3, BUCKETS)
    # 5 x 32 + 2 x 64 + 1 x 128 = 416 padded tokens; [3, 4, 5] [18 .. 50] [100] would pad 432.
    assert [sorted(lengths[p].tolist()) for p in parts] == [[3, 4, 5, 18, 20], [40, 50], [100]]
    even = split_by_length(np.arange(12), np.full(12, 10), 3, BUCKETS)
    assert [len(p) for p in even] == [4, 4, 4]


def test_normalized_weights_of_one_part_give_the_mean_over_labelled_positions():
    weights = np.array([[1, 1, 0, 0], [1, 0, 0, 0]], np.float32)
    (scaled,) = normalize_weights([weights])
    losses = np.array([[1.0, 2.0, 9.0, 9.0], [3.0, 9.0, 9.0, 9.0]])
    assert np.mean(scaled * losses) == pytest.approx(2.0)


def tagger(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((None,), dtype="int32"),
            keras.layers.Embedding(50, 8),
            keras.layers.Dense(16, activation="gelu"),
            keras.layers.Dense(3),
        ]
    )
    return model


def train_one_epoch(micro_batches: int) -> list:
    training = TrainingConfig(
        epochs=1,
        batch_size=32,
        learning_rate=1e-2,
        warmup_ratio=0.2,
        max_grad_norm=0.05,
        batch_order="random",
        micro_batches=micro_batches,
    )
    batches = BatchPlan(
        32, BUCKETS, seed=0, order="random", micro_batches=micro_batches
    ).training_batches(TokenTagging(), corpus())
    model = tagger()
    model.compile(
        optimizer=make_optimizer(training, len(batches)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(batches.as_dataset(), epochs=1, verbose=0, shuffle=False)
    return [w.numpy() for w in model.weights]


def test_micro_batches_give_the_updates_of_the_whole_batch():
    # Clipping is active (max_grad_norm 0.05), so it must clip the accumulated
    # gradient, and the learning rate must follow updates, not micro-batches.
    whole, split = train_one_epoch(1), train_one_epoch(4)
    initial = [w.numpy() for w in tagger().weights]
    for before, a, b in zip(initial, whole, split, strict=True):
        # Adam divides by sqrt(v), so float rounding moves weights with near-zero
        # gradients a little (up to 1.2% of the change here). A per-part loss
        # mean, per-part clipping or a schedule in micro-batches moves them by
        # 50% to 700% of the change.
        change = np.linalg.norm(a - before)
        assert not np.allclose(a, before)
        assert np.linalg.norm(b - a) < 0.05 * change


def recipe(**training):
    return {
        "schema": 1,
        "task": "classification",
        "backbone": {"preset": "bert_tiny_en_uncased"},
        "data": {"train": "train.tsv"},
        "training": training,
    }


def test_micro_batches_need_random_order_and_fit_in_a_batch():
    with pytest.raises(UserError, match="micro_batches needs batch_order: random") as error:
        load_recipe(recipe(batch_order="length_buckets", micro_batches=4))
    assert error.value.key == "training.micro_batches"
    assert load_recipe(recipe(micro_batches=4)).training.batch_order == "auto"  # random
    with pytest.raises(UserError, match="cannot split batches of 2 rows into 4"):
        load_recipe(recipe(batch_order="random", batch_size=2, micro_batches=4))
    loaded = load_recipe(recipe(batch_order="random", micro_batches=4))
    assert (loaded.training.batch_order, loaded.training.micro_batches) == ("random", 4)
    with pytest.raises(UserError, match="cannot be split into 4 micro-batches"):
        BatchPlan(32, BUCKETS, seed=0, order="random", micro_batches=4).training_batches(
            TokenTagging(), corpus(rows=3)
        )


def test_rows_of_unequal_parts_count_once_when_the_task_gives_no_weights():
    features = corpus()

    class PerRow:  # a classification-like task: one target per row, no weights
        def make_batch(self, batch, training, rng):
            first_token = batch["token_ids"][:, 0].astype(np.float32)
            return batch["token_ids"], {"label": first_token, "other": first_token}, None

    batches = BatchPlan(32, BUCKETS, seed=0, order="random", micro_batches=4).training_batches(
        PerRow(), features
    )
    parts = [batches.batch(step) for step in range(4)]
    assert len({len(weights["label"]) for _, _, weights in parts}) > 1  # unequal parts
    for name in ("label", "other"):
        mean = np.mean([np.mean(weights[name] * targets[name]) for _, targets, weights in parts])
        rows = random_batches(len(features.lengths()), 32, seed=0, epoch=0)[0]
        whole = np.mean([features.columns["token_ids"][i][0] for i in rows])
        assert mean == pytest.approx(whole, rel=1e-6)
