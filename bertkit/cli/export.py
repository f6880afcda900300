"""`bertkit export RUN_DIR --out DIR`: a raw-text TensorFlow SavedModel of a run, with
`--format transformers` a Hugging Face transformers folder, with `--format onnx` an ONNX
model with its tokenizer files (`bertkit.serving.onnx_export`)."""

from __future__ import annotations

import argparse
import math

from bertkit.cli.arguments import add_command, positive
from bertkit.errors import UserError
from bertkit.files import MAX_INPUT_CHARACTERS, MAX_REQUEST_CHARACTERS


def add_to(commands) -> None:
    sub = add_command(
        commands, "export", run, "export a raw-text TensorFlow SavedModel", needs_model=True
    )
    sub.add_argument("run_dir", help="a run directory of `bertkit finetune`")
    sub.add_argument("--out", metavar="DIR", required=True, help="the folder to export into")
    sub.add_argument(
        "--format",
        choices=("savedmodel", "transformers", "onnx"),
        default="savedmodel",
        help="savedmodel (default): raw text in, decoded answers out; transformers: a "
        "Hugging Face folder (config.json, model.safetensors, tokenizer) for classification, "
        "tagging and span QA; onnx: model.onnx (token ids in, logits out) with the tokenizer "
        "files and bertkit's TensorFlow-free decoder (the onnx extra), for the same tasks",
    )
    sub.add_argument(
        "--max-input-characters",
        type=positive,
        metavar="N",
        default=MAX_INPUT_CHARACTERS,
        help="the SavedModel refuses a longer input (a row's texts together) "
        f"before tokenizing it (default: {MAX_INPUT_CHARACTERS:,})",
    )
    sub.add_argument(
        "--max-request-characters",
        type=positive,
        metavar="N",
        default=MAX_REQUEST_CHARACTERS,
        help=f"and a request whose texts are longer together (default: {MAX_REQUEST_CHARACTERS:,})",
    )
    add_quantize_options(sub)


def run(args) -> None:
    import bertkit
    from bertkit.serving.staging import finished_run

    _check_quantize_options(args)
    # An int8 export (like a transformers folder) is of a finished run only; a float one
    # also of a run killed in its finish step (trained: its weights are final), which is
    # how `finetune` exports a JAX run, from a TensorFlow child process.
    finished_run(args.run_dir, trained_will_do=not args.quantize)
    if args.format == "transformers":
        from bertkit.serving.transformers_export import export_transformers

        print(export_transformers(args.run_dir, args.out).summary)
        return
    if args.format == "onnx":
        from bertkit.serving.onnx_export import describe, export_onnx

        path = export_onnx(
            args.run_dir, args.out, quantize=args.quantize, max_metric_drop=args.max_drop
        )
        print(describe(path))
        return
    path = bertkit.load(args.run_dir).export(
        args.out,
        max_input_characters=args.max_input_characters,
        max_request_characters=args.max_request_characters,
        quantize=args.quantize,
        max_metric_drop=args.max_drop,
    )
    if args.quantize:
        from bertkit.serving.quantize import describe

        print(describe(path))
    print(f"exported {path}")


def add_quantize_options(sub) -> None:
    sub.add_argument(
        "--quantize",
        choices=("int8",),
        help="int8: quantize the model (Keras; with --format onnx, onnxruntime's dynamic "
        "quantizer), score it on the run's validation data and write it only if its metric "
        "drops at most --max-drop points (README: int8 export)",
    )
    sub.add_argument(
        "--max-drop",
        type=points,
        metavar="POINTS",
        help="points of the validation metric the int8 model may lose (default: the task's, "
        "0.5 for classification and tagging, 1.0 F1 for span QA)",
    )


def points(text: str) -> float:
    """A number of metric points: finite and at least 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a number of points of at least 0, got {text!r}")
    return value


def _check_quantize_options(args) -> None:
    if args.max_drop is not None and args.quantize is None:
        raise UserError("--max-drop applies to --quantize int8 only")
    if args.quantize and args.format == "transformers":
        raise UserError(
            "--quantize writes a SavedModel or an ONNX model; it does not apply to "
            "--format transformers"
        )
