"""int8 ONNX export behind the quality gate: `bertkit export RUN --format onnx --quantize int8`.

onnxruntime's dynamic quantizer (`onnxruntime.quantization.quantize_dynamic`) rewrites every
MatMul of the float `model.onnx` with 8-bit weights (`WEIGHT_TYPE`, int8, one scale per
output channel) and quantizes their inputs to uint8 per call; LayerNorms, softmax and GELU
stay float. The gate is the Keras int8 export's (`bertkit.serving.quantize.check_quality`):
the run's validation data, featurized by the task, is run through the float Keras model and
through the int8 ONNX model, and both are decoded and scored by the task (`bertkit evaluate`'s
metric); more than the budget lost is a `UserError` with both figures, and nothing is
written. The record (`quantization` in `bertkit_onnx.json`) holds the metric, size on disk and
the onnxruntime latency of the float and the int8 ONNX model.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import numpy as np

from bertkit.errors import UserError
from bertkit.serving.onnx_runtime import METADATA_FILE, MODEL_FILE, OnnxModel, latency_p50_ms
from bertkit.serving.quantize import LATENCY_SENTENCE, check_quality, metric_drop

# quantize_dynamic's weights: int8, one scale per output channel. Measured against QUInt8
# (one scale per tensor) on SST-2 (4,000 sentences, 872 dev), CoNLL-2003 (2,000/500) and
# SQuAD (2,000/500), MiniLM: accuracy 81.54 vs 80.85 (float 81.08), entity F1 70.34 vs 70.56
# (70.44), F1 20.32 vs 20.33 (21.25), and 15% faster at batch 32 on an AVX-512 VNNI CPU
# (30.8 vs 36.2 ms; float 44.3). Per tensor QInt8 lost 0.9-1.4 points (docs/export/int8.md).
WEIGHT_TYPE = "QInt8"
PER_CHANNEL = True
FLOAT_FILE = "model.float.onnx"  # in the staging folder only, for the gate and the record


def quantize_folder(finetuned, directory: Path, budget: float) -> dict:
    """Replaces the float `model.onnx` in `directory` (a staging folder) by its int8 model
    once it passes the gate (`budget` points of the task's monitor); returns the record."""
    import json

    from onnxruntime.quantization import QuantType, quantize_dynamic

    task = finetuned.task
    float_path, int8_path = directory / FLOAT_FILE, directory / MODEL_FILE
    int8_path.rename(float_path)
    with _quiet_root_logger():  # "Please consider to run pre-processing before quantization"
        quantize_dynamic(
            str(float_path),
            str(int8_path),
            weight_type=getattr(QuantType, WEIGHT_TYPE),
            per_channel=PER_CHANNEL,
        )
    before = finetuned.evaluate()[task.monitor]
    after = evaluate_onnx(finetuned, int8_path)[task.monitor]
    check_quality(task, before, after, budget)
    metadata = json.loads((directory / METADATA_FILE).read_text(encoding="utf-8"))
    record = {
        "quantization": "int8",
        "method": f"onnxruntime quantize_dynamic ({WEIGHT_TYPE} weights, per channel: "
        f"{PER_CHANNEL}; uint8 activations)",
        "monitor": task.monitor,
        "budget_points": budget,
        "drop_points": round(metric_drop(task, before, after), 4),
        "float": {task.monitor: before, **_measured(directory, float_path)},
        "int8": {task.monitor: after, **_measured(directory, int8_path)},
        "latency_requests": 200,
    }
    float_path.unlink()
    text = json.dumps({**metadata, "quantization": record}, indent=2)
    (directory / METADATA_FILE).write_text(text, encoding="utf-8")
    return record


@contextlib.contextmanager
def _quiet_root_logger():
    logger = logging.getLogger()
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _measured(directory: Path, model_file: Path) -> dict:
    """Size of the model file and the p50 latency of one-sentence predictions through
    `OnnxModel` (tokenizing and decoding included, as the SavedModel's are)."""
    import onnxruntime

    model = OnnxModel.load(directory)
    model.session = onnxruntime.InferenceSession(
        str(model_file), providers=["CPUExecutionProvider"]
    )
    return {
        "size_bytes": model_file.stat().st_size,
        "latency_p50_ms": latency_p50_ms(model, LATENCY_SENTENCE),
    }


def evaluate_onnx(finetuned, model_file) -> dict:
    """The task's metrics of the ONNX model at `model_file` on the run's validation data,
    featurized and decoded by bertkit's task exactly as `FineTunedModel.evaluate` does."""
    import onnxruntime

    from bertkit.serving.inference import model_inputs

    task = finetuned.task
    named = task.data.validation or task.data.test
    if named is None:
        raise UserError("the run has no validation data to score the int8 model on")
    key = "data.validation" if task.data.validation else "data.test"
    examples = task.read(str(finetuned.run.data_file(named, key)))
    features = task.featurize(examples, training=False)
    session = onnxruntime.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    outputs: dict = {}
    lengths = features.lengths()
    batch_size = 2 * finetuned.description["batch_size"]
    for rows, batch, inputs in model_inputs(task, features, batch_size, finetuned.buckets):
        feed = {name: np.asarray(inputs[name], np.int32) for name in inputs}
        (logits,) = session.run(None, feed)
        batch = {name: values[: len(rows)] for name, values in batch.items()}  # no filler rows
        kept = task.reduce_outputs(batch, {"logits": logits[: len(rows)]})
        for name, values in kept.items():
            per_row = outputs.setdefault(name, [None] * len(features))
            for j, row in enumerate(rows):
                sequence = name in task.sequence_outputs
                per_row[row] = values[j, : lengths[row]] if sequence else values[j]
    return task.evaluate(examples, task.decode(examples, features, outputs))
