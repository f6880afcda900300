"""`bertkit export RUN --format onnx [--quantize int8]`: the run's Keras model as ONNX.

The folder holds `model.onnx` (inputs `token_ids`, `segment_ids`, `padding_mask`, int32
`[batch, sequence]` with both axes dynamic; output `logits`: `[batch, labels]` for
classification, `[batch, sequence, labels]` for tagging, `[batch, sequence, 2]` (start, end)
for span QA), bertkit's tokenizer files (`vocab.txt`, `tokenizer.json`) and
`bertkit_onnx.json`: the opset, the task as the run saved it (options, labels, sequence length,
decoding settings, span QA's tuned threshold) and, for int8, the gate's record.
`bertkit.serving.onnx_runtime.OnnxModel` serves it without TensorFlow. The folder is written
into a staging folder and renamed into place (`bertkit.serving.staging`).

The conversion is Keras' own `model.export(format="onnx")` (tf2onnx over the traced model),
with one addition: Keras' exact GELU is TensorFlow's `Erfc`, which tf2onnx 1.17 cannot
convert ("Unsupported ops: Erfc"); a handler writes it as `1 - Erf(x)` (ONNX has `Erf`),
registered with tf2onnx the first time an export runs. The written model is loaded back in
onnxruntime and must give the Keras model's logits on probe rows.

int8 (`--quantize int8`): onnxruntime's dynamic quantizer (`bertkit.serving.onnx_int8`:
8-bit weights per tensor, activations quantized per call to uint8), through the gate of the
Keras int8 export (`bertkit.serving.quantize`): the run's validation data is featurized by the task,
run through the float Keras model and through the int8 ONNX model and decoded and scored by
the task; over the budget, one line and nothing written.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path

import numpy as np

from bertkit.errors import UserError
from bertkit.run_dir import read_json
from bertkit.serving.onnx_runtime import INPUT_NAMES, METADATA_FILE, MODEL_FILE, TASKS
from bertkit.serving.staging import finished_run, new_export_folder, staging_folder

OPSET = 17
PACKAGES = ("tf2onnx", "onnx", "onnxruntime", "tokenizers")


def check_onnx_packages() -> None:
    """A `UserError` naming the `onnx` extra when one of its packages is missing."""
    missing = [name for name in PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(
            f"--format onnx needs the onnx extra (missing: {', '.join(missing)}): "
            "pip install 'bertkit[onnx]'"
        )


def export_onnx(run_dir, directory, *, quantize=None, max_metric_drop=None) -> Path:
    """Writes a finished run's model into `directory` (new or empty) as an ONNX folder (see
    the module docstring); `quantize="int8"`: an int8 model behind the quality gate.

    Raises:
        UserError: a package of the extra is missing, the run is not finished, the task
            has no ONNX decoder (MLM, embedding), `directory` is a file or holds files,
            the weights are not finite, or the int8 model is over the budget.
    """
    from bertkit.serving.export import check_finite_weights
    from bertkit.serving.finetuned import FineTunedModel
    from bertkit.serving.quantize import quality_budget

    check_onnx_packages()
    run = finished_run(run_dir, trained_will_do=not quantize)
    directory = new_export_folder(directory)
    description = read_json(run.task_file, "task description")
    if description["task"] not in TASKS:
        raise UserError(
            f"a {description['task']} model has no ONNX export (bertkit decodes ONNX logits "
            f"for {', '.join(TASKS)}); export it as a SavedModel (without --format)",
            source=run.path,
        )
    if quantize not in (None, "int8"):
        raise UserError(f"unknown quantization {quantize!r}; available: int8", key="quantize")
    model = FineTunedModel.load(run.path)
    budget = quality_budget(model.task, max_metric_drop) if quantize else None
    check_finite_weights(model.model, run.weights_file)
    with staging_folder(directory, "the ONNX model") as staging:
        write_onnx_folder(model, staging)
        if quantize:
            from bertkit.serving.onnx_int8 import quantize_folder

            quantize_folder(model, staging, budget)
    return directory


def write_onnx_folder(model, directory: Path) -> None:
    """`model.onnx`, the tokenizer files and `bertkit_onnx.json` of a `FineTunedModel`."""
    convert(model.model, directory / MODEL_FILE)
    verify_onnx(model.model, directory / MODEL_FILE, model.task.tokenizer.vocabulary_size)
    model.task.tokenizer.save(directory)  # vocab.txt, tokenizer.json
    write_metadata(directory, metadata(model))


def metadata(model) -> dict:
    """`bertkit_onnx.json` of a float export."""
    import tf2onnx

    task = model.task
    return {
        "format": "onnx",
        "opset": OPSET,
        "producer": f"tf2onnx {tf2onnx.__version__} (keras model.export)",
        "model_file": MODEL_FILE,
        "inputs": {name: "int32 [batch, sequence]" for name in INPUT_NAMES},
        "outputs": {"logits": _logits_shape(task.name)},
        "run": model.run.path.name,
        "lora": "merged into the weights" if model.description.get("lora") else None,
        "task": {key: model.description[key] for key in ("task", "options", "data", "state")}
        | {"sequence_length": task.sequence_length},
        "quantization": None,
    }


def write_metadata(directory: Path, values: dict) -> None:
    (directory / METADATA_FILE).write_text(json.dumps(values, indent=2), encoding="utf-8")


def _logits_shape(task_name: str) -> str:
    return {
        "classification": "float32 [batch, labels]",
        "tagging": "float32 [batch, sequence, labels] (word pieces)",
        "span_qa": "float32 [batch, sequence, 2] (start, end; padding -1e9)",
    }[task_name]


def convert(keras_model, path: Path) -> None:
    """Keras' ONNX export of `keras_model` (opset `OPSET`), its output named `logits` and
    its axes `batch` and `sequence`."""
    import contextlib
    import io

    import onnx
    import tensorflow as tf

    _register_erfc()
    spec = {name: tf.TensorSpec([None, None], tf.int32, name=name) for name in INPUT_NAMES}
    with contextlib.redirect_stdout(io.StringIO()):  # tf2onnx's progress lines
        keras_model.export(
            str(path), format="onnx", input_signature=[spec], opset_version=OPSET, verbose=False
        )
    proto = onnx.load(str(path))
    _name_axes_and_output(proto.graph)
    onnx.save(proto, str(path))


def _name_axes_and_output(graph) -> None:
    (output,) = graph.output
    for node in graph.node:
        node.output[:] = ["logits" if name == output.name else name for name in node.output]
    output.name = "logits"
    for value in [*graph.input, *graph.output]:
        for position, dim in enumerate(value.type.tensor_type.shape.dim):
            if position < 2 and not dim.dim_value:
                dim.dim_param = ("batch", "sequence")[position]


@functools.cache
def _register_erfc() -> None:
    """tf2onnx's handler of TensorFlow's `Erfc` (Keras' exact GELU): `1 - Erf(x)`."""
    from tf2onnx import utils
    from tf2onnx.handler import tf_op

    class Erfc:
        @classmethod
        def version_9(cls, ctx, node, **kwargs):
            node.type = "Erf"
            dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.output[0]))
            one = ctx.make_const(utils.make_name(f"{node.name}_one"), np.array(1, dtype))
            sub = ctx.insert_new_node_on_output(
                "Sub", node.output[0], name=utils.make_name(f"{node.name}_erfc")
            )
            ctx.replace_inputs(sub, [one.output[0], node.output[0]])

    tf_op("Erfc")(Erfc)


def verify_onnx(keras_model, path: Path, vocabulary_size: int, atol: float = 1e-4) -> None:
    """The ONNX model at `path` gives `keras_model`'s logits on two probe rows of different
    lengths (random ids of its vocabulary), at every real (not padding) position."""
    import keras
    import onnxruntime

    rng = np.random.default_rng(0)
    batch = {name: np.zeros((2, 12), np.int32) for name in INPUT_NAMES}
    batch["token_ids"][:] = rng.integers(5, vocabulary_size, (2, 12))
    batch["segment_ids"][:, 6:] = 1
    batch["padding_mask"][0], batch["padding_mask"][1, :7] = 1, 1
    want = keras.ops.convert_to_numpy(keras_model(batch, training=False))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, batch)
    if want.ndim == 3:  # per token: the real positions only
        real = batch["padding_mask"].astype(bool)
        want, got = want[real], got[real]
    if got.shape != want.shape or not np.allclose(got, want, atol=atol, rtol=1e-4):
        raise RuntimeError(f"the ONNX model in {path.parent} answers differently from the run's")


def describe(directory) -> str:
    """What `bertkit export --format onnx` prints: the folder, the opset and, for int8,
    the gate's figures."""
    values = json.loads((Path(directory) / METADATA_FILE).read_text(encoding="utf-8"))
    lines = [f"exported {directory} (ONNX opset {values['opset']}, {values['task']['task']})"]
    record = values.get("quantization")
    if record:
        monitor = record["monitor"]
        lines.insert(0, f"{'':6} {monitor:>10} {'size (MB)':>10} {'p50 (ms)':>9}")
        for name in ("float", "int8"):
            row = record[name]
            lines.insert(
                -1,
                f"{name:6} {row[monitor]:>10.4f} {row['size_bytes'] / 1e6:>10.1f} "
                f"{row['latency_p50_ms']:>9.2f}",
            )
        lines.insert(-1, f"int8 within the budget of {record['budget_points']:g}: passed")
    return "\n".join(lines)
