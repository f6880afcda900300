"""How a job of several processes ends when one process cannot go on: one line, exit 2.

JAX's own endings are a Python traceback and, at exit, a C++ stack trace and SIGABRT:
when a process dies, the others' next collective fails at once (gloo: "Connection closed
by peer"), and the interpreter's exit then waits in JAX's shutdown barrier until the
coordination service declares the dead process gone (`--heartbeat-timeout`) and aborts.
Here the process says in one line what happened and ends with status 2 before that
(`os._exit`: JAX's exit handlers would wait and abort). What JAX's coordination service
ends by itself (process 0 stopping, which takes the service with it, or a peer silent
for the heartbeat timeout while this process waits outside a collective) keeps JAX's
message: its client aborts from a C++ thread, and the hook it offers for that
(`missed_heartbeat_callback` of jaxlib's `get_distributed_runtime_client`, jaxlib 0.10)
cannot call Python: the status it passes fails to convert (`std::bad_cast`, then abort).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

from bertkit.errors import UserError

# What a collective says when the process at the other end of its connection is gone.
_PEER_GONE = (
    "connection closed by peer",
    "connection reset by peer",
    "socket closed",
    "broken pipe",
)


def end_process(error: UserError):
    """Prints `error` as the CLI does (`bertkit: error: ...`) and ends this process with
    status 2, without the interpreter's exit handlers."""
    print(f"bertkit: error: {error}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(2)


@contextlib.contextmanager
def exit_after(seconds: float, error: UserError):
    """Ends the process with `error`'s one line and status 2 if the block has not ended
    after `seconds`: a timer thread, since the block waits in C++ (JAX releases the GIL)."""
    timer = threading.Timer(seconds, end_process, args=(error,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def peer_stopped(count: int, index: int) -> UserError:
    """The error of process `index` of `count` whose peer stopped: which one, as far as
    this process can tell (with two, the other one), and how to go on."""
    which = f"process {1 - index} of 2" if count == 2 else f"another of the job's {count} processes"
    return UserError(
        f"{which} stopped mid-run (its connection closed); run the same command "
        "on every process again to resume"
    )


def peer_gone(error: BaseException) -> bool:
    """Whether `error` (or an error it was raised from) says that the process at the other
    end of a collective's connection is gone."""
    while error is not None:
        text = str(error).lower()
        if any(words in text for words in _PEER_GONE):
            return True
        error = error.__cause__ or error.__context__
    return False
