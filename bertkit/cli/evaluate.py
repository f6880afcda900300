"""`bertkit evaluate RUN_DIR`: metrics of a fine-tuned model on a labelled file, printed and
written with the task's report (`FineTunedModel.evaluate`)."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

from bertkit.cli.arguments import add_command
from bertkit.errors import UserError


def add_to(commands) -> None:
    sub = add_command(
        commands,
        "evaluate",
        run,
        "evaluate a fine-tuned model on a labelled file",
        needs_model=True,
    )
    sub.add_argument("run_dir", help="a run directory of `bertkit finetune`")
    sub.add_argument("--data", metavar="FILE", help="default: the recipe's validation file")
    sub.add_argument(
        "--predictions-dir",
        metavar="DIR",
        help="where to write metrics.json, report.md, the confusion matrix and "
        "the misclassified examples (default: RUN_DIR/evaluation)",
    )


def run(args):
    import bertkit
    from bertkit.run_dir import write_json

    model = bertkit.load(args.run_dir)
    output = Path(args.predictions_dir) if args.predictions_dir else model.run.path / "evaluation"
    metrics = {}

    def evaluate_into(folder):
        metrics.update(model.evaluate(args.data, predictions_dir=folder, progress=True))
        print(model.task.format_metrics(metrics))
        if folder is not None:
            write_json(
                folder / "metrics.json", {"data": args.data or "validation", "metrics": metrics}
            )

    try:
        if args.predictions_dir and writable_folder(output):
            evaluate_into(output)
        elif not args.predictions_dir and os.access(model.run.path, os.W_OK):
            # in the run: a fresh folder replaces the old one (and any link in its place)
            model.run.replace_folder("evaluation", evaluate_into)
        else:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(output))
    except OSError as error:  # a read-only run: the metrics printed are the result
        if not metrics:
            evaluate_into(None)
        print(f"bertkit: warning: results not saved in {output}: {error.strerror}", file=sys.stderr)
        return 0
    print(f"wrote {output}")


def writable_folder(output: Path) -> bool:
    """Whether `output` is (made, if need be) a folder this user can write; a file in its
    place is a `UserError`."""
    try:
        output.mkdir(exist_ok=True, parents=True)
        return os.access(output, os.W_OK)
    except FileExistsError:
        raise UserError("exists and is not a folder", source=output) from None
    except OSError:
        return False
