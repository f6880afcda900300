"""The JAX side of `gpu_check.py`, one command per process; TensorFlow is never imported.

matmul --size N          bf16 N x N matmul TFLOP/s through JAX (the ceiling for MFU),
                         and the versions and device
steps --shape S --sequence-length L
                         bertkit's model's steady-state training steps: the model of
                         benchmarks/jax_train_throughput.py (keras-hub BertBackbone,
                         bertkit's head and AdamW), mixed_bfloat16, synthetic full rows
checkpoint --shape S --tokenizer DIR --out DIR
                         a random BERT in Hugging Face format written with NumPy (where
                         torch is not installed; torch_worker.py's is the usual one)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path

# As on the GPU machines: no TensorFlow, even where it is installed (imports of it fail as
# if it were absent, and bertkit then exports nothing).
sys.modules["tensorflow"] = None
sys.modules["tensorflow_text"] = None
os.environ["KERAS_BACKEND"] = "jax"
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/

from protocol import SETTINGS, SHAPES, hf_config, report  # noqa: E402


def environment() -> dict:
    """Versions and the device JAX computes on."""
    import jax

    versions = {}
    for name in ("jax", "jaxlib", "keras", "keras-hub", "bertkit", "numpy"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    device = jax.devices()[0]
    return {
        "versions": versions,
        "platform": device.platform,
        "device": getattr(device, "device_kind", str(device)),
        "device_count": jax.device_count(),
    }


def matmul(args) -> None:
    import jax
    import jax.numpy as jnp

    found = environment()
    report(**found)  # kept in the row even if the timing below fails or times out
    n, repeats = args.size, 10
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    a = jax.random.normal(k1, (n, n), jnp.bfloat16)
    b = jax.random.normal(k2, (n, n), jnp.bfloat16)
    product = jax.jit(lambda x, y: x @ y)
    for _ in range(3):
        product(a, b).block_until_ready()
    started = time.perf_counter()
    for _ in range(repeats):
        c = product(a, b)
    c.block_until_ready()
    report(**found, tflops=2 * n**3 * repeats / (time.perf_counter() - started) / 1e12, size=n)


def steps(args) -> None:
    import keras
    from jax_train_throughput import build_model, synthetic_rows, time_fit

    settings = SETTINGS[args.shape]
    keras.config.set_dtype_policy("mixed_bfloat16")
    started = time.perf_counter()
    model = build_model(SHAPES[args.shape], args.sequence_length)
    batch = settings["batch_size"]
    inputs, labels = synthetic_rows(batch * settings["steps"], args.sequence_length)
    seconds = time_fit(model, inputs, labels, batch, settings["warmup"])
    report(
        sequences_per_second=settings["steps"] * settings["batch_size"] / seconds,
        step_ms=1000 * seconds / settings["steps"],
        steps=settings["steps"],
        batch_size=settings["batch_size"],
        sequence_length=args.sequence_length,
        build_and_warmup_seconds=time.perf_counter() - started - seconds,
    )


def checkpoint(args) -> None:
    import json

    from safetensors.numpy import save_file

    from bertkit.testing import random_bert_state

    tokenizer, out = Path(args.tokenizer), Path(args.out)
    vocabulary = (tokenizer / "vocab.txt").read_text(encoding="utf-8").splitlines()
    config = {
        "model_type": "bert",
        "architectures": ["BertModel"],
        "hidden_act": "gelu",
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        **hf_config(args.shape, len(vocabulary)),
    }
    out.mkdir(parents=True, exist_ok=True)
    save_file(random_bert_state(config), str(out / "model.safetensors"))
    copy_tokenizer(tokenizer, out)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    report(
        writer="numpy", vocabulary_size=len(vocabulary), files=sorted(p.name for p in out.iterdir())
    )


def copy_tokenizer(tokenizer: Path, out: Path) -> None:
    """The tokenizer's files beside the weights (its config.json is the model's, not copied)."""
    for file in tokenizer.iterdir():
        if file.is_file() and file.name != "config.json":
            shutil.copy(file, out / file.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("matmul").add_argument("--size", type=int, required=True)
    sub = commands.add_parser("steps")
    sub.add_argument("--shape", choices=sorted(SHAPES), required=True)
    sub.add_argument("--sequence-length", type=int, required=True)
    sub = commands.add_parser("checkpoint")
    sub.add_argument("--shape", choices=sorted(SHAPES), required=True)
    sub.add_argument("--tokenizer", required=True)
    sub.add_argument("--out", required=True)
    args = parser.parse_args()
    {"matmul": matmul, "steps": steps, "checkpoint": checkpoint}[args.command](args)


if __name__ == "__main__":
    main()
