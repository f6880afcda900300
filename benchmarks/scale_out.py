"""Two figures for training on many GPUs: the input pipeline's ceiling, and compiled programs.

(a) How many training batches bertkit's batching (`TrainingBatches`: bucketing,
    padding, the task's `make_batch`, weights) makes per second from featurized
    rows, on one CPU core (one thread, timed in CPU seconds so that other load on
    a shared machine does not count), next to what one H100 consumes training
    BERT-base at 50% MFU. Pipeline cost does not depend on the model, only on
    the batch and sequence sizes and the task.
(b) How many programs JAX compiles in a tiny run with length buckets, over two
    (simulated) devices as a multi-process job has: at most one training and one
    inference program per batch shape, and the shapes are bounded by the buckets.

    python benchmarks/scale_out.py            # both; --skip-compiles for (a) only
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from common import timed  # noqa: E402

from bertkit.batching.plan import BatchPlan  # noqa: E402
from bertkit.padding import bucket_lengths  # noqa: E402
from bertkit.task import Features  # noqa: E402

BERT_BASE_PARAMETERS = 109.5e6  # bert-base-uncased, embeddings included
BERT_BASE = {"layers": 12, "hidden": 768}
H100_PEAK_TFLOPS = 989  # dense bf16, SXM
MFU = 0.5


def h100_sequences_per_second(sequence_length: int, attention: bool) -> float:
    """Training sequences/s of one H100 at 50% MFU: 6 FLOPs per parameter per token
    (forward + backward), plus, with `attention`, 12 * layers * seq * hidden per token."""
    per_token = 6 * BERT_BASE_PARAMETERS
    if attention:
        per_token += 12 * BERT_BASE["layers"] * sequence_length * BERT_BASE["hidden"]
    return MFU * H100_PEAK_TFLOPS * 1e12 / (per_token * sequence_length)


def synthetic_features(
    count: int, sequence_length: int, lengths: str, tagging: bool, seed: int = 0
) -> Features:
    """`count` featurized rows: all `sequence_length` long (`full`), or uniform from 8 to it."""
    rng = np.random.default_rng(seed)
    sizes = (
        np.full(count, sequence_length)
        if lengths == "full"
        else rng.integers(8, sequence_length + 1, count)
    )
    columns = {
        "token_ids": [rng.integers(1000, 30000, n).astype(np.int32) for n in sizes],
        "segment_ids": [np.zeros(n, np.int32) for n in sizes],
    }
    if tagging:  # a label per word piece, -100 (ignored) on every third
        columns["labels"] = [
            np.where(np.arange(n) % 3, rng.integers(0, 9, n), -100).astype(np.int32) for n in sizes
        ]
        return Features(columns, np.arange(count), pad_values={"labels": -100})
    columns["labels"] = rng.integers(0, 2, count).astype(np.int32)
    return Features(columns, np.arange(count))


def task(name: str, sequence_length: int):
    if name == "tagging":
        from bertkit_tasks.tagging.task import TaggingOptions, TaggingTask

        return TaggingTask(TaggingOptions(), None, None, sequence_length, {"labels": ["O"]})
    from bertkit_tasks.classification.task import ClassificationOptions, ClassificationTask

    return ClassificationTask(
        ClassificationOptions(), None, None, sequence_length, {"labels": ["neg", "pos"]}
    )


def pipeline_rate(
    task_name: str,
    sequence_length: int,
    batch_size: int,
    lengths: str,
    devices: int,
    batches: int = 200,
) -> dict:
    """Training batches made per CPU second of this thread (one core)."""
    features = synthetic_features(
        batch_size * batches, sequence_length, lengths, task_name == "tagging"
    )
    plan = BatchPlan(batch_size, bucket_lengths(sequence_length), row_multiple=devices)
    made = plan.training_batches(task(task_name, sequence_length), features)
    result = {}
    with timed(result):
        started = time.thread_time()
        for _ in made:
            pass
        cpu = time.thread_time() - started
    rate = len(made) / cpu
    return {
        "task": task_name,
        "sequence_length": sequence_length,
        "batch_size": batch_size,
        "lengths": lengths,
        "batches_per_cpu_second": round(rate, 1),
        "sequences_per_cpu_second": round(rate * batch_size),
        "other_cores_busy": result.get("other_cores_busy"),
    }


def count_compiled_programs(folder: Path) -> dict:
    """A tiny run over two devices with four bucket lengths; programs JAX compiled."""
    import jax
    import yaml

    import bertkit
    from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint

    compiled = []

    class CountCompiles(logging.Handler):
        def emit(self, record):
            message = record.getMessage()
            if message.startswith("Compiling jit("):
                compiled.append(message[len("Compiling jit(") :].split(")")[0])

    write_tiny_checkpoint(folder / "ckpt")
    write_sentiment_tsv(folder / "train.tsv", 96, seed=0)
    write_sentiment_tsv(folder / "dev.tsv", 30, seed=1)
    buckets = [8, 12, 16]
    (folder / "recipe.yaml").write_text(
        yaml.safe_dump(
            {
                "schema": 1,
                "task": "classification",
                "backbone": {"preset": "./ckpt", "sequence_length": 24},
                "data": {"train": "train.tsv", "validation": "dev.tsv", "text": "sentence"},
                "training": {
                    "epochs": 3,
                    "batch_size": 8,
                    "bucket_lengths": buckets,
                    "distribution": "data_parallel",
                },
                "output_dir": "run",
            }
        )
    )
    jax.config.update("jax_log_compiles", True)
    logging.getLogger("jax").addHandler(CountCompiles())
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        bertkit.finetune("recipe.yaml", verbose=0)
    finally:
        os.chdir(cwd)
    return {
        "devices": len(jax.devices()),
        "bucket_lengths": bucket_lengths(24, buckets),
        "train_programs": compiled.count("train_step"),
        "inference_programs": compiled.count("infer") + compiled.count("predict_step"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-compiles", action="store_true")
    args = parser.parse_args()
    print("H100 at 50% MFU, BERT-base training (989 dense bf16 TFLOPS):")
    for length in (128, 384):
        plain = h100_sequences_per_second(length, attention=False)
        full = h100_sequences_per_second(length, attention=True)
        print(
            f"  seq {length}: {plain:,.0f} seq/s with 6*N FLOPs a token "
            f"(0.5 * 989e12 / (6 * 109.5e6 * {length})); {full:,.0f} seq/s with "
            f"attention's 12*L*s*d added ({full / 32:.0f} batches of 32 a second)"
        )
    rows = [
        pipeline_rate(name, length, 32, lengths, devices=8)
        for name in ("classification", "tagging")
        for length in (128, 384)
        for lengths in ("full", "mixed")
    ]
    print("bertkit's batching on one CPU core (batch 32, filled for 8 devices):")
    for row in rows:
        rate = row["sequences_per_cpu_second"]
        need = h100_sequences_per_second(row["sequence_length"], attention=False)
        print(
            f"  {row['task']:14} seq {row['sequence_length']} {row['lengths']:5} lengths: "
            f"{row['batches_per_cpu_second']:8.1f} batches/s = {rate:7,} seq/s = "
            f"{rate / need:5.1f} H100s (other cores busy {row['other_cores_busy']})"
        )
    if not args.skip_compiles:
        with tempfile.TemporaryDirectory() as folder:
            counts = count_compiled_programs(Path(folder))
        print(
            f"compiled programs, tiny run, {counts['devices']} devices, bucket lengths "
            f"{counts['bucket_lengths']}: {counts['train_programs']} training, "
            f"{counts['inference_programs']} inference"
        )
        print(json.dumps(counts))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
