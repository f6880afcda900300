"""Each process of a multi-process job runs as the child of a small parent that says, in one
line, how it ended when JAX ended it.

JAX's coordination service ends a job's processes itself when it finds one gone (process 0,
which runs the service, stopping; a process silent past the heartbeat timeout): a C++ thread
logs a fatal line and aborts the process (SIGABRT, exit status 134), and no Python code can
run first (see `bertkit.parallel.failures`). So `bertkit finetune` with several processes
runs its own command line again as a child (`supervise`), whose C and C++ log lines (JAX's,
gloo's: file descriptor 2) go to a log file while its Python messages (bertkit's lines, a
traceback) go to the terminal (`split_child_stderr`). The parent passes SIGTERM on (a
preemption, see `bertkit.training.preemption`), lets Ctrl-C reach the child as it does in a
terminal, ends with the child's status, and where JAX aborted the child prints one line
naming the log instead. The child dies with its parent (Linux: `PR_SET_PDEATHSIG`), so a
`kill -9` of the parent stops the process as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile

CHILD_LOG = "BERTKIT_JOB_PROCESS_LOG"  # set in the child: where its C++ log lines go
PARENT = "BERTKIT_JOB_PROCESS_PARENT"  # and its parent's pid (which may be 1, in a container)
_PR_SET_PDEATHSIG = 1


def supervised() -> bool:
    """True in the child `supervise` started."""
    return bool(os.environ.get(CHILD_LOG))


def supervise() -> int:
    """Runs this process's command line as a child (see the module docstring); returns the
    exit status to end with."""
    handle, log = tempfile.mkstemp(prefix="bertkit-job-process-", suffix=".log")
    os.close(handle)
    command = [sys.executable, *sys.orig_argv[1:]]  # `-m bertkit.cli ...`, the script's path...
    child = subprocess.Popen(command, env={**os.environ, CHILD_LOG: log, PARENT: str(os.getpid())})
    signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal sends it to the child too
    code = child.wait()
    if code == -signal.SIGABRT:
        print(
            "bertkit: error: JAX ended this process of the job: another process, or process "
            "0 with JAX's coordination service, stopped mid-run; run the same command on "
            f"every process again to resume (JAX's log: {log})",
            file=sys.stderr,
            flush=True,
        )
        return 2
    os.unlink(log)  # kept only where the line above names it
    return 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell says


def split_child_stderr() -> None:
    """In the child: C and C++ output on file descriptor 2 to the log file the parent named,
    Python's `sys.stderr` to the terminal still; and death with the parent."""
    with contextlib.suppress(OSError, AttributeError):  # Linux only
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if str(os.getppid()) != os.environ.get(PARENT):  # the parent was gone before the line above
        os._exit(128 + signal.SIGKILL)
    sys.stderr.flush()
    sys.stderr = os.fdopen(os.dup(2), "w", buffering=1)
    log = os.open(os.environ[CHILD_LOG], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(log, 2)
    os.close(log)
