"""Training throughput and MFU of a BERT-shaped model on the JAX backend (GPU or CPU).

Trains bertkit's classification model (keras-hub `BertBackbone` + [CLS] head, the same
code `bertkit finetune` builds) with Keras `fit` on the JAX backend, from pre-tokenized
features: no TensorFlow is imported. Random weights are fine for speed. Reports
sequences/second and model FLOP utilisation (MFU) against a given peak:

    training FLOPs per token ~= 6 * N_non_embedding + 12 * L * s * d   (forward + backward)

    KERAS_BACKEND=jax python benchmarks/jax_train_throughput.py --preset base \\
        --sequence-length 128 384 --batch-size 64 --mixed-precision bfloat16 --peak-tflops 989

Use `--features FILE` (from `bertkit featurize`) to time real sequence lengths instead of
full-length synthetic rows.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

SHAPES = {
    "base": dict(num_layers=12, hidden_dim=768, num_heads=12, intermediate_dim=3072),
    "minilm": dict(num_layers=6, hidden_dim=384, num_heads=12, intermediate_dim=1536),
    "tiny": dict(num_layers=2, hidden_dim=128, num_heads=2, intermediate_dim=512),
}


def training_flops_per_sequence(shape: dict, sequence_length: int) -> float:
    layers, hidden, inner = shape["num_layers"], shape["hidden_dim"], shape["intermediate_dim"]
    non_embedding = layers * (4 * hidden * hidden + 2 * hidden * inner)
    per_token = 6 * non_embedding + 12 * layers * sequence_length * hidden
    return per_token * sequence_length


def build_model(shape: dict, sequence_length: int):
    import keras_hub

    from bertkit.model.architecture import prepare_layers
    from bertkit.model.attention import set_attention_dropout, training_attention_dropout
    from bertkit.recipes.recipe import TrainingConfig
    from bertkit.training.optimization import make_optimizer

    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=30522, max_sequence_length=512, **shape
    )
    prepare_layers(backbone, "gelu")  # as bertkit loads a Hugging Face checkpoint
    # as `bertkit finetune` with no `backbone.attention_dropout`: 0 on a GPU (fused)
    set_attention_dropout(backbone, training_attention_dropout(None))
    logits = keras.layers.Dense(2, name="classifier")(backbone.output["pooled_output"])
    model = keras.Model(backbone.input, logits)
    model.compile(
        optimizer=make_optimizer(TrainingConfig(epochs=1), steps_per_epoch=1000),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    return model


def synthetic_rows(rows: int, sequence_length: int, seed: int = 0):
    """Full-length rows of random token ids and binary labels."""
    rng = np.random.default_rng(seed)
    inputs = {
        "token_ids": rng.integers(1000, 30000, (rows, sequence_length), np.int32),
        "segment_ids": np.zeros((rows, sequence_length), np.int32),
        "padding_mask": np.ones((rows, sequence_length), np.int32),
    }
    return inputs, rng.integers(0, 2, rows).astype(np.int32)


def time_fit(model, inputs, labels, batch_size: int, warmup: int) -> float:
    """Seconds of one Keras `fit` epoch over `inputs`, after a `fit` of `warmup` steps that
    compiles. Steps are dispatched ahead as in `bertkit finetune` (no wait for each step's
    loss); the clock stops once the last step has finished."""

    def wait():
        keras.ops.convert_to_numpy(model.trainable_variables[0])

    head = batch_size * warmup
    model.fit(
        {k: v[:head] for k, v in inputs.items()},
        labels[:head],
        batch_size=batch_size,
        verbose=0,
        shuffle=False,
    )
    wait()
    started = time.perf_counter()
    model.fit(inputs, labels, batch_size=batch_size, verbose=0, shuffle=False)
    wait()
    return time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(SHAPES), default="base")
    parser.add_argument("--sequence-length", type=int, nargs="+", default=[128, 384])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--mixed-precision", choices=["bfloat16", "float16", "none"], default="bfloat16"
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=989.0,
        help="dense peak of the device in TFLOP/s (H100 bf16: 989)",
    )
    args = parser.parse_args()

    if sys.modules.get("tensorflow") is not None:
        raise SystemExit("TensorFlow got imported; this benchmark must run without it")
    if args.mixed_precision != "none":
        keras.config.set_dtype_policy(f"mixed_{args.mixed_precision}")
    import jax

    print(
        f"backend {keras.backend.backend()}, devices {jax.devices()}, shape {args.preset}, "
        f"batch {args.batch_size}, precision {args.mixed_precision}"
    )
    shape = SHAPES[args.preset]
    for length in args.sequence_length:
        model = build_model(shape, length)
        inputs, labels = synthetic_rows(args.batch_size * args.steps, length)
        seconds = time_fit(model, inputs, labels, args.batch_size, args.warmup)
        sequences_per_second = args.steps * args.batch_size / seconds
        achieved = sequences_per_second * training_flops_per_sequence(shape, length) / 1e12
        print(
            f"seq {length:4d}: {sequences_per_second:9.1f} seq/s, {achieved:8.2f} TFLOP/s, "
            f"MFU {100 * achieved / args.peak_tflops:5.1f}% of {args.peak_tflops:g} TFLOP/s"
        )


if __name__ == "__main__":
    main()
