"""The `bertkit` command: a thin layer over the Python API.

Every user error prints one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import json
import math
import os
import signal
import stat
import sys
from pathlib import Path

from bertkit.errors import UserError

EXIT_USER_ERROR = 2
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # 141, as a shell reports a filter that SIGPIPE ended
_ENVIRONMENT_ERRORS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT}
_MODEL_COMMANDS = {"finetune", "featurize", "evaluate", "predict", "export"}


def _import_tensorflow_quietly() -> None:
    """Imports TensorFlow with the C++ start-up chatter (CUDA probing, oneDNN notices) hidden.

    TensorFlow logs those lines from C++ before `TF_CPP_MIN_LOG_LEVEL` takes effect; on a
    terminal they bury the one line a user error prints. Only the import is silenced.
    On the JAX backend too: keras-hub imports TensorFlow wherever it is installed.
    """
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            try:
                import tensorflow  # noqa: F401
            except ImportError:
                pass  # reported where TensorFlow is used
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def main(argv=None) -> int:
    # The command's own process: TensorFlow's C++ info lines would bury its one-line errors.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "needs_model", False):
            _import_tensorflow_quietly()
        return args.run(args) or 0
    except UserError as error:
        print(f"bertkit: error: {error}", file=sys.stderr)
        return EXIT_USER_ERROR
    except BrokenPipeError:
        # The reader left (`bertkit predict RUN | head -1`): end quietly, as Unix filters do.
        # Output still buffered goes to /dev/null, not into a second error at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except OSError as error:
        if error.errno not in _ENVIRONMENT_ERRORS:
            raise
        # A folder the user cannot write, a full disk: theirs to fix, so one line too.
        where = f"{error.filename}: " if error.filename else ""
        print(f"bertkit: error: {where}{error.strerror}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("bertkit: interrupted; run the same command again to resume", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    from bertkit import __version__
    from bertkit.files import MAX_INPUT_CHARACTERS

    parser = argparse.ArgumentParser(prog="bertkit", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"bertkit {__version__}")
    parser.set_defaults(run=lambda args: parser.print_help())
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    def command(name, run, help_text):
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(run=run, needs_model=name in _MODEL_COMMANDS)
        return sub

    sub = command("finetune", _finetune, "fine-tune the model a recipe describes")
    sub.add_argument("recipe", help="recipe YAML file")
    _add_set(sub)
    sub.add_argument("--output", metavar="DIR", help="run directory (replaces output_dir)")
    sub.add_argument("--overwrite", action="store_true", help="replace a finished run")
    sub.add_argument("--features", metavar="FILE",
                     help="train from a file written by 'bertkit featurize' (no TensorFlow "
                          "needed, e.g. KERAS_BACKEND=jax)")
    _add_process_options(sub)

    sub = command("featurize", _featurize, "tokenize a recipe's data once into a features file")
    sub.add_argument("recipe")
    _add_set(sub)
    sub.add_argument("--out", metavar="FILE", help="default: <output_dir>.features.npz")

    sub = command("check", _check, "validate a recipe and print it fully resolved")
    sub.add_argument("recipe")
    _add_set(sub)

    command("schema", _schema, "print the JSON Schema of recipes")
    command("tasks", _tasks, "list the installed task plugins")

    sub = command("evaluate", _evaluate, "evaluate a fine-tuned model on a labelled file")
    sub.add_argument("run_dir")
    sub.add_argument("--data", metavar="FILE", help="default: the recipe's validation file")
    sub.add_argument("--predictions-dir", metavar="DIR",
                     help="where to write metrics.json, report.md, the confusion matrix and "
                          "the misclassified examples (default: RUN_DIR/evaluation)")

    sub = command("predict", _predict, "predict on raw inputs; JSON lines out")
    sub.add_argument("run_dir")
    sub.add_argument("--input", metavar="FILE", default="-",
                     help="one input per line: plain text or JSON; '-' reads stdin (default)")
    sub.add_argument("--column", metavar="NAME",
                     help="read the text from this column of a TSV, CSV or JSON-lines file "
                          "(one output per data row; the header and other columns are not "
                          "predicted)")
    sub.add_argument("--pair-column", metavar="NAME",
                     help="with --column: the second text of pair tasks")
    sub.add_argument("--format", choices=("auto", "tsv", "csv", "jsonl"), default="auto",
                     help="with --column: the file format (default: from the file name; "
                          "required for stdin)")
    sub.add_argument("--batch-size", type=_positive, metavar="N",
                     help="inputs per model call (default: twice the training batch size)")
    sub.add_argument("--top-k", type=_positive, metavar="K",
                     help="classification: add the K most probable labels as 'top_k'")
    sub.add_argument("--max-input-characters", type=_positive, metavar="N",
                     default=MAX_INPUT_CHARACTERS,
                     help="a longer input (all its texts together) gets an error object "
                          f"(default: {MAX_INPUT_CHARACTERS:,})")
    sub.add_argument("--output", metavar="FILE",
                     help="write the JSON lines to FILE (replaced only when all inputs are "
                          "done) instead of stdout")
    sub.add_argument("--overwrite", action="store_true", help="replace an existing --output")

    sub = command("tune", _tune, "hyperparameter search over a recipe's search: section")
    sub.add_argument("recipe")
    _add_set(sub)
    sub.add_argument("--trials", type=_positive, metavar="N",
                     help="finished trials to reach (default: search.trials)")
    sub.add_argument("--timeout", type=_positive, metavar="SECONDS",
                     help="start no trial after this many seconds (default: search.timeout)")
    sub.add_argument("--storage", metavar="URL",
                     help="Optuna RDB storage shared by workers, e.g. postgresql://host/db "
                          "(default: sqlite:///STUDY_FOLDER/study.db)")
    sub.add_argument("--study", metavar="NAME",
                     help="study name (default: output_dir's name; with --storage, plus a "
                          "hash of the study folder's path)")
    sub.add_argument("--output", metavar="DIR", help="study folder (default: <output_dir>.study)")
    sub.add_argument("--heartbeat", type=_positive, default=60, metavar="SECONDS",
                     help="how often a worker marks its trial alive; a trial silent for twice "
                          "as long is failed and run again (default: 60)")
    sub.add_argument("--report", action="store_true",
                     help="only write the study's report (report.md and plots)")

    sub = command("export", _export, "export a raw-text TensorFlow SavedModel")
    sub.add_argument("run_dir")
    sub.add_argument("--out", metavar="DIR", required=True)
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def _add_set(sub):
    sub.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a recipe value, e.g. training.epochs=3 (repeatable)")


def _add_process_options(sub):
    from bertkit.parallel.multi_process import (
        DEFAULT_HEARTBEAT_TIMEOUT,
        DEFAULT_STARTUP_TIMEOUT,
        STARTUP_TIMEOUT_VARIABLE,
    )

    group = sub.add_argument_group(
        "several processes (JAX; one command per process, the same recipe everywhere)")
    group.add_argument("--coordinator", metavar="HOST:PORT",
                       help="process 0's address (default: $KERAS_DISTRIBUTION_JOB_ADDRESSES)")
    group.add_argument("--num-processes", type=_positive, metavar="N",
                       help="processes in the job (default: $KERAS_DISTRIBUTION_NUM_PROCESSES)")
    group.add_argument("--process-id", type=_index, metavar="I",
                       help="this process, 0 to N-1; 0 writes the run directory (default: "
                            "$KERAS_DISTRIBUTION_PROCESS_ID)")
    group.add_argument("--heartbeat-timeout", type=_positive, metavar="SECONDS",
                       default=DEFAULT_HEARTBEAT_TIMEOUT,
                       help="end the job when a process is silent this long (default: "
                            f"{DEFAULT_HEARTBEAT_TIMEOUT})")
    group.add_argument("--startup-timeout", type=_positive, metavar="SECONDS",
                       help="give up when not every process has started this long after this "
                            f"one (default: ${STARTUP_TIMEOUT_VARIABLE}, else "
                            f"{DEFAULT_STARTUP_TIMEOUT})")


def _index(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 0, got {text!r}")
    return int(text)


def _finetune(args):
    import bertkit
    from bertkit.parallel.multi_process import start_processes, writes_run_directory

    start_processes(args.coordinator, args.num_processes, args.process_id,
                    args.heartbeat_timeout, args.startup_timeout)  # before anything is built
    model = bertkit.finetune(args.recipe, overrides=args.overrides, output_dir=args.output,
                             overwrite=args.overwrite, features=args.features)
    if writes_run_directory():
        exported = ", saved_model/" if model.run.saved_model_dir.is_dir() else ""
        print(f"run written to {model.run.path} (report.md, model card README.md{exported})")


def _featurize(args):
    from bertkit.training.trainer import featurize

    featurize(args.recipe, args.out, overrides=args.overrides)


def _check(args):
    from bertkit.recipes.recipe import check_inputs, load_recipe

    recipe = load_recipe(args.recipe, args.overrides)
    check_inputs(recipe)  # "will this run start?": its files exist
    if recipe.search is not None:
        from bertkit.tuning.tuner import check_search

        check_search(recipe)  # and will its search: a validation split to score trials on
    print(recipe.to_yaml(), end="")


def _schema(args):
    from bertkit.recipes.recipe import recipe_json_schema

    print(json.dumps(recipe_json_schema(), indent=2))


def _tasks(args):
    from bertkit.registry import describe_tasks

    for info in describe_tasks():
        if info.error:
            print(f"{info.name:16} FAILED TO LOAD ({info.entry_point}, from {info.distribution}): "
                  f"{info.error}")
        else:
            print(f"{info.name:16} {info.description}  [{info.distribution}]")


def _evaluate(args):
    import bertkit
    from bertkit.run_dir import write_json

    model = bertkit.load(args.run_dir)
    output = Path(args.predictions_dir) if args.predictions_dir else model.run.path / "evaluation"
    metrics = {}

    def evaluate_into(folder):
        metrics.update(model.evaluate(args.data, predictions_dir=folder, progress=True))
        print(model.task.format_metrics(metrics))
        if folder is not None:
            write_json(folder / "metrics.json", {"data": args.data or "validation",
                                                 "metrics": metrics})

    try:
        if args.predictions_dir and _writable_folder(output):
            evaluate_into(output)
        elif not args.predictions_dir and os.access(model.run.path, os.W_OK):
            # in the run: a fresh folder replaces the old one (and any link in its place)
            model.run.replace_folder("evaluation", evaluate_into)
        else:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(output))
    except OSError as error:  # a read-only run: the metrics printed are the result
        if not metrics:
            evaluate_into(None)
        print(f"bertkit: warning: results not saved in {output}: {error.strerror}",
              file=sys.stderr)
        return 0
    print(f"wrote {output}")


def _writable_folder(output: Path) -> bool:
    try:
        output.mkdir(exist_ok=True, parents=True)
        return os.access(output, os.W_OK)
    except FileExistsError:
        raise UserError("exists and is not a folder", source=output) from None
    except OSError:
        return False


def _predict(args):
    import bertkit
    from bertkit.progress import CountProgress

    if args.pair_column and not args.column:
        raise UserError("--pair-column needs --column")
    if args.output and os.path.exists(args.output) and not args.overwrite:
        raise UserError("exists; pass --overwrite to replace it", source=args.output)
    inputs = _predict_inputs(args)
    model = bertkit.load(args.run_dir)
    if args.column and not args.pair_column and model.takes_text_pairs:
        raise UserError("this model takes text pairs: --column needs --pair-column (the "
                        "column of the second text)")
    batch_size = args.batch_size or 2 * model.description["batch_size"]
    progress = None  # a pipe's inputs are not counted ahead: its answers show the progress
    if isinstance(inputs, list):
        progress = CountProgress("predict", len(inputs), quiet_below=batch_size + 1).update
    predictions = model.predict_stream(inputs, batch_size, errors="report", progress=progress,
                                       max_input_characters=args.max_input_characters)
    with _output(args.output) as out:
        for prediction in predictions:
            if args.top_k and "error" not in prediction:
                prediction = _with_top_k(prediction, args.top_k)
            print(json.dumps(_finite(prediction), ensure_ascii=False, allow_nan=False),
                  file=out, flush=out is sys.stdout)  # streamed: each batch as it is done


@contextlib.contextmanager
def _output(path):
    """stdout, or a file that replaces `path` only when every input is done."""
    if path is None:
        yield sys.stdout
        return
    target = Path(path)
    temporary = target.with_name(f".{target.name}.partial")
    try:
        with open(temporary, "w", encoding="utf-8") as file:
            yield file
        os.replace(temporary, target)
    except FileNotFoundError:
        raise UserError("folder not found", source=path) from None
    except IsADirectoryError:
        raise UserError("is a folder", source=path) from None
    finally:
        temporary.unlink(missing_ok=True)


def _with_top_k(prediction: dict, k: int) -> dict:
    probabilities = prediction.get("probabilities")
    if not isinstance(probabilities, dict):
        raise UserError("--top-k needs a classification model (predictions with "
                        "'probabilities')")
    ranked = sorted(probabilities.items(), key=lambda item: -item[1])[:k]
    return {**prediction, "top_k": [{"label": label, "score": score} for label, score in ranked]}


def _predict_inputs(args):
    """A file's inputs as a list, read whole before the model loads (their errors come
    fast); a pipe's or a terminal's as an iterator, predicted as they arrive."""
    from bertkit.files import predict_inputs
    from bertkit.tabular import column_inputs

    if args.column and args.input == "-" and args.format == "auto":
        raise UserError("--column on stdin needs --format tsv, csv or jsonl")
    if args.column:
        inputs = column_inputs(args.input, args.format, args.column, args.pair_column)
    else:
        inputs = predict_inputs(args.input)
    return inputs if _arrives_over_time(args.input) else list(inputs)


def _arrives_over_time(path: str) -> bool:
    """Whether the input is a pipe, a terminal or a socket (`tail -f log | bertkit predict`)."""
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode if path == "-" else os.stat(path).st_mode
    except (OSError, ValueError, AttributeError):  # missing, or no stdin: reading says so
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode)


def _finite(value):
    """JSON has no NaN or infinity: a diverged model's scores are printed as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def _tune(args):
    from bertkit.tuning import tuner as tuning

    place = {"storage": args.storage, "study_name": args.study, "output_dir": args.output,
             "overrides": args.overrides}
    if args.report:
        tuning.report(args.recipe, **place)
        return
    tuning.require_optuna()  # a missing extra and a bad recipe answer before TensorFlow loads
    tuning.check_search(tuning.load_search_recipe(args.recipe, args.overrides))
    _import_tensorflow_quietly()
    tuning.tune(args.recipe, trials=args.trials, timeout=args.timeout,
                heartbeat_seconds=args.heartbeat, **place)


def _export(args):
    import bertkit

    path = bertkit.load(args.run_dir).export(args.out)
    print(f"exported {path}")


def run() -> None:
    """The `bertkit` command: `main`, then an exit that skips the interpreter's teardown.

    With TensorFlow loaded, tearing the interpreter down (freeing every module, TensorFlow's
    thread pools and static objects) took 1.4-1.5 s after a finished run of a tiny model
    (more for a real one, on a busy 2-core machine). Everything the command writes is closed
    by then, so the exit handlers Python registered (temporary files, log handlers) run and
    the process ends. An unexpected exception still ends the usual way, with its traceback.
    """
    code = main()
    atexit._run_exitfuncs()  # no public API runs them; os._exit alone would skip them
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
