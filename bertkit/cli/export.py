"""`bertkit export RUN_DIR --out DIR`: a raw-text TensorFlow SavedModel of a run, or with
`--format transformers` a Hugging Face transformers folder."""

from __future__ import annotations

from bertkit.cli.arguments import add_command, positive
from bertkit.files import MAX_INPUT_CHARACTERS, MAX_REQUEST_CHARACTERS


def add_to(commands) -> None:
    sub = add_command(
        commands, "export", run, "export a raw-text TensorFlow SavedModel", needs_model=True
    )
    sub.add_argument("run_dir")
    sub.add_argument("--out", metavar="DIR", required=True)
    sub.add_argument(
        "--format",
        choices=("savedmodel", "transformers"),
        default="savedmodel",
        help="savedmodel (default): raw text in, decoded answers out; transformers: a "
        "Hugging Face folder (config.json, model.safetensors, tokenizer) for classification, "
        "tagging and span QA",
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


def run(args) -> None:
    import bertkit

    if args.format == "transformers":
        from bertkit.serving.transformers_export import export_transformers

        print(export_transformers(args.run_dir, args.out).summary)
        return
    path = bertkit.load(args.run_dir).export(
        args.out,
        max_input_characters=args.max_input_characters,
        max_request_characters=args.max_request_characters,
    )
    print(f"exported {path}")
