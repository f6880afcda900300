"""What the commands' arguments share: how a command is added, whole-number types, `--set`
and the options of a job of several processes."""

from __future__ import annotations

import argparse


def add_command(commands, name: str, run, help_text: str, needs_model: bool = False, check=None):
    """Adds the subcommand `name`, run by `run(args)`, to `commands` (argparse's subparsers)
    and returns its parser. `needs_model`: TensorFlow is imported (quietly) before it runs;
    `check(args)`, run before that, refuses a bad recipe in a second instead of after the
    framework's start-up (10-20 s)."""
    sub = commands.add_parser(name, help=help_text, description=help_text)
    sub.set_defaults(run=run, needs_model=needs_model, check=check)
    return sub


def positive(text: str) -> int:
    """An argument's whole number of at least 1.

    Example:
        >>> positive("3")
        3
        >>> positive("0")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: expected a whole number of at least 1, got '0'
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def index(text: str) -> int:
    """An argument's whole number of at least 0 (digits only: no sign, no spaces)."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 0, got {text!r}")
    return int(text)


def add_set(sub) -> None:
    sub.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a recipe value, e.g. training.epochs=3 (repeatable)",
    )


def add_process_options(sub) -> None:
    group = sub.add_argument_group(
        "several processes (JAX; one command per process, the same recipe everywhere)"
    )
    _add_job_options(group)
    _add_timeout_options(group)


def _add_job_options(group) -> None:
    """Where process 0 is, how many processes there are, and which one this is."""
    group.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="process 0's address (default: $KERAS_DISTRIBUTION_JOB_ADDRESSES)",
    )
    group.add_argument(
        "--num-processes",
        type=positive,
        metavar="N",
        help="processes in the job (default: $KERAS_DISTRIBUTION_NUM_PROCESSES)",
    )
    group.add_argument(
        "--process-id",
        type=index,
        metavar="I",
        help="this process, 0 to N-1; 0 writes the run directory (default: "
        "$KERAS_DISTRIBUTION_PROCESS_ID)",
    )


def _add_timeout_options(group) -> None:
    """How long the job waits for a silent process, and for every process to start."""
    from bertkit.parallel.multi_process import (
        DEFAULT_HEARTBEAT_TIMEOUT,
        DEFAULT_STARTUP_TIMEOUT,
        STARTUP_TIMEOUT_VARIABLE,
    )

    group.add_argument(
        "--heartbeat-timeout",
        type=positive,
        metavar="SECONDS",
        default=DEFAULT_HEARTBEAT_TIMEOUT,
        help="end the job when a process is silent this long (default: "
        f"{DEFAULT_HEARTBEAT_TIMEOUT})",
    )
    group.add_argument(
        "--startup-timeout",
        type=positive,
        metavar="SECONDS",
        help="give up when not every process has started this long after this "
        f"one (default: ${STARTUP_TIMEOUT_VARIABLE}, else "
        f"{DEFAULT_STARTUP_TIMEOUT})",
    )
