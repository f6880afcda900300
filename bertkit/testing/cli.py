"""The `bertkit` command run inside the test's own process.

A `bertkit` subprocess imports TensorFlow and Keras again (5-9 s of a 2-core machine's CPU
each time); run in-process, a command costs only its own work. The command's standard
streams are files for the call's duration, so what it prints is returned as a subprocess
returns it. Tests that are about the process itself (its exit, its start-up output, pipes,
signals, another backend) still start a real `bertkit`.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import traceback


def run_bertkit(*args, cwd=None, input: str | bytes | None = None) -> subprocess.CompletedProcess:
    """Runs `bertkit ARGS` in this process, in `cwd`, with `input` (text, or bytes as they
    are) as its standard input.

    Returns what `subprocess.run(..., capture_output=True, text=True)` would: the exit
    status (as `bertkit` exits: 2 for a user error; 1 and the traceback on stderr for an
    unexpected exception) and the text written to stdout and stderr.

    Example:
        >>> result = run_bertkit("tasks")
        >>> result.returncode, "classification" in result.stdout
        (0, True)
    """
    from bertkit.cli import main

    argv = [str(arg) for arg in args]
    with tempfile.TemporaryDirectory(prefix="bertkit-cli-") as folder:
        streams = {name: os.path.join(folder, name) for name in ("stdin", "stdout", "stderr")}
        with open(streams["stdin"], "wb") as stdin:
            stdin.write(input if isinstance(input, bytes) else (input or "").encode("utf-8"))
        with _standard_streams(streams), _working_directory(cwd):
            code = _exit_status(main, argv)
        with (
            open(streams["stdout"], encoding="utf-8") as out,
            open(streams["stderr"], encoding="utf-8") as err,
        ):
            return subprocess.CompletedProcess(["bertkit", *argv], code, out.read(), err.read())


def _exit_status(main, argv) -> int:
    """`main(argv)`'s status, with argparse's exits and unexpected exceptions as a process
    ends with them."""
    try:
        return main(argv)
    except SystemExit as exit:
        return exit.code if isinstance(exit.code, int) else 1
    except Exception:
        traceback.print_exc()
        return 1


@contextlib.contextmanager
def _standard_streams(paths: dict):
    """sys.stdin/stdout/stderr replaced by the files at `paths` (real files: the command
    asks them for `fileno()` and `buffer`)."""
    saved = sys.stdin, sys.stdout, sys.stderr
    with contextlib.ExitStack() as files:
        sys.stdin = files.enter_context(open(paths["stdin"], encoding="utf-8"))
        sys.stdout = files.enter_context(open(paths["stdout"], "w", encoding="utf-8"))
        sys.stderr = files.enter_context(open(paths["stderr"], "w", encoding="utf-8"))
        try:
            yield
        finally:
            sys.stdin, sys.stdout, sys.stderr = saved


@contextlib.contextmanager
def _working_directory(path):
    before = os.getcwd()
    if path is not None:
        os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)
