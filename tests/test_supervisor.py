"""`bertkit.parallel.supervisor`: a job process run as the child of a parent that reports
how JAX ended it. Here the child is a small script standing in for a training process."""

import os
import signal
import subprocess
import sys
import textwrap
import time

# Runs as `python -c SCRIPT MODE`: without the child's variable it is the parent
# (`supervise`); as the child it splits its stderr and does what MODE says.
SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    from bertkit.parallel import supervisor
    if not supervisor.supervised():
        sys.exit(supervisor.supervise())
    supervisor.split_child_stderr()
    print("from Python", file=sys.stderr, flush=True)
    os.write(2, b"F1127 client.h:80] Terminating process\\n")  # as JAX's C++ logs
    if sys.argv[1] == "abort":
        os.abort()
    if sys.argv[1] == "sigterm":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(os.getpid(), flush=True)
    time.sleep(60 if sys.argv[1] in ("sigterm", "orphan") else 0)
    """
)


def start(mode: str, folder) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(folder)},  # where the logs go
    )


def test_a_process_jax_aborts_ends_with_one_line_naming_its_log(tmp_path):
    parent = start("abort", tmp_path)
    out, err = parent.communicate(timeout=60)
    assert parent.returncode == 2
    lines = err.splitlines()
    assert lines[0] == "from Python" and len(lines) == 2, err  # no C++ line, no abort trace
    assert lines[1].startswith("bertkit: error: JAX ended this process of the job: ")
    log = lines[1].rsplit("(JAX's log: ", 1)[1].rstrip(")")
    assert open(log).read() == "F1127 client.h:80] Terminating process\n"
    assert os.path.dirname(log) == str(tmp_path)


def test_a_process_that_ends_well_ends_so_and_leaves_no_log(tmp_path):
    parent = start("done", tmp_path)
    out, err = parent.communicate(timeout=60)
    assert parent.returncode == 0 and err == "from Python\n", err
    assert out.strip().isdigit() and not list(tmp_path.iterdir())


def test_sigterm_reaches_the_child_and_its_status_is_the_parents(tmp_path):
    parent = start("sigterm", tmp_path)
    int(parent.stdout.readline())  # the child runs
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=60) == 143


def test_the_child_dies_with_its_killed_parent(tmp_path):
    parent = start("orphan", tmp_path)
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError("the child outlived its parent")
