"""The fixed host cost of one training step on JAX: a bare jitted loop, Keras `fit`, bertkit.

Where the model's compute is negligible (a 1-layer BERT of hidden size 32 on 16-token rows),
a step's time is what the host adds around it: Python, data, callbacks, synchronisation.
Each system trains the same model shape for 2 epochs at two data sizes; the cost of one
step is the slope of the second epoch's wall time over its number of steps, so per-epoch
work (checkpoints, evaluation) cancels out.

    KERAS_BACKEND=jax python benchmarks/step_overhead.py [--out overhead.json]

Prints a table: ms per step for each system, and bertkit's against Keras `fit`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import bertkit  # noqa: E402
from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint  # noqa: E402

SHAPE = {"num_layers": 1, "hidden_size": 32, "intermediate_size": 64}
BATCH, SEQUENCE_LENGTH = 32, 16
STEPS = (64, 256)  # steps per epoch of the two runs


class EpochClock(keras.callbacks.Callback):
    """Wall seconds of each epoch, from its start to the first epoch-end callback after it."""

    async_safe = True

    def __init__(self):
        super().__init__()
        self.seconds = []

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self._start)


def tiny_model(vocabulary_size: int = 200):
    import keras_hub

    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=vocabulary_size,
        num_layers=1,
        num_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
        max_sequence_length=SEQUENCE_LENGTH,
    )
    logits = keras.layers.Dense(2)(backbone.output["pooled_output"])
    return keras.Model(backbone.input, logits)


def arrays(rows: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    inputs = {
        "token_ids": rng.integers(1, 200, (rows, SEQUENCE_LENGTH)).astype("int32"),
        "segment_ids": np.zeros((rows, SEQUENCE_LENGTH), "int32"),
        "padding_mask": np.ones((rows, SEQUENCE_LENGTH), "int32"),
    }
    return inputs, rng.integers(0, 2, rows).astype("int32")


def bare_jax_loop(steps: int) -> float:
    """Seconds of `steps` jitted SGD steps over batches already on the device."""
    import jax

    model = tiny_model()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    inputs, labels = arrays(BATCH * steps)
    batches = [
        (
            {k: jax.device_put(v[i : i + BATCH]) for k, v in inputs.items()},
            jax.device_put(labels[i : i + BATCH]),
        )
        for i in range(0, len(labels), BATCH)
    ]

    def loss(trainable, non_trainable, x, y):
        logits, _ = model.stateless_call(trainable, non_trainable, x)
        return loss_fn(y, logits)

    @jax.jit
    def step(trainable, non_trainable, x, y):
        value, grads = jax.value_and_grad(loss)(trainable, non_trainable, x, y)
        return [w - 1e-3 * g for w, g in zip(trainable, grads, strict=True)], value

    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    trainable, value = step(trainable, non_trainable, *batches[0])  # compile
    value.block_until_ready()
    started = time.perf_counter()
    for x, y in batches:
        trainable, value = step(trainable, non_trainable, x, y)
    value.block_until_ready()
    return time.perf_counter() - started


def keras_fit(steps: int) -> float:
    """Second-epoch seconds of Keras `fit` on in-memory arrays, with bertkit's optimizer
    (AdamW, warmup and decay, clipping: the same device work as `finetune`'s step)."""
    from bertkit.recipes.recipe import TrainingConfig
    from bertkit.training.optimization import make_optimizer

    model = tiny_model()
    training = TrainingConfig(epochs=2, batch_size=BATCH)
    model.compile(
        optimizer=make_optimizer(training, steps),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    clock = EpochClock()
    inputs, labels = arrays(BATCH * steps)
    model.fit(
        inputs, labels, batch_size=BATCH, epochs=2, verbose=0, shuffle=False, callbacks=[clock]
    )
    return clock.seconds[1]


def bertkit_finetune(steps: int, folder: Path) -> float:
    """Second-epoch seconds of `bertkit.finetune` (no validation split, no export)."""
    write_tiny_checkpoint(folder / "ckpt", **SHAPE)
    write_sentiment_tsv(folder / "train.tsv", BATCH * steps, seed=0)
    clock = EpochClock()
    bertkit.finetune(
        {
            "schema": 1,
            "task": "classification",
            "backbone": {"preset": str(folder / "ckpt"), "sequence_length": SEQUENCE_LENGTH},
            "data": {"train": str(folder / "train.tsv"), "text": "sentence"},
            "training": {"epochs": 2, "batch_size": BATCH, "bucket_lengths": [SEQUENCE_LENGTH]},
            "output_dir": str(folder / "run"),
        },
        verbose=2,
        callbacks=[clock],
    )
    return clock.seconds[1]


def per_step_ms(measure) -> dict:
    """ms per step: the slope of the measured seconds between the two step counts."""
    seconds = [measure(steps) for steps in STEPS]
    slope = (seconds[1] - seconds[0]) / (STEPS[1] - STEPS[0])
    return {"seconds": [round(s, 3) for s in seconds], "ms_per_step": round(1e3 * slope, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the results as JSON")
    args = parser.parse_args()
    results = {
        "bare jitted loop (SGD)": per_step_ms(bare_jax_loop),
        "Keras fit, in-memory arrays": per_step_ms(keras_fit),
    }  # bertkit's AdamW
    with tempfile.TemporaryDirectory() as folder:
        results["bertkit finetune"] = per_step_ms(
            lambda steps: bertkit_finetune(steps, Path(folder) / f"s{steps}")
        )
    keras_ms = results["Keras fit, in-memory arrays"]["ms_per_step"]
    print(f"\n{'system':32} {'ms/step':>8} {'x Keras fit':>12}", file=sys.stderr)
    for name, result in results.items():
        ratio = result["ms_per_step"] / keras_ms if keras_ms > 0 else float("nan")
        print(f"{name:32} {result['ms_per_step']:8.2f} {ratio:12.2f}", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
