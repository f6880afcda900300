"""Training over several processes, on one machine or many: JAX only.

Every process runs the same command on the same recipe (`bertkit finetune
RECIPE --coordinator HOST:PORT --num-processes N --process-id I`, or Keras's
`KERAS_DISTRIBUTION_JOB_ADDRESSES`, `_NUM_PROCESSES` and `_PROCESS_ID`), which
starts JAX's distributed runtime (`start_processes`) before anything is built.
The run then trains data parallel over the devices of all processes
(`keras.distribution.DataParallel` over `jax.devices()`), the gradients summed
by XLA across processes: on CPU through gloo, JAX's default CPU collectives.

- **Data.** `batch_size` is the global batch. Each batch (filled to a multiple
  of the device count with rows of weight 0, see `bertkit.padding.fill_rows`)
  is cut into as many equal consecutive shares as there are processes; process
  `p` pads and feeds share `p` only (`process_share`), padded to the width of
  the whole batch so that all shares have one shape.
- **Files.** Process 0 alone writes the run directory (its lock, checkpoints,
  metrics, report, SavedModel) and prints progress. The other processes read
  process 0's files: on resume its checkpoint, after training its best weights.
  The run directory must therefore be on a filesystem every machine shares.
- **Agreement.** Process 0 decides whether the run starts or resumes and tells
  the others (`process_zero_decides`); every process evaluates the validation
  split (each feeding its share, all receiving every output, see
  `bertkit.parallel.global_batch`), so all choose the same best epoch and stop together.
- **Failures.** A process that dies is noticed by the others when a collective
  breaks, or at the latest after `heartbeat_timeout` seconds without its
  heartbeat: they end with an error instead of waiting forever (one line, exit
  status 2, where a collective broke: see `bertkit.parallel.failures`). Running
  the same commands again resumes from process 0's last checkpoint. A process
  that never comes ends the others' start-up after `startup_timeout` seconds. Where JAX
  ends a process itself (process 0 gone), its parent says so in one line
  (`bertkit.parallel.supervisor`).
- **Preemption.** A SIGTERM to any process stops them all after the same step, saved
  for the resume (`bertkit.training.preemption.JobSigtermWatch`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

from bertkit.errors import UserError
from bertkit.parallel.failures import end_process, exit_after, peer_gone, peer_stopped
from bertkit.parallel.supervisor import split_child_stderr, supervised

DEFAULT_HEARTBEAT_TIMEOUT = 60  # seconds; JAX's default (100) leaves a stalled job longer
SHUTDOWN_TIMEOUT = 600  # seconds the others wait at exit while process 0 exports
DEFAULT_STARTUP_TIMEOUT = 300  # seconds for all processes to join: JAX's default
STARTUP_TIMEOUT_VARIABLE = "BERTKIT_STARTUP_TIMEOUT"
_ENVIRONMENT = {
    "coordinator": "KERAS_DISTRIBUTION_JOB_ADDRESSES",
    "num_processes": "KERAS_DISTRIBUTION_NUM_PROCESSES",
    "process_id": "KERAS_DISTRIBUTION_PROCESS_ID",
}


def start_processes(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    heartbeat_timeout: int = DEFAULT_HEARTBEAT_TIMEOUT,
    startup_timeout: int | None = None,
) -> bool:
    """Joins this process to a multi-process job; False when none is asked for.

    Each argument not given is read from its `KERAS_DISTRIBUTION_*` variable
    (as `keras.distribution.initialize` does); `startup_timeout` from
    `BERTKIT_STARTUP_TIMEOUT`, else 300 s. Call it before any JAX computation.
    Raises a `UserError` naming the option for a missing or inconsistent setting,
    and on the TensorFlow backend. Says on stderr what it waits for; when not every
    process has joined after `startup_timeout` seconds, it ends this process with
    one line and exit status 2 (JAX cannot be interrupted while it waits, and would
    abort the process itself with a C++ stack trace).
    """
    import keras

    settings = _settings(coordinator, num_processes, process_id)
    if keras.backend.backend() == "tensorflow":
        check_tensorflow_config()
    if settings is None:
        return False
    if keras.backend.backend() != "jax":
        raise_tensorflow_multi_worker_error("--num-processes")
    if supervised():
        split_child_stderr()
    _join_jax_job(*settings, heartbeat_timeout, startup_timeout or _startup_timeout_variable())
    return True


def job_requested(coordinator=None, num_processes=None, process_id=None) -> bool:
    """Whether the options and `KERAS_DISTRIBUTION_*` variables ask for a job of several
    processes (a `UserError` naming the option where they are inconsistent)."""
    return _settings(coordinator, num_processes, process_id) is not None


def _join_jax_job(
    coordinator: str,
    num_processes: int,
    process_id: int,
    heartbeat_timeout: int,
    startup_timeout: int,
) -> None:
    """`jax.distributed.initialize`, saying on stderr what it waits for, given up with one
    line after `startup_timeout` seconds."""
    import jax

    address = coordinator.split(",")[0].strip()
    print(
        f"waiting for {num_processes} processes at {address} (this is process "
        f"{process_id}; giving up after {startup_timeout} s)",
        file=sys.stderr,
        flush=True,
    )
    gave_up = UserError(
        f"the job's {num_processes} processes did not all start within "
        f"{startup_timeout} s; start every process (--process-id 0 to "
        f"{num_processes - 1}), with process 0 at {address}",
        key="--startup-timeout",
    )
    # What `keras.distribution.initialize` does, with timeouts of our choosing; its
    # other step (a seed agreed between processes) is not needed: a run seeds itself.
    with exit_after(startup_timeout, gave_up):
        jax.distributed.initialize(
            coordinator_address=address,
            num_processes=num_processes,
            process_id=process_id,
            initialization_timeout=startup_timeout + 60,  # ours first
            heartbeat_timeout_seconds=heartbeat_timeout,
            shutdown_timeout_seconds=SHUTDOWN_TIMEOUT,
        )


def _startup_timeout_variable() -> int:
    text = os.environ.get(STARTUP_TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_STARTUP_TIMEOUT
    if not text.isdigit() or int(text) < 1:
        raise UserError(
            f"expected a whole number of seconds, at least 1, got {text!r}",
            key=STARTUP_TIMEOUT_VARIABLE,
        )
    return int(text)


def _settings(coordinator, num_processes, process_id):
    """(coordinator, num_processes, process_id) from arguments and environment, or None."""
    given = {"coordinator": coordinator, "num_processes": num_processes, "process_id": process_id}
    for name, variable in _ENVIRONMENT.items():
        if given[name] is None and os.environ.get(variable):
            given[name] = _parse(name, os.environ[variable], variable)
    if all(value is None for value in given.values()):
        return None
    if given["num_processes"] == 1 and given["process_id"] in (None, 0):
        return None  # one process: nothing to join
    for name, value in given.items():
        if value is None:
            raise UserError(
                f"a job of several processes needs --{_option(name)} (or {_ENVIRONMENT[name]})",
                key=f"--{_option(name)}",
            )
    if not 0 <= given["process_id"] < given["num_processes"]:
        raise UserError(
            f"expected 0 to {given['num_processes'] - 1} for "
            f"{given['num_processes']} processes, got {given['process_id']}",
            key="--process-id",
        )
    _check_address(
        given["coordinator"],
        "--coordinator" if coordinator is not None else _ENVIRONMENT["coordinator"],
    )
    return given["coordinator"], given["num_processes"], given["process_id"]


def _check_address(text: str, key: str) -> None:
    """`HOST:PORT` (the first of a comma-separated list, as Keras's variable may hold)."""
    host, colon, port = text.split(",")[0].strip().rpartition(":")
    if not (colon and host and port.isdigit() and 0 < int(port) < 65536):
        raise UserError(
            f"expected HOST:PORT, process 0's address (e.g. 10.0.0.1:1234), got {text!r}", key=key
        )


def _parse(name: str, text: str, source: str):
    if name == "coordinator":
        return text
    try:
        return int(text)
    except ValueError:
        raise UserError(f"expected a whole number, got {text!r}", key=source) from None


def _option(name: str) -> str:
    return name.replace("_", "-")


def raise_tensorflow_multi_worker_error(what: str) -> None:
    """The one line for multi-process training asked of the TensorFlow backend."""
    raise UserError(
        "training over several processes needs the JAX backend "
        "(KERAS_BACKEND=jax): TensorFlow's MultiWorkerMirroredStrategy does not "
        "train Keras 3 models (keras-team/keras#20585)",
        key=what,
    )


def check_tensorflow_config() -> None:
    """Refuses a `TF_CONFIG` that lists several workers, on the TensorFlow backend."""
    text = os.environ.get("TF_CONFIG")
    if not text:
        return
    try:
        cluster = json.loads(text).get("cluster", {})
    except (json.JSONDecodeError, AttributeError):
        raise UserError("not a JSON object", key="TF_CONFIG") from None
    if sum(len(tasks) for tasks in cluster.values()) > 1:
        raise_tensorflow_multi_worker_error("TF_CONFIG")


@contextlib.contextmanager
def stopped_process_ends_job():
    """A context in which, in a job of several processes, a collective that fails because
    another process stopped ends this one with one line (`process 1 of 2 stopped ...; run
    the same command on every process again to resume`) and exit status 2, instead of a
    traceback and JAX's abort at exit (see `bertkit.parallel.failures`). Other errors pass."""
    try:
        yield
    except Exception as error:
        if process_count() < 2 or isinstance(error, UserError) or not peer_gone(error):
            raise
        end_process(peer_stopped(process_count(), process_index()))


def process_count() -> int:
    """How many processes train together (1 without a distributed runtime)."""
    import keras

    # Asked before anything runs on a device: JAX's backend, once started, takes most of
    # each visible GPU's memory, which seeds side by side leave to their child processes.
    if keras.backend.backend() != "jax" or not _joined_jax_job():
        return 1
    import jax

    return jax.process_count()


def process_index() -> int:
    """This process's index among those training together (0: the one that writes)."""
    import keras

    if keras.backend.backend() != "jax" or not _joined_jax_job():
        return 0
    import jax

    return jax.process_index()


def _joined_jax_job() -> bool:
    """`jax.distributed.initialize` has run (bertkit's, or `keras.distribution.initialize`);
    asking does not start JAX's backend."""
    import jax

    return jax.distributed.is_initialized()


def writes_run_directory() -> bool:
    """True in the process that writes the run directory and prints progress."""
    return process_index() == 0


def process_share(count: int) -> slice:
    """This process's consecutive part of `count` rows (a multiple of the process count).

    Example:
        >>> process_share(8)  # one process: all rows
        slice(0, 8, None)
    """
    size = count // process_count()
    return slice(process_index() * size, (process_index() + 1) * size)


def process_zero_decides(decide):
    """`decide()` run in process 0, its result (an int) given to every process.

    When process 0 raises a `UserError` the others raise one too, pointing at
    process 0's output, instead of waiting for it.
    """
    if process_count() == 1:
        return decide()
    from jax.experimental import multihost_utils

    failed = -1
    try:
        result = int(decide()) if writes_run_directory() else 0
    except UserError:
        multihost_utils.broadcast_one_to_all(failed)
        raise
    result = int(multihost_utils.broadcast_one_to_all(result))
    if result == failed:
        raise UserError("process 0 stopped with an error; see its output")
    return result


def wait_for_all(name: str) -> None:
    """Blocks until every process reaches the point named `name` (e.g. after a file is written)."""
    if process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


@contextlib.contextmanager
def quiet_unless_writer():
    """A context in which only process 0 prints to stdout (progress, metrics, phases)."""
    if writes_run_directory():
        yield
        return
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        yield


@contextlib.contextmanager
def outside_distribution():
    """A context without Keras's distribution, for what one process does alone (saving).

    Keras's `save_weights` builds a throwaway optimizer to learn which attributes
    to skip; under a distribution over several processes its variables are placed
    on every process's devices, a collective step the other processes never join
    (JAX then fails, or waits). The model's own variables are replicated on every
    device, so the saving process reads each from its local replica all the same.
    """
    import keras

    kept = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        yield
    finally:
        keras.distribution.set_distribution(kept)
