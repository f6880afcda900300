"""Data parallel on one machine: JAX over two simulated CPU devices.

XLA is told to show the CPU as two devices before JAX loads, in a child
process. The same recipe and seed trained on one device and on two ends with
the same metrics, padded or packed; every training batch reaches the devices as
two halves; the number of compiled training programs stays within the bucket count.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from bertkit.batching.plan import BatchPlan
from bertkit.padding import fill_rows
from bertkit.task import Features
from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint

pytest.importorskip("jax", reason="the JAX backend is part of the dev install")

TWO_DEVICES = """
import json, logging, sys
import jax
from keras.src.backend import distribution_lib  # Keras's JAX input sharding

compiled = []
class CountCompiles(logging.Handler):
    def emit(self, record):
        message = record.getMessage()
        if message.startswith("Compiling jit("):
            compiled.append(message[len("Compiling jit("):].split(")")[0])
jax.config.update("jax_log_compiles", True)
logging.getLogger("jax").addHandler(CountCompiles())

shards = []
distribute = distribution_lib.distribute_data_input
def recording(batch, layout, batch_dim_name):
    array = distribute(batch, layout, batch_dim_name)
    shards.append([array.shape[0]] + [shard.data.shape[0] for shard in array.addressable_shards])
    return array
distribution_lib.distribute_data_input = recording

import bertkit
assert len(jax.devices()) == 2
report = {}
for name in sys.argv[1:]:
    compiled.clear(); shards.clear()
    try:
        bertkit.finetune(f"{name}.yaml", verbose=0)
    except bertkit.UserError as error:
        report[name] = {"error": str(error)}
        continue
    metrics = json.load(open(f"{name}/metrics.json"))
    report[name] = {"metrics": metrics, "shards": shards[:],
                    "train_programs": compiled.count("train_step"),
                    "predict_programs": compiled.count("predict_step")}
print(json.dumps(report))
"""

BASE = {"epochs": 2, "batch_size": 8, "learning_rate": 1e-3, "seed": 3}
RUNS = {
    "one_device": {"distribution": "one_device"},
    "two_devices": {"distribution": "auto"},  # auto: both devices
    "micro_batches": {
        "distribution": "data_parallel",
        "batch_order": "random",
        "micro_batches": 2,
        "gradient_accumulation_steps": 2,
    },
    "odd_batch": {"distribution": "data_parallel", "batch_size": 7},
    "packed_one_device": {"distribution": "one_device", "batch_order": "random", "packing": True},
    "packed_two_devices": {"distribution": "auto", "batch_order": "random", "packing": True},
}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data_parallel")
    write_tiny_checkpoint(folder / "ckpt")
    write_sentiment_tsv(folder / "train.tsv", 48, seed=0)  # batches of 8: all full
    write_sentiment_tsv(folder / "dev.tsv", 15, seed=1)  # odd: one filler row in inference
    for name, training in RUNS.items():
        (folder / f"{name}.yaml").write_text(
            yaml.safe_dump(
                {
                    "schema": 1,
                    "task": "classification",
                    "backbone": {"preset": "./ckpt", "sequence_length": 32},
                    "data": {"train": "train.tsv", "validation": "dev.tsv", "text": "sentence"},
                    "training": {**BASE, **training},
                    "export": {"saved_model": False},  # each would be a TensorFlow child
                    "output_dir": name,
                }
            )
        )
    env = {
        **os.environ,
        "KERAS_BACKEND": "jax",
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2",
    }
    result = subprocess.run(
        [sys.executable, "-c", TWO_DEVICES, *RUNS],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_two_devices_end_as_one_device(report):
    one, two = report["one_device"]["metrics"], report["two_devices"]["metrics"]
    # Same batches, same dropout masks (JAX draws a sharded random array as the whole
    # one); only the order of float32 sums differs (each device sums half the batch,
    # then the halves are added): ~1e-7 relative per step, compounding over 12 steps.
    for a, b in zip(one["epochs"], two["epochs"], strict=True):
        print(
            f"epoch {a['epoch']}: loss {a['loss']!r} (1 device) vs {b['loss']!r} (2 devices), "
            f"val_macro_f1 {a['val_macro_f1']!r} vs {b['val_macro_f1']!r}"
        )
        np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-4)
    assert two["final"]["validation"]["accuracy"] == one["final"]["validation"]["accuracy"]
    np.testing.assert_allclose(
        two["final"]["validation"]["macro_f1"], one["final"]["validation"]["macro_f1"], atol=1e-6
    )


def test_each_device_gets_half_of_every_batch(report):
    assert not report["one_device"]["shards"]  # no distribution: nothing is sharded
    for name in ("two_devices", "micro_batches"):
        shards = report[name]["shards"]
        assert shards and all(rows == 2 * a == 2 * b for rows, a, b in shards), name


def test_packed_batches_train_on_two_devices_as_on_one(report):
    # Same batches packed into the same rows (2 or 4 of them here on either: a multiple
    # of 2 on two devices), so the same dropout masks; each device gets half of the
    # packed rows and of the rows, and the [CLS] gather reads across the halves.
    one, two = report["packed_one_device"], report["packed_two_devices"]
    for a, b in zip(one["metrics"]["epochs"], two["metrics"]["epochs"], strict=True):
        print(f"packed, epoch {a['epoch']}: loss {a['loss']!r} (1 device) vs {b['loss']!r} (2)")
        np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-4)
    assert (
        two["metrics"]["final"]["validation"]["accuracy"]
        == one["metrics"]["final"]["validation"]["accuracy"]
    )
    assert two["shards"] and all(rows == 2 * a == 2 * b for rows, a, b in two["shards"])
    assert {rows for rows, _, _ in two["shards"]} > {8}  # the packed rows' arrays too


def test_micro_batches_and_accumulation_train_on_two_devices(report):
    epochs = report["micro_batches"]["metrics"]["epochs"]
    assert len(epochs) == 2 and all(np.isfinite(e["loss"]) for e in epochs)


def test_a_batch_size_that_does_not_split_names_the_key(report):
    assert report["odd_batch"]["error"] == (
        "odd_batch.yaml: training.batch_size: 7 rows do not split evenly over 2 devices; "
        "use a multiple of 2"
    )


def test_compiled_training_programs_stay_within_the_buckets(report):
    # bucket_lengths(32) is (16, 32): one training program per bucket length in use,
    # and full batches throughout, so at most two.
    for name in ("one_device", "two_devices"):
        print(
            f"{name}: {report[name]['train_programs']} training programs, "
            f"{report[name]['predict_programs']} inference programs compiled"
        )
        assert 1 <= report[name]["train_programs"] <= 2, report[name]


class _Task:
    def make_batch(self, batch, training, rng):
        return {"token_ids": batch["token_ids"]}, batch["labels"], None


def test_filler_rows_weigh_nothing_and_the_batch_mean_is_kept():
    lengths = [3, 5, 4, 6, 2]
    features = Features(
        {"token_ids": [np.ones(n, np.int32) for n in lengths], "labels": np.arange(5)},
        example_index=np.arange(5),
    )
    batches = BatchPlan(batch_size=5, buckets=(8,), seed=0, row_multiple=2).training_batches(
        _Task(), features
    )
    inputs, labels, weights = batches.batch(0)
    assert len(labels) == 6 and weights[5] == 0.0  # 5 rows + 1 filler
    # Keras's mean over 6 weighted rows equals the plain mean over the 5 real ones.
    np.testing.assert_allclose(np.sum(weights[:5] * labels[:5]) / 6, np.mean(labels[:5]))
    assert fill_rows(np.arange(4), 2).tolist() == [0, 1, 2, 3]


TWO_TENSORFLOW_DEVICES = """
import json
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
replicas = []
train_step = keras.Model.train_step
def recording(self, data):
    replicas.append(tf.distribute.get_replica_context().num_replicas_in_sync)  # when traced
    return train_step(self, data)
keras.Model.train_step = recording
import bertkit
report = {}
for name in ("one_device", "two_devices"):
    replicas.clear()
    bertkit.finetune(f"{name}.yaml", verbose=0)
    report[name] = {"metrics": json.load(open(f"{name}/metrics.json")), "replicas": replicas[:]}
print(json.dumps(report))
"""


def test_tensorflow_mirrored_over_two_logical_cpus_ends_as_one_device(tmp_path):
    # Dropout off: each TensorFlow replica draws its own mask for its half of the batch
    # (not the halves of the one-device mask, as JAX does), which is no error but would
    # hide the comparison; what is left differs only in the order of float32 sums.
    write_tiny_checkpoint(tmp_path / "ckpt", hidden_dropout_prob=0.0)
    write_sentiment_tsv(tmp_path / "train.tsv", 48, seed=0)
    write_sentiment_tsv(tmp_path / "dev.tsv", 15, seed=1)
    for name, distribution in (("one_device", "one_device"), ("two_devices", "auto")):
        (tmp_path / f"{name}.yaml").write_text(
            yaml.safe_dump(
                {
                    "schema": 1,
                    "task": {"name": "classification", "dropout": 0.0},
                    "backbone": {"preset": "./ckpt", "sequence_length": 32},
                    "data": {"train": "train.tsv", "validation": "dev.tsv", "text": "sentence"},
                    "training": {**BASE, "distribution": distribution},
                    "export": {"saved_model": False},
                    "output_dir": name,
                }
            )
        )
    env = {**os.environ, "KERAS_BACKEND": "tensorflow"}
    result = subprocess.run(
        [sys.executable, "-c", TWO_TENSORFLOW_DEVICES],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    one, two = report["one_device"], report["two_devices"]
    assert set(one["replicas"]) == {1} and set(two["replicas"]) == {2}
    for a, b in zip(one["metrics"]["epochs"], two["metrics"]["epochs"], strict=True):
        print(
            f"TensorFlow epoch {a['epoch']}: loss {a['loss']!r} (1 device) vs "
            f"{b['loss']!r} (2 devices)"
        )
        np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-4)  # as on JAX
    assert (
        two["metrics"]["final"]["validation"]["accuracy"]
        == one["metrics"]["final"]["validation"]["accuracy"]
    )
