"""ONNX float and int8 (onnxruntime) beside the float and Keras int8 SavedModels: validation
metric, size and CPU latency p50 at batch 1, on the models of `benchmarks/int8_export.py`.

Each model is fine-tuned here as in `int8_export.py` (`--epochs`, the same slices), then:
the run's float SavedModel and Keras int8 SavedModel (`model.export(..., quantize="int8",
max_metric_drop=100)`), its ONNX export (`bertkit.serving.onnx_export`) and int8 models of
it by onnxruntime's `quantize_dynamic`, one per weight type / per-channel setting. Every
model is scored on the same validation data by the task (ONNX: bertkit's featurization and
decoding over onnxruntime's logits, `bertkit.serving.onnx_int8.evaluate_onnx`).

Latency: one-sentence requests (`bertkit.serving.quantize.LATENCY_SENTENCE`), one after
another in this process, raw text in and decoded answer out (SavedModel: its signature;
ONNX: `OnnxModel.predict`, tokenizing and decoding in Python), `--rounds` rounds of
`--requests` requests, the models taking turns each round so that a change in the machine's
load touches all of them alike; p50 over all rounds. `session` is onnxruntime's model call
alone on the tokenized sentence. `uptime` is printed before and after.

    python benchmarks/onnx_export.py --only quickstart --epochs 1
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from int8_export import recipes

import bertkit
from bertkit.serving.onnx_export import export_onnx
from bertkit.serving.onnx_int8 import evaluate_onnx
from bertkit.serving.onnx_runtime import OnnxModel, padded_batch
from bertkit.serving.quantize import LATENCY_SENTENCE, folder_size

VARIANTS = [("QInt8", False), ("QUInt8", False), ("QInt8", True)]  # (weight type, per channel)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(__file__).parents[2] / "shared/data")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--conll-train", type=int, default=2000)
    parser.add_argument("--conll-dev", type=int, default=500)
    parser.add_argument("--squad-train", type=int, default=2000)
    parser.add_argument("--squad-dev", type=int, default=500)
    parser.add_argument("--only", choices=["quickstart", "conll", "squad"], action="append")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args()
    print("uptime before:", _uptime(), flush=True)
    with tempfile.TemporaryDirectory() as work:
        for name, recipe in recipes(args, Path(work)).items():
            if args.only and name not in args.only:
                continue
            rows = measure(recipe, Path(work) / name, args.rounds, args.requests)
            print(json.dumps({"model": name, "rows": rows}), flush=True)
            print_table(name, rows)
    print("uptime after:", _uptime(), flush=True)


def measure(recipe: dict, run_dir: Path, rounds: int, requests: int) -> list[dict]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    finetuned = bertkit.finetune(recipe, output_dir=run_dir, verbose=0)
    monitor = finetuned.task.monitor
    saved = {"float SavedModel": run_dir / "saved_model"}
    if not (saved["float SavedModel"] / "saved_model.pb").is_file():
        finetuned.export(saved["float SavedModel"])
    saved["Keras int8 SavedModel"] = finetuned.export(
        run_dir / "int8", quantize="int8", max_metric_drop=100
    )
    record = json.loads((run_dir / "int8/assets/bertkit.json").read_text())["quantization"]
    metrics = {
        "float SavedModel": record["float"][monitor],
        "Keras int8 SavedModel": record["int8"][monitor],
    }
    onnx_dir = export_onnx(run_dir, run_dir / "onnx")
    models = {"ONNX float": onnx_dir / "model.onnx"}
    for weight_type, per_channel in VARIANTS:
        name = f"ONNX int8 {weight_type}{' per channel' if per_channel else ''}"
        models[name] = run_dir / f"{name.replace(' ', '_')}.onnx"
        quantize_dynamic(
            str(models["ONNX float"]),
            str(models[name]),
            weight_type=getattr(QuantType, weight_type),
            per_channel=per_channel,
        )
    for name, path in models.items():
        metrics[name] = evaluate_onnx(finetuned, path)[monitor]
    callers = {name: _saved_model_call(path) for name, path in saved.items()}
    sessions = {name: _onnx_call(onnx_dir, path) for name, path in models.items()}
    callers.update({name: call for name, (call, _) in sessions.items()})
    latencies = _interleaved_p50(callers, rounds, requests)
    session_only = _interleaved_p50({n: s for n, (_, s) in sessions.items()}, rounds, requests)
    sizes = {name: folder_size(path) for name, path in saved.items()}
    sizes.update({name: path.stat().st_size for name, path in models.items()})
    base = latencies["float SavedModel"]
    return [
        {
            "model": name,
            monitor: metrics[name],
            "size_mb": round(sizes[name] / 1e6, 1),
            "p50_ms": latencies[name],
            "session_p50_ms": session_only.get(name),
            "speedup_vs_float_savedmodel": round(base / latencies[name], 2),
        }
        for name in callers
    ]


def _saved_model_call(path: Path):
    import tensorflow as tf

    serve = tf.saved_model.load(str(path)).signatures["serving_default"]
    request = {
        name: tf.constant([LATENCY_SENTENCE]) for name in serve.structured_input_signature[1]
    }
    return lambda: serve(**request)


def _onnx_call(folder: Path, model_file: Path):
    import onnxruntime

    model = OnnxModel.load(folder)
    model.session = onnxruntime.InferenceSession(
        str(model_file), providers=["CPUExecutionProvider"]
    )
    pieces = model.tokenizer.pieces([LATENCY_SENTENCE])[0]
    ids, segments = model.tokenizer.pack([pieces.ids], model.task.sequence_length)
    batch = padded_batch([ids], [segments], model.tokenizer.pad_id)
    return (lambda: model.predict([LATENCY_SENTENCE])), (lambda: model.session.run(None, batch))


def _interleaved_p50(callers: dict, rounds: int, requests: int) -> dict:
    seconds = {name: [] for name in callers}
    for call in callers.values():  # warm up
        for _ in range(5):
            call()
    for _ in range(rounds):
        for name, call in callers.items():
            for _ in range(requests):
                start = time.perf_counter()
                call()
                seconds[name].append(time.perf_counter() - start)
    return {name: round(float(np.median(values)) * 1000, 2) for name, values in seconds.items()}


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def print_table(name: str, rows: list[dict]) -> None:
    monitor = [key for key in rows[0] if key not in ("model",)][0]
    print(f"\n{name}\n")
    print(f"| model | {monitor} | size (MB) | p50 (ms) | session p50 (ms) | vs float SavedModel |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        session = "" if row["session_p50_ms"] is None else f"{row['session_p50_ms']:.2f}"
        print(
            f"| {row['model']} | {row[monitor]:.4f} | {row['size_mb']:.1f} | {row['p50_ms']:.2f} "
            f"| {session} | {row['speedup_vs_float_savedmodel']:.2f}x |"
        )


if __name__ == "__main__":
    sys.exit(main())
