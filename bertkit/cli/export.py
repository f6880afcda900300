"""`bertkit export RUN_DIR --out DIR`: a raw-text TensorFlow SavedModel of a run."""

from __future__ import annotations

from bertkit.cli.arguments import add_command


def add_to(commands) -> None:
    sub = add_command(commands, "export", run, "export a raw-text TensorFlow SavedModel",
                      needs_model=True)
    sub.add_argument("run_dir")
    sub.add_argument("--out", metavar="DIR", required=True)


def run(args) -> None:
    import bertkit

    path = bertkit.load(args.run_dir).export(args.out)
    print(f"exported {path}")
