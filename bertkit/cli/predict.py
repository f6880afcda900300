"""`bertkit predict RUN_DIR`: predictions on raw inputs, one JSON line each, streamed.

The inputs are read by `bertkit.tabular.prediction_inputs`, answered by
`FineTunedModel.predict_stream`; the run's task may add flags of its own
(`Task.predict_options`, e.g. classification's `--top-k`), checked before the model loads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from bertkit.cli.arguments import add_command, positive
from bertkit.cli.output import atomic_output
from bertkit.errors import UserError
from bertkit.files import MAX_INPUT_CHARACTERS
from bertkit.serving.protocol import finite


def add_to(commands) -> None:
    sub = add_command(
        commands, "predict", run, "predict on raw inputs; JSON lines out", needs_model=True
    )
    sub.epilog = (
        "The run's task may add options of its own: classification's --top-k K adds "
        "the K most probable labels as 'top_k' ('bertkit tasks' lists them)."
    )
    sub.set_defaults(task_arguments=[])
    sub.add_argument("run_dir", help="a run directory of `bertkit finetune`")
    _add_input_options(sub)
    _add_size_options(sub)
    _add_output_options(sub)


def _add_input_options(sub) -> None:
    """Where the inputs come from, and how a file's texts are found."""
    sub.add_argument(
        "--input",
        metavar="FILE",
        default="-",
        help="one input per line: plain text or JSON; '-' reads stdin (default)",
    )
    sub.add_argument(
        "--column",
        metavar="NAME",
        help="read the text from this column of a TSV, CSV or JSON-lines file "
        "(one output per data row; the header and other columns are not "
        "predicted)",
    )
    sub.add_argument(
        "--pair-column", metavar="NAME", help="with --column: the second text of pair tasks"
    )
    sub.add_argument(
        "--format",
        choices=("auto", "tsv", "csv", "jsonl"),
        default="auto",
        help="with --column: the file format (default: from the file name; required for stdin)",
    )


def _add_size_options(sub) -> None:
    """How many inputs go into one model call, and how long an input may be."""
    sub.add_argument(
        "--batch-size",
        type=positive,
        metavar="N",
        help="inputs per model call (default: twice the training batch size)",
    )
    sub.add_argument(
        "--max-input-characters",
        type=positive,
        metavar="N",
        default=MAX_INPUT_CHARACTERS,
        help="a longer input (all its texts together) gets an error object "
        f"(default: {MAX_INPUT_CHARACTERS:,})",
    )


def _add_output_options(sub) -> None:
    """Where the JSON lines go."""
    sub.add_argument(
        "--output",
        metavar="FILE",
        help="write the JSON lines to FILE (replaced only when all inputs are "
        "done) instead of stdout",
    )
    sub.add_argument("--overwrite", action="store_true", help="replace an existing --output")


def take_task_flags(sub, flags) -> None:
    """Declares `flags` (long flags no parser here knows: the run's task's) as taking one
    value each, collected in order as `args.task_arguments` for `task_option_values`."""
    for flag in dict.fromkeys(flags):
        sub.add_argument(
            flag,
            nargs="?",
            const=[flag],
            action="append",
            dest="task_arguments",
            type=lambda value, flag=flag: [flag, value],
            help=argparse.SUPPRESS,
        )


def run(args) -> None:
    import bertkit
    from bertkit.progress import CountProgress
    from bertkit.tabular import prediction_inputs

    _check_flags(args)
    task_values = task_option_values(args.run_dir, args.task_arguments)
    inputs = prediction_inputs(
        args.input, column=args.column, pair_column=args.pair_column, file_format=args.format
    )
    model = bertkit.load(args.run_dir)
    if args.column and not args.pair_column and model.takes_text_pairs:
        raise UserError(
            "this model takes text pairs: --column needs --pair-column (the "
            "column of the second text)"
        )
    if args.pair_column and not model.accepts_text_pairs:
        raise UserError("this model takes single texts: --pair-column does not apply")
    batch_size = args.batch_size or 2 * model.description["batch_size"]
    progress = None  # a pipe's inputs are not counted ahead: its answers show the progress
    if isinstance(inputs, list):
        progress = CountProgress("predict", len(inputs), quiet_below=batch_size + 1).update
    predictions = model.predict_stream(
        inputs,
        batch_size,
        errors="report",
        progress=progress,
        max_input_characters=args.max_input_characters,
    )
    with atomic_output(args.output) as out:
        for prediction in predictions:
            if task_values and "error" not in prediction:
                prediction = model.task.apply_predict_options(prediction, **task_values)
            print(
                json.dumps(finite(prediction), ensure_ascii=False, allow_nan=False),
                file=out,
                flush=out is sys.stdout,
            )  # streamed: each batch as it is done


def _check_flags(args) -> None:
    """The flags' combinations, checked before anything is read."""
    if args.pair_column and not args.column:
        raise UserError("--pair-column needs --column")
    if args.output and os.path.exists(args.output) and not args.overwrite:
        raise UserError("exists; pass --overwrite to replace it", source=args.output)
    if args.column and args.input == "-" and args.format == "auto":
        raise UserError("--column on stdin needs --format tsv, csv or jsonl")


def task_option_values(run_dir, arguments: list) -> dict:
    """{keyword: value} of the run's task's `predict_options` that `arguments` (pairs of
    flag and value, as `take_task_flags` collects them) give. The task is read from the
    run's description, without loading the model; a flag it does not take is one line."""
    if not arguments:
        return {}
    task_class = run_task(run_dir)
    options = task_class.predict_options
    parser = argparse.ArgumentParser(prog="bertkit predict", add_help=False, exit_on_error=False)
    for option in options:
        parser.add_argument(
            option.flag,
            dest=option.keyword,
            type=positive,
            metavar=option.metavar,
            help=option.help,
        )
    try:
        values, unknown = parser.parse_known_args([item for pair in arguments for item in pair])
    except argparse.ArgumentError as error:  # a value that is no whole number, or none
        raise UserError(str(error)) from None
    if unknown:
        taken = ", ".join(f"{option.flag} {option.metavar}" for option in options) or "none"
        raise UserError(
            f"unknown option {unknown[0].partition('=')[0]} for a "
            f"{task_class.name} model; its task's predict options: {taken}"
        )
    return {keyword: value for keyword, value in vars(values).items() if value is not None}


def run_task(run_dir):
    """The task class a run was trained with, read from its `model/task.json` (nothing of
    the model loads)."""
    from bertkit.registry import load_task
    from bertkit.run_dir import RunDirectory, read_json

    run = RunDirectory.open(run_dir)
    description = read_json(run.task_file, "task description")
    name = description.get("task") if isinstance(description, dict) else None
    return load_task(name, source=run.task_file)
