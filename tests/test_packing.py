"""Sequence packing: the packed model computes each row as the padded one does, so the
updates are the same; and a packed run trains, saves and serves the task's model."""

import json
import random

import keras
import keras_hub
import numpy as np
import pytest

import bertkit
from bertkit.batching.packing import pack_batch, pack_lengths, packing_width
from bertkit.batching.packing_choice import PackingChoice, choose_packing
from bertkit.batching.plan import BatchPlan, batch_order
from bertkit.errors import UserError
from bertkit.model.packed_backbone import PositionsById, packed_training_model
from bertkit.padding import bucket_lengths, pad_batch, padding_lengths
from bertkit.recipes.recipe import TrainingConfig, load_recipe
from bertkit.task import Features
from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint
from bertkit.training.optimization import make_optimizer

PAD_LENGTHS = padding_lengths(bucket_lengths(64), compiles_each_shape=False)


def corpus(rows=150, seed=0):
    """Rows of sentence-like lengths: token ids, segment ids (pairs), labels per piece
    (-1 unlabelled) and one label per row."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(2.7, 0.6, rows).astype(int), 3, 64)
    segments = [
        np.where(np.arange(n) >= n // 2, 1, 0).astype(np.int32)
        if k % 3 == 0
        else np.zeros(n, np.int32)
        for k, n in enumerate(lengths)
    ]
    labels = [
        np.where(rng.random(n) < 0.7, rng.integers(0, 3, n), -1).astype(np.int32) for n in lengths
    ]
    columns = {
        "token_ids": [rng.integers(1, 60, n).astype(np.int32) for n in lengths],
        "segment_ids": segments,
        "labels": labels,
        "row_label": rng.integers(0, 2, rows).astype(np.int32),
    }
    return Features(columns=columns, example_index=np.arange(rows), pad_values={"labels": -1})


def test_packed_rows_hold_each_row_whole_with_its_own_positions():
    features = corpus()
    rows = np.random.default_rng(1).permutation(len(features))[:32]
    packed = pack_batch(features, rows, PAD_LENGTHS)
    width = packed["token_ids"].shape[1]
    assert width == packing_width(int(features.lengths()[rows].max()), PAD_LENGTHS)
    flat = {
        name: packed[name].reshape(-1)
        for name in ("token_ids", "segment_ids", "labels", "position_ids", "sequence_index")
    }
    seen = np.zeros(packed["token_ids"].size, bool)
    for k, row in enumerate(rows):
        start, size = packed["first_token_index"][k], features.lengths()[row]
        span = slice(start, start + size)
        assert start // width == (start + size - 1) // width  # never across packed rows
        for name in ("token_ids", "segment_ids", "labels"):
            np.testing.assert_array_equal(flat[name][span], features.columns[name][row])
        np.testing.assert_array_equal(flat["position_ids"][span], np.arange(size))
        number = flat["sequence_index"][start]
        assert number > 0 and (flat["sequence_index"][span] == number).all()
        assert not seen[span].any()
        seen[span] = True
    assert (packed["padding_mask"].reshape(-1) == seen).all()
    assert (flat["sequence_index"][~seen] == 0).all() and (flat["labels"][~seen] == -1).all()
    np.testing.assert_array_equal(packed["row_label"], features.columns["row_label"][rows])
    # 32 rows of about 16 pieces in rows of 64: few rows, little padding
    assert seen.mean() > 0.85 and len(packed["token_ids"]) < 32 / 3


def test_first_fit_decreasing_and_fixed_row_counts():
    assert pack_lengths(np.array([5, 60, 30, 20, 40]), 64) == [[1], [4, 3], [2, 0]]
    with pytest.raises(ValueError, match="does not fit"):
        pack_lengths(np.array([65]), 64)
    features = corpus()
    packed = pack_batch(features, np.arange(32), PAD_LENGTHS, row_counts=(1, 2, 4, 8, 16, 32))
    filled = len(pack_lengths(features.lengths()[:32], packed["token_ids"].shape[1]))
    assert len(packed["token_ids"]) in (1, 2, 4, 8, 16, 32) and len(packed["token_ids"]) >= filled
    assert not packed["padding_mask"][filled:].any()


def test_on_an_accelerator_packed_steps_have_one_shape_for_the_run():
    from bertkit.batching.packing import packed_row_counts
    from bertkit.training.precompile import step_shapes

    class Rows:  # the task's part of a step: the packed rows as they are
        def make_batch(self, packed, training, rng):
            return {"token_ids": packed["token_ids"]}, packed["row_label"], None

    features = corpus(rows=150)  # 150 rows of up to 64 tokens
    shapes = {}
    for epochs in (0, 3):  # 0: shapes as they come (a CPU); 3: fixed for a 3-epoch run
        plan = BatchPlan(
            batch_size=8,
            buckets=(32, 64),
            order="random",
            packing=True,
            packed_row_counts=packed_row_counts(8),
            fixed_packing_epochs=epochs,
            row_multiple=8 if epochs else 1,  # an accelerator fills every step's rows
        )
        batches = plan.training_batches(Rows(), features)
        shapes[epochs] = set(step_shapes(batches, range(3)))
        made = {batches.batch(step, epoch)[0]["token_ids"].shape for epoch in range(3)
                for step in range(len(batches))}  # fmt: skip
        assert made == {shape[1:] for shape in shapes[epochs]}  # as the precompile finds
    assert len(shapes[0]) > 2
    assert {rows for rows, _, _ in shapes[0]} == {8, 7}  # the random order evens out 150
    # one shape: 8 rows (filler rows where the order gave 7), packed 64 tokens wide
    assert len(shapes[3]) == 1
    assert {(rows, width) for rows, _, width in shapes[3]} == {(8, 64)}


@pytest.mark.parametrize("row_multiple", [2, 8])  # 2 devices: on a CPU, on an accelerator
def test_filler_rows_take_no_packed_tokens_and_weigh_nothing(row_multiple):
    from bertkit.batching.packing import packed_row_counts

    features = corpus(rows=15)  # steps of 8 and 7 rows: the 7 get filler rows
    plan = BatchPlan(
        batch_size=8,
        buckets=(32, 64),
        order="random",
        packing=True,
        packed_row_counts=packed_row_counts(8, devices=2),
        row_multiple=row_multiple,
        devices=2,
    )
    batches = plan.training_batches(TwoHeads(), features)
    lengths = features.lengths()
    for step, rows in enumerate(batches.step_rows(0)):
        inputs, targets, weights = batches.batch(step, 0)
        packed_rows = len(inputs["token_ids"])
        assert packed_rows % 2 == 0 and len(inputs["first_token_index"]) == 8
        assert inputs["padding_mask"].sum() == lengths[rows].sum()  # the real rows' tokens
        assert not inputs["first_token_index"][len(rows) :].any()
        assert (weights["label"][len(rows) :] == 0).all() and (
            weights["label"][: len(rows)] > 0
        ).all()
        labelled = sum(int((features.columns["labels"][row] >= 0).sum()) for row in rows)
        assert np.count_nonzero(weights["tags"]) == labelled


def tiny_backbone():
    keras.utils.set_random_seed(3)
    return keras_hub.models.BertBackbone(
        vocabulary_size=60,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        dropout=0.0,
        max_sequence_length=64,
    )


def two_head_model(backbone):
    """A tagging head on the tokens and a classification head on [CLS]."""
    tags = keras.layers.Dense(3, name="tags")(backbone.output["sequence_output"])
    label = keras.layers.Dense(2, name="label")(backbone.output["pooled_output"])
    return keras.Model(backbone.input, {"tags": tags, "label": label})


def test_packed_model_gives_every_row_the_outputs_of_the_padded_model():
    features, backbone = corpus(), tiny_backbone()
    model = two_head_model(backbone)
    packed_model = packed_training_model(model, backbone)
    assert {id(w) for w in packed_model.weights} == {id(w) for w in model.weights}
    assert json.loads(packed_model.to_json())  # what TensorBoard writes of the trained model
    (positions,) = [layer for layer in packed_model.layers if isinstance(layer, PositionsById)]
    assert (
        type(positions).from_config(positions.get_config()).position_embedding.name
        == "position_embedding"
    )
    rows = np.arange(40)
    padded = pad_batch(features, rows, PAD_LENGTHS)
    packed = pack_batch(features, rows, PAD_LENGTHS)
    names = ("token_ids", "segment_ids", "padding_mask")
    expected = model({name: padded[name] for name in names})
    got = packed_model(
        {
            name: packed[name]
            for name in (*names, "position_ids", "sequence_index", "first_token_index")
        }
    )
    np.testing.assert_allclose(got["label"], expected["label"], atol=2e-5)
    flat_tags = np.asarray(got["tags"]).reshape(-1, 3)
    for k, row in enumerate(rows):
        size, start = features.lengths()[row], packed["first_token_index"][k]
        np.testing.assert_allclose(
            flat_tags[start : start + size], expected["tags"][k, :size], atol=2e-5
        )


class TwoHeads:
    """make_batch of a task with both heads: per-piece weights for tags, one per row."""

    def make_batch(self, batch, training, rng):
        inputs = {name: batch[name] for name in ("token_ids", "segment_ids", "padding_mask")}
        targets = {"tags": np.maximum(batch["labels"], 0), "label": batch["row_label"]}
        weights = {
            "tags": (batch["labels"] >= 0).astype(np.float32),
            "label": np.ones(len(batch["row_label"]), np.float32),
        }
        return inputs, targets, weights


def train_one_epoch(packing: bool) -> list:
    training = TrainingConfig(
        epochs=1,
        batch_size=32,
        learning_rate=3e-3,
        warmup_ratio=0.2,
        max_grad_norm=0.5,
        batch_order="random",
        packing=packing,
    )
    batches = BatchPlan(
        32, bucket_lengths(64), seed=0, order="random", pad_lengths=PAD_LENGTHS, packing=packing
    ).training_batches(TwoHeads(), corpus())
    backbone = tiny_backbone()
    model = two_head_model(backbone)
    trained = packed_training_model(model, backbone) if packing else model
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    trained.compile(
        optimizer=make_optimizer(training, len(batches)), loss={"tags": loss, "label": loss}
    )
    trained.fit(batches.as_dataset(), epochs=1, verbose=0, shuffle=False)
    return [w.numpy() for w in model.weights]


def test_packed_batches_give_the_updates_of_the_padded_batches():
    initial = [w.numpy() for w in two_head_model(tiny_backbone()).weights]
    padded, packed = train_one_epoch(False), train_one_epoch(True)
    moved = 0
    for before, a, b in zip(initial, padded, packed, strict=True):
        change = np.linalg.norm(a - before)
        if change < 1e-6:  # the attention keys' biases: no gradient (softmax ignores them)
            continue
        moved += 1
        # float rounding only (about 1e-6 of the change here); a wrong mask, position
        # or weighting moves the weights by about as much as the change itself
        assert np.linalg.norm(b - a) < 1e-4 * change
    assert moved == len(initial) - 2


def write_conll(path, count, seed):
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        words = [
            (w, "O")
            for w in rng.sample(["the", "a", "film", "was", "and", "it", "at"], rng.randint(1, 5))
        ]
        at = rng.randint(0, len(words))
        words[at:at] = [
            ("mr", "O"),
            (rng.choice(["john", "bob", "ann"]), "B-PER"),
            (rng.choice(["smith", "jones"]), "I-PER"),
        ]
        lines += [f"{word} NN {tag}" for word, tag in words] + [""]
    path.write_text("\n".join(lines))


@pytest.mark.parametrize("task", ["tagging", "classification"])
def test_a_packed_run_trains_saves_and_serves_the_task_model(tmp_path, task):
    if task == "tagging":
        write_conll(tmp_path / "train.txt", 160, seed=0)
        write_conll(tmp_path / "dev.txt", 30, seed=1)
        data = {"train": str(tmp_path / "train.txt"), "validation": str(tmp_path / "dev.txt")}
        monitor, epochs = "f1", 4
    else:
        write_sentiment_tsv(tmp_path / "train.tsv", 240, seed=0)
        write_sentiment_tsv(tmp_path / "dev.tsv", 60, seed=1)
        data = {
            "train": str(tmp_path / "train.tsv"),
            "validation": str(tmp_path / "dev.tsv"),
            "text": "sentence",
        }
        monitor, epochs = "accuracy", 6
    recipe = {
        "schema": 1,
        "task": task,
        "backbone": {
            "preset": str(write_tiny_checkpoint(tmp_path / "ckpt")),
            "sequence_length": 48,
        },
        "data": data,
        "training": {
            "epochs": epochs,
            "batch_size": 16,
            "learning_rate": 3e-3,
            "batch_order": "random",
            "packing": True,
        },
    }
    model = bertkit.finetune(recipe, output_dir=tmp_path / "run", verbose=0)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["epochs"][-1]["loss"] < metrics["epochs"][0]["loss"]
    final = metrics["final"]["validation"][monitor]
    assert final > 0.8
    # The saved best weights are the task model's: a fresh load scores what finetune did.
    reloaded = bertkit.load(tmp_path / "run")
    assert reloaded.evaluate()[monitor] == pytest.approx(final, abs=1e-6)
    assert (tmp_path / "run" / "saved_model" / "saved_model.pb").exists()
    del model


def recipe_with(task="classification", **training):
    return {
        "schema": 1,
        "task": task,
        "backbone": {"preset": "bert_tiny_en_uncased"},
        "data": {"train": "train.tsv"},
        "training": training,
    }


def test_packing_is_refused_where_it_cannot_work(monkeypatch):
    with pytest.raises(UserError, match="the span_qa task cannot pack rows") as error:
        load_recipe(recipe_with("span_qa", packing=True))
    assert error.value.key == "training.packing"
    assert load_recipe(recipe_with(packing=True)).training.packing
    recipe = load_recipe(recipe_with(packing=True, distribution="data_parallel"))
    BatchPlan.check_devices(recipe.training, 2, "jax")  # one process: packed rows split
    with pytest.raises(UserError, match="packed batches train over several devices") as error:
        BatchPlan.check_devices(recipe.training, 2, "tensorflow")
    assert error.value.key == "training.packing"
    assert str(error.value).endswith(
        "on JAX in one process, not with tensorflow; set training.packing to false or "
        "distribution: one_device"
    )
    monkeypatch.setattr("bertkit.batching.plan.process_count", lambda: 2)
    with pytest.raises(UserError, match="not with 2 processes") as error:
        BatchPlan.check_devices(recipe.training, 2, "jax")
    assert str(error.value).endswith("set training.packing to false")  # one device: no job


# ---- training.packing: auto (the default)
def packing_of(task="classification", backend="tensorflow", devices=1, processes=1, **options):
    recipe = load_recipe({**recipe_with(), "task": {"name": task, **options}})
    assert recipe.training.packing == "auto"  # the default
    return choose_packing(
        recipe.training.packing,
        recipe.task_class(),
        recipe.task_options,
        backend=backend,
        devices=devices,
        processes=processes,
    )


def test_auto_packs_exactly_where_packing_is_exact_and_names_why_not_elsewhere():
    assert packing_of("classification") == PackingChoice(True)
    assert packing_of("tagging") == PackingChoice(True)
    assert packing_of("tagging", backend="jax", devices=8) == PackingChoice(True)
    not_packed = {
        "the span_qa task cannot pack rows: only tasks that declare `packs` can": packing_of(
            "span_qa"
        ),
        "the mlm task cannot pack rows: only tasks that declare `packs` can": packing_of("mlm"),
        "the tagging task cannot pack rows: with head: crf a packed row's sentences would be "
        "one CRF sequence": packing_of("tagging", head="crf"),
        "packed batches train over several devices on JAX in one process, not with "
        "tensorflow": packing_of(devices=2),
        "packed batches train in one process, not 2": packing_of(
            backend="jax", devices=2, processes=2
        ),
    }
    for why, choice in not_packed.items():
        assert choice == PackingChoice(False, why)
    recipe = load_recipe(recipe_with())
    feature_based = choose_packing(
        "auto", recipe.task_class(), None, backend="jax", devices=1, feature_based=True
    )
    assert feature_based.why_not.startswith("packed training reads the last layer only")
    # true and false are the recipe's word: auto's reasons do not apply to them
    assert choose_packing(False, recipe.task_class(), None, backend="jax", devices=1) == (
        PackingChoice(False)
    )
    assert not load_recipe(recipe_with("span_qa", packing=False)).training.packing


def tiny_classification_recipe(tmp_path, **training):
    write_sentiment_tsv(tmp_path / "train.tsv", 96, seed=0)
    write_sentiment_tsv(tmp_path / "dev.tsv", 32, seed=1)
    return {
        "schema": 1,
        "task": "classification",
        "backbone": {
            "preset": str(write_tiny_checkpoint(tmp_path / "ckpt")),
            "sequence_length": 48,
        },
        "data": {
            "train": str(tmp_path / "train.tsv"),
            "validation": str(tmp_path / "dev.tsv"),
            "text": "sentence",
        },
        "training": {"epochs": 2, "batch_size": 16, "learning_rate": 3e-3, **training},
        "export": {"saved_model": False},
    }


def test_a_run_with_auto_is_the_run_with_packing_true(tmp_path):
    runs = {}
    for setting in ("auto", True):
        folder = tmp_path / str(setting)
        recipe = tiny_classification_recipe(tmp_path, packing=setting)
        bertkit.finetune(recipe, output_dir=folder, verbose=0)
        metrics = json.loads((folder / "metrics.json").read_text())
        status = json.loads((folder / "run.json").read_text())
        runs[setting] = (
            [epoch["loss"] for epoch in metrics["epochs"]],
            status["packing"],
            status["batch_order"],
        )
    assert runs["auto"] == runs[True]
    assert runs["auto"][1] == {"packed": True}
    assert runs["auto"][2] == "random"  # batch_order: auto, packed


def test_auto_batch_order_is_random_and_the_recipes_word_wins():
    assert batch_order("auto") == "random"
    assert batch_order("length_buckets") == "length_buckets"
    with pytest.raises(UserError, match="micro_batches needs batch_order: random"):
        load_recipe(recipe_with(micro_batches=2, batch_order="length_buckets"))
    assert load_recipe(recipe_with(micro_batches=2)).training.batch_order == "auto"


def test_a_run_that_auto_leaves_unpacked_says_why(tmp_path, capsys):
    write_conll(tmp_path / "train.txt", 48, seed=0)
    recipe = {
        "schema": 1,
        "task": {"name": "tagging", "head": "crf"},
        "backbone": {
            "preset": str(write_tiny_checkpoint(tmp_path / "ckpt")),
            "sequence_length": 32,
        },
        "data": {"train": str(tmp_path / "train.txt")},
        "training": {"epochs": 1, "batch_size": 16},
        "export": {"saved_model": False},
    }
    bertkit.finetune(recipe, output_dir=tmp_path / "run", verbose=0)
    why = "the tagging task cannot pack rows: with head: crf a packed row's sentences would be "
    why += "one CRF sequence"
    assert f"training unpacked (training.packing: auto): {why}\n" in capsys.readouterr().out
    packing = json.loads((tmp_path / "run" / "run.json").read_text())["packing"]
    assert packing == {"packed": False, "why_not": why}
