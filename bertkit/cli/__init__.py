"""The `bertkit` command: a thin layer over the Python API.

Every user error prints one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import atexit
import errno
import os
import signal
import sys

from bertkit.cli import (
    check,
    embed,
    evaluate,
    export,
    featurize,
    finetune,
    predict,
    schema,
    serve,
    tasks,
    tune,
)
from bertkit.cli.quiet_import import import_tensorflow_quietly as _import_tensorflow_quietly
from bertkit.errors import UserError
from bertkit.training.preemption import EXIT_PREEMPTED, Preempted

EXIT_USER_ERROR = 2
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # 141, as a shell reports a filter that SIGPIPE ended
_ENVIRONMENT_ERRORS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT}
# In the order `bertkit --help` lists them.
_COMMANDS = (
    finetune,
    featurize,
    check,
    schema,
    tasks,
    evaluate,
    predict,
    embed,
    serve,
    tune,
    export,
)


def main(argv=None) -> int:
    # The command's own process: TensorFlow's C++ info lines would bury its one-line errors.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    args = _parse(argv)
    try:
        if getattr(args, "check", None):  # the recipe, before a job starts or TensorFlow loads
            args.check(args)
        if argv is None and _runs_a_job_process(args):  # the command line, not a test's call
            from bertkit.parallel.supervisor import supervise

            return supervise()
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
    except Preempted as stopped:  # SIGTERM: the run saved where it stopped (143, as a shell has it)
        print(f"bertkit: {stopped}; run the same command again to resume", file=sys.stderr)
        return EXIT_PREEMPTED


def _parser(task_flags=()) -> argparse.ArgumentParser:
    """The whole command line: each command module adds its subcommand; `task_flags` are
    flags of the run's task that `predict` is to take (see `_parse`)."""
    from bertkit import __version__

    parser = argparse.ArgumentParser(prog="bertkit", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"bertkit {__version__}")
    parser.set_defaults(run=lambda args: parser.print_help())
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    for command in _COMMANDS:
        command.add_to(commands)
    predict.take_task_flags(commands.choices["predict"], task_flags)
    return parser


def _parse(argv) -> argparse.Namespace:
    """The command's arguments, as `parse_args` gives them, and its error for any left over.

    `predict` also takes the flags of its run's task (`--top-k`), unknown to the parser
    until that task is read. Each takes one value, so the line is parsed again with them
    so declared (in `predict --top-k 3 RUN_DIR`, 3 is not the run directory), and
    `predict.run` checks them against the task before the model loads.
    """
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and hasattr(args, "task_arguments"):
        parser = _parser(
            task_flags=[
                item.partition("=")[0]
                for item in unknown
                if item.startswith("--") and len(item) > 2
            ]
        )
        args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")  # as parse_args says it
    return args


def _runs_a_job_process(args) -> bool:
    """Whether this command is one process of a multi-process job, not yet run as the child
    that `bertkit.parallel.supervisor` starts."""
    from bertkit.parallel.multi_process import job_requested
    from bertkit.parallel.supervisor import supervised

    if not hasattr(args, "num_processes") or supervised():
        return False
    return job_requested(args.coordinator, args.num_processes, args.process_id)


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
