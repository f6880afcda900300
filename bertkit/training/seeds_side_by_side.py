"""`training.parallel_seeds`: the seeds of `training.seeds` trained several at once, each in
a child process on its own share of the GPUs.

Seeds are independent runs, and the small-data runs where seeds matter gain little from
data parallelism: a batch of 32 short rows does not fill one GPU. So where several GPUs
are visible, `seeds: 4` trains four seeds side by side, one GPU each
(`parallel_seeds: auto`, the default; one after another on a CPU, on one GPU, in a
job of several processes, with Python callbacks, or when the recipe asks for data
parallelism). Each seed is an ordinary `bertkit finetune` of its seed recipe
(`seeds/seed-<k>.yaml`) in a child process whose `CUDA_VISIBLE_DEVICES` names its GPUs,
its output in `seeds/seed-<k>.log`; the parent only starts them, says how each ended, and
the aggregate is written as for seeds one after another. Seeds side by side on a CPU
(`parallel_seeds: N` without GPUs) split its cores: each child may run on its own share
only, so N thread pools sized for the whole machine do not fight over it.

The parent starts no framework on a device before its children (JAX's backend and
TensorFlow's take most of each visible GPU's memory once started): the GPUs are counted
from `CUDA_VISIBLE_DEVICES` when set, else `nvidia-smi -L`, and whether this is a job of
several processes from `jax.distributed.is_initialized()`.

A SIGTERM to the parent goes to every child: each saves where it is and ends (143), then
the parent does, and the same command resumes them (a finished seed is skipped, a stopped
one resumes). A child gets SIGTERM when its parent dies (Linux), so a `kill -9` of the
parent stops the seeds the same way. A child that fails stops the others: a user error is
the parent's one line (`seed 43: ...`), a crash names the child's log.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from bertkit.errors import UserError
from bertkit.progress import say

_PR_SET_PDEATHSIG = 1
_POLL_SECONDS = 0.5
CHILD_COMMAND = [sys.executable, "-m", "bertkit.cli"]  # (tests run a wrapper of it)


def seeds_at_once(training, callbacks=None) -> int:
    """How many seeds train side by side: `training.parallel_seeds`, or for `auto` one per
    visible GPU (at most `seeds`) where nothing asks for them one after another."""
    from bertkit.parallel.multi_process import process_count

    wanted = training.parallel_seeds
    if training.seeds == 1 or wanted == 1:
        return 1
    if wanted == "auto":
        data_parallel = training.distribution in ("data_parallel", "mirrored")
        if callbacks or process_count() > 1 or data_parallel:
            return 1
        return max(1, min(len(visible_gpus()), training.seeds))
    why_not = (
        "Python callbacks cannot reach the child processes seeds run in side by side"
        if callbacks
        else "a job of several processes trains its seeds one after another"
        if process_count() > 1
        else None
    )
    if why_not:
        raise UserError(f"{why_not}; set training.parallel_seeds: 1", key="training.parallel_seeds")
    gpus = visible_gpus()
    if 0 < len(gpus) < wanted:
        raise UserError(
            f"{wanted} seeds side by side need a GPU each, and {len(gpus)} are visible; "
            f"set training.parallel_seeds to at most {len(gpus)}",
            key="training.parallel_seeds",
        )
    return min(wanted, training.seeds)


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as `CUDA_VISIBLE_DEVICES` names them (indices or
    UUIDs), found without starting TensorFlow or JAX."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        names = [name.strip() for name in listed.split(",") if name.strip()]
        return [] if names[:1] == ["-1"] else names
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    # "GPU 0: NVIDIA H100 ... (UUID: ...)", each MIG device on an indented line below its GPU
    return [line.split(":")[0].split()[1] for line in out.splitlines() if line.startswith("GPU ")]


def device_groups(gpus: list[str], width: int) -> list[str | None]:
    """Each of `width` side-by-side seeds' `CUDA_VISIBLE_DEVICES` (None on a CPU): the GPUs
    split into equal groups in order, any left over unused.

    Example:
        >>> device_groups(["0", "1", "2", "3", "4"], 2), device_groups([], 2)
        (['0,1', '2,3'], [None, None])
    """
    if not gpus:
        return [None] * width
    size = len(gpus) // width
    return [",".join(gpus[i * size : (i + 1) * size]) for i in range(width)]


def core_groups(cores: list[int], width: int) -> list[set[int]]:
    """Each of `width` side-by-side seeds' CPU cores on a machine without GPUs: `cores`
    split into equal groups in order (any left over go to the last), or one core each,
    shared in turn, where there are fewer cores than seeds.

    Example:
        >>> core_groups([0, 1, 2, 3, 4], 2), core_groups([0, 1], 3)
        ([{0, 1}, {2, 3, 4}], [{0}, {1}, {0}])
    """
    if len(cores) < width:
        return [{cores[i % len(cores)]} for i in range(width)]
    size = len(cores) // width
    groups = [set(cores[i * size : (i + 1) * size]) for i in range(width)]
    groups[-1].update(cores[width * size :])
    return groups


def train_side_by_side(seed_runs: dict, width: int, features, on_finished, on_failed=None) -> None:
    """Trains each seed of `seed_runs` (seed -> (recipe, run directory), in order) in a child
    process, `width` at a time; calls `on_finished(seed)` as each ends well. The first that
    fails on a user error raises `on_failed(seed, error)` (default: the error)."""
    gpus = visible_gpus()
    groups = device_groups(gpus, width)
    if not gpus and hasattr(os, "sched_getaffinity"):
        groups = core_groups(sorted(os.sched_getaffinity(0)), width)
    pending, running, stopping, failure = list(seed_runs), {}, [], None
    say(f"seeds {', '.join(map(str, pending))}: {min(width, len(pending))} at a time")
    folder = next(iter(seed_runs.values()))[1].path.parent
    folder.mkdir(parents=True, exist_ok=True)

    def forward_sigterm(signum, frame):
        stopping.append(signum)
        for child in running:
            child.send_signal(signal.SIGTERM)

    with _handling(signal.SIGTERM, forward_sigterm):
        try:
            while pending or running:
                free = [i for i in range(width) if i not in running.values()]
                while pending and free and not stopping and failure is None:
                    seed, slot = pending.pop(0), free.pop(0)
                    recipe, run = seed_runs[seed]
                    running[_start(seed, recipe, run, groups[slot], features, folder)] = slot
                time.sleep(_POLL_SECONDS)
                failure = _collect_ended(running, on_finished, failure)
        except KeyboardInterrupt:  # the terminal sent SIGINT to the children too
            for child in running:
                child.wait()
            raise
    if failure:
        raise _failed(*failure, folder, on_failed)
    if stopping or pending:
        from bertkit.training.preemption import Preempted

        raise Preempted(where="with the seeds side by side, each saved where it stopped")


def _collect_ended(running: dict, on_finished, failure):
    """Takes the children that have ended out of `running`: `on_finished` for each that
    ended well; the first that failed becomes the failure (seed, exit status), and SIGTERM
    stops the others. Returns the failure, if any."""
    for child in [c for c in running if c.poll() is not None]:
        del running[child]
        if child.returncode == 0:
            on_finished(child.seed)
        elif failure is None and child.returncode != 143:
            failure = (child.seed, child.returncode)
            for other in running:
                other.send_signal(signal.SIGTERM)
    return failure


def _start(seed, recipe, run, group, features, folder: Path) -> subprocess.Popen:
    """A child `finetune` of `seed`, on the GPUs (a `CUDA_VISIBLE_DEVICES` string) or the
    CPU cores (a set) of `group`, or on whatever this process may use (None)."""
    recipe_file = folder / f"seed-{seed}.yaml"
    recipe_file.write_text(recipe.to_yaml())
    command = [*CHILD_COMMAND, "finetune", str(recipe_file)]
    if features:
        command += ["--features", str(features)]
    env, cores = dict(os.environ), None
    where = "the CPU"
    if isinstance(group, str):
        env["CUDA_VISIBLE_DEVICES"], where = group, f"GPU {group}"
    elif group is not None:
        cores, where = group, f"CPU cores {','.join(map(str, sorted(group)))}"
    log = folder / f"seed-{seed}.log"
    say(f"seed {seed}: training on {where} beside the other seeds; its output: {log}")
    parent = os.getpid()
    with log.open("ab") as output:
        child = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=lambda: _die_with(parent, cores),
        )
    child.seed = seed
    return child


def _die_with(parent: int, cores: set[int] | None) -> None:
    """In the child, before it runs bertkit: SIGTERM when the parent dies (Linux), and its
    share of the cores (TensorFlow, XLA and NumPy size their thread pools from it)."""
    if cores:
        os.sched_setaffinity(0, cores)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent was gone before the line above
        os._exit(128 + signal.SIGTERM)


def _failed(seed: int, code: int, folder: Path, on_failed=None) -> Exception:
    """The parent's error for a seed whose child failed: its own one line for a user error
    (exit 2; `on_failed(seed, error)` if given), else a line naming its log."""
    log = folder / f"seed-{seed}.log"
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    errors = [line for line in lines if line.startswith("bertkit: error: ")]
    if code == 2 and errors:
        error = UserError(f"seed {seed}: {errors[-1].removeprefix('bertkit: error: ')}")
        return on_failed(seed, error) if on_failed else error
    status = f"signal {-code}" if code < 0 else f"exit status {code}"
    return RuntimeError(f"seed {seed} ended with {status}; its output: {log}")


@contextlib.contextmanager
def _handling(signum, handler):
    """`handler` for `signum` while the block runs (signals reach the main thread only)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signum, handler)
    try:
        yield
    finally:
        signal.signal(signum, previous)
