"""Compilation is paid once: a second identical JAX run reads every program from JAX's
persistent compilation cache, and run.json counts the programs a run compiled. And no
step waits on the host: Keras runs the step-end callbacks of a JAX run off the main thread."""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint
from bertkit.training.compilation import cache_folder
from bertkit.training.trainer import featurize

pytest.importorskip("jax", reason="the JAX backend is part of the dev install")

TRAIN_ON_JAX = """
import json, sys, threading
for name in ("tensorflow", "tensorflow_text"):
    sys.modules[name] = None  # a JAX-only machine: no TensorFlow, no export
import keras
import bertkit

class StepThreads(keras.callbacks.Callback):
    async_safe = True
    threads = set()
    def on_train_batch_end(self, batch, logs=None):
        self.threads.add(threading.current_thread() is threading.main_thread())

bertkit.finetune("r.yaml", features="features.npz", output_dir=sys.argv[1], verbose=2,
                 callbacks=[StepThreads()])
json.dump(sorted(StepThreads.threads), open(sys.argv[1] + "/step_threads.json", "w"))
"""


def test_a_second_identical_run_compiles_nothing(tmp_path):
    write_tiny_checkpoint(tmp_path / "ckpt", num_layers=1, hidden_size=16, intermediate_size=32)
    write_sentiment_tsv(tmp_path / "train.tsv", 48, seed=0)
    write_sentiment_tsv(tmp_path / "dev.tsv", 16, seed=1)
    (tmp_path / "r.yaml").write_text(
        yaml.safe_dump(
            {
                "schema": 1,
                "task": "classification",
                "backbone": {"preset": "./ckpt", "sequence_length": 32},
                "data": {"train": "train.tsv", "validation": "dev.tsv", "text": "sentence"},
                "training": {"epochs": 1, "batch_size": 16},
                "output_dir": "run",
            }
        )
    )
    featurize(tmp_path / "r.yaml", tmp_path / "features.npz")
    env = {**os.environ, "KERAS_BACKEND": "jax", "BERTKIT_COMPILATION_CACHE": str(tmp_path / "xla")}
    records = []
    for run in ("first", "second"):
        result = subprocess.run(
            [sys.executable, "-c", TRAIN_ON_JAX, run],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        records.append(json.loads((tmp_path / run / "run.json").read_text())["compilation"])
        assert "programs" in result.stdout.splitlines()[-1]
    first, second = records
    # bertkit's own step callbacks let Keras run every step-end hook on its callback
    # thread: the main thread never waits for a step's logs (no host sync per step)
    assert json.loads((tmp_path / "second" / "step_threads.json").read_text()) == [False]
    # Before the first step every training and validation program was compiled into
    # the cache (one training shape and one validation shape here), and fit read them
    assert first["precompiled"]["programs"] == 2
    assert first["from_cache"] == first["precompiled"]["programs"]
    assert second["programs"] == first["programs"]  # train, evaluate, predict: each shape
    assert second["from_cache"] == second["programs"]  # ... read from the cache
    # no training step waited for a compiler: what came after the first step was read
    # back (the second run), or small programs of the metrics (the first)
    assert second["after_first_step"]["compiled"] == 0
    assert second["after_first_step"]["from_cache"] > 0
    assert "train_step" not in str(first["after_first_step"]["longest"]["function"])
    # Reading a program back costs about 30 ms here whatever its size, and this tiny model
    # compiles in about 4 s: the second run's 28 reads measured 15-25% of the first run's
    # compile seconds on a busy 2-core CPU (a real model's compile dwarfs them). That no
    # program was compiled is `from_cache` above; this bounds the time the reads take.
    assert second["seconds"] <= 0.35 * first["seconds"], records
    assert any((tmp_path / "xla").iterdir())


def test_the_cache_folder_setting(monkeypatch, tmp_path):
    monkeypatch.setenv("BERTKIT_CACHE", str(tmp_path))
    monkeypatch.delenv("BERTKIT_COMPILATION_CACHE", raising=False)
    assert cache_folder("auto") == tmp_path / "xla"
    assert cache_folder(str(tmp_path / "mine")) == tmp_path / "mine"
    assert cache_folder("off") is None
    monkeypatch.setenv("BERTKIT_COMPILATION_CACHE", "off")
    assert cache_folder("auto") is None
    assert cache_folder(str(tmp_path / "mine")) == tmp_path / "mine"  # the recipe's wins


@pytest.mark.parametrize(
    "order, packing, micro_batches, row_multiple",
    [
        ("length_buckets", False, 1, 1),
        ("random", False, 2, 1),
        ("random", True, 1, 1),
        ("length_buckets", False, 1, 32),  # full batches, as on an accelerator
    ],
)
def test_the_shapes_found_ahead_are_every_shape_the_epochs_make(
    order, packing, micro_batches, row_multiple
):
    from bertkit.batching.packing import packed_row_counts
    from bertkit.batching.plan import BatchPlan
    from bertkit.padding import padding_lengths
    from bertkit.task import Features
    from bertkit.training.precompile import step_shapes

    lengths = np.random.default_rng(0).integers(3, 120, 301)
    features = Features(
        columns={"token_ids": [np.ones(n, np.int32) for n in lengths]},
        example_index=np.arange(len(lengths)),
    )

    class Passthrough:
        def make_batch(self, batch, training, rng):
            return {"token_ids": batch["token_ids"]}, np.zeros(len(batch["row_index"])), None

    buckets = (16, 32, 64, 128)
    plan = BatchPlan(
        32,
        buckets,
        padding_lengths(buckets, True),
        order=order,
        micro_batches=micro_batches,
        packing=packing,
        packed_row_counts=packed_row_counts(32) if packing else None,
        row_multiple=row_multiple,
    )
    batches = plan.training_batches(Passthrough(), features)
    made = set()
    for epoch in range(3):
        batches.set_epoch(epoch)
        made |= {(batch[0]["token_ids"].shape, len(batch[1])) for batch in batches}
    found = step_shapes(batches, range(3))
    representatives = {
        (batches.batch(step, epoch)[0]["token_ids"].shape, len(batches.batch(step, epoch)[1]))
        for epoch, step in found.values()
    }
    assert representatives == made and len(found) == len(made)
    assert step_shapes(batches, range(1)).keys() <= found.keys()
    if row_multiple > 1:  # 301 rows: no short last step, so one shape a width
        assert {shape[0] for shape, _ in made} == {row_multiple}
        assert len(made) == len({shape[1] for shape, _ in made})


def test_on_an_accelerator_short_batches_are_filled_to_full_ones(monkeypatch, tmp_path):
    """One program fewer for the last training step and the last evaluation batch: their
    filler rows weigh nothing and their outputs are dropped."""
    import bertkit.parallel.distribution as distribution
    from bertkit.recipes.recipe import load_recipe
    from bertkit.serving.inference import model_inputs
    from bertkit.task import Features
    from bertkit.training.run_steps import batch_plan

    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(
        yaml.safe_dump(
            {
                "schema": 1,
                "task": "classification",
                "backbone": {
                    "preset": str(write_tiny_checkpoint(tmp_path / "c")),
                    "sequence_length": 32,
                },
                "data": {"train": "train.tsv"},
                "training": {
                    "batch_size": 8,
                    "jit_compile": True,
                    "packing": False,
                    "batch_order": "length_buckets",  # (random: batches of 7, 7, 6)
                },
            }
        )
    )
    recipe = load_recipe(recipe_path)
    assert batch_plan(recipe).row_multiple == 1  # this CPU
    monkeypatch.setattr(distribution, "on_accelerator", lambda: True)
    plan = batch_plan(recipe)
    assert plan.row_multiple == 8
    # packed steps too: their filler rows take no tokens (tests/test_packing.py)
    training = dataclasses.replace(recipe.training, packing=True, batch_order="random")
    packed = batch_plan(dataclasses.replace(recipe, training=training))
    assert (packed.row_multiple, packed.fixed_packing_epochs) == (8, 3)

    lengths = np.arange(3, 23)  # 20 rows: two full batches of 8 and one of 4
    features = Features(
        columns={"token_ids": [np.ones(n, np.int32) for n in lengths]},
        example_index=np.arange(len(lengths)),
    )

    class Passthrough:
        def make_batch(self, batch, training, rng):
            rows = len(batch["row_index"])
            return {"token_ids": batch["token_ids"]}, np.ones(rows), None

    batches = plan.training_batches(Passthrough(), features)
    steps = list(batches)
    assert [len(step[1]) for step in steps] == [8, 8, 8]
    weights = [np.asarray(step[2]) for step in steps]
    assert sorted(int((w > 0).sum()) for w in weights) == [4, 8, 8]  # filler rows weigh 0
    inference = [
        inputs["token_ids"].shape[0]
        for _, _, inputs in model_inputs(Passthrough(), features, 8, (32,))
    ]
    assert inference == [8, 8, 8]


def test_on_an_accelerator_a_recipe_without_buckets_takes_fewer_wider_ones(monkeypatch, tmp_path):
    import keras

    import bertkit.parallel.distribution as distribution
    from bertkit.recipes.recipe import load_recipe
    from bertkit.training.run_steps import batch_plan

    def plan_of(sequence_length, **training):
        spec = {
            "schema": 1,
            "task": "classification",
            "backbone": {"preset": str(tmp_path / "c"), "sequence_length": sequence_length},
            "data": {"train": "train.tsv"},
            "training": {"batch_size": 8, "jit_compile": True, **training},
        }
        return batch_plan(load_recipe(spec))

    write_tiny_checkpoint(tmp_path / "c")
    assert plan_of(384).pad_lengths == (16, 32, 64, 128, 192, 256, 320, 384)  # this CPU
    monkeypatch.setattr(distribution, "on_accelerator", lambda: True)
    assert plan_of(64).pad_lengths == (64,)
    assert plan_of(384).pad_lengths == (64, 128, 256, 384)
    assert plan_of(384, packing=True).buckets == (64, 128, 256, 384)
    assert plan_of(64, bucket_lengths=[16, 32]).pad_lengths == (16, 32, 64)  # the recipe's
    if keras.backend.backend() == "tensorflow":  # no XLA: any width, no compilation
        assert plan_of(64, jit_compile=False).pad_lengths[:3] == (8, 16, 24)


def test_what_came_after_the_first_step_is_told_apart_from_cache_reads():
    import time

    from bertkit.training.compilation import _BACKEND_COMPILE, _CACHE_HIT, CompileCounter

    counter = CompileCounter()
    counter._on_duration(_BACKEND_COMPILE, 0.0, fun_name="jit(train_step)")  # before
    first_step_ended = time.perf_counter()
    counter._on_event(_CACHE_HIT)  # JAX reports a hit, then the same program's duration
    counter._on_duration(_BACKEND_COMPILE, 0.0, fun_name="jit(predict_step)")
    counter._on_duration(_BACKEND_COMPILE, 0.0, fun_name="jit(equal)")  # compiled
    late = counter.record(first_step_ended)["after_first_step"]
    assert (late["compiled"], late["from_cache"]) == (1, 1)
    assert late["longest"]["function"] == "jit(equal)"
    assert "after_first_step" not in counter.record()
