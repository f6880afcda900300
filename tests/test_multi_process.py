"""Several processes on loopback: JAX on CPU, one device each, the `bertkit finetune` command.

One module fixture starts, side by side, a one-process reference run, an
uninterrupted two-process job and a two-process job whose process 1 is
killed (-9) once process 0 has committed the checkpoint of epoch 1, then
restarted. Every process trains from a features file, so none imports
TensorFlow; the run then has no SavedModel or TensorBoard logs (the JAX tests
cover those), and each job is a few seconds of training.
"""

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint

pytest.importorskip("jax", reason="the JAX backend is part of the dev install")

HEARTBEAT_TIMEOUT = 10  # seconds: how long a silent process may take to be declared dead
EPOCHS = 3

# Runs `bertkit finetune` with an audit hook that records every file this process
# creates, opens for writing, renames or removes inside the run directory.
# Python's audit events see what bertkit and Keras do from Python (the atomic
# replace that commits every file bertkit writes included), not writes made
# inside C libraries such as HDF5's.
AUDITED_FINETUNE = r"""
import os, sys
for name in ("tensorflow", "tensorflow_text"):
    sys.modules[name] = None  # as where TensorFlow is not installed: no SavedModel, quicker
run_dir, log = os.path.abspath(sys.argv[1]), os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT)
del sys.argv[1:3]
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
CHANGES = {"os.rename", "os.mkdir", "os.remove", "os.rmdir", "shutil.rmtree", "os.truncate"}

def written(event, args):
    if event == "open":
        path, mode, flags = args
        return path if (mode and set(mode) & set("wax+")) or flags & WRITE_FLAGS else None
    return args[1] if event == "os.rename" else args[0] if event in CHANGES else None

def audit(event, args):
    path = written(event, args)
    if isinstance(path, (str, os.PathLike)) and os.path.abspath(path).startswith(run_dir):
        os.write(log, f"{event} {path}\n".encode())

sys.addaudithook(audit)
from tests.signal_at_step import install_from_environment  # (SIGTERM before a step)
install_from_environment()
sys.argv[0] = "bertkit"
from bertkit.cli import run
run()
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Job:
    """One `bertkit finetune` per process, on loopback; each process's output kept apart."""

    def __init__(self, folder, name: str, processes: int):
        self.folder, self.name, self.processes = folder, name, processes
        self.run_dir = folder / name
        self.started = []

    def start(self, sigterm_at: tuple[int, int] | None = None, sigterm_to: int = 1) -> "Job":
        """Starts the job's processes; `sigterm_at` (epoch, step), 0-based: process
        `sigterm_to` sends itself SIGTERM before that step, and every process pauses there
        (see tests/signal_at_step.py)."""
        port = free_port()
        env = {
            **os.environ,
            "KERAS_BACKEND": "jax",
            "JAX_PLATFORMS": "cpu",
            # compiled programs are shared: a restarted job does not compile again
            "JAX_COMPILATION_CACHE_DIR": str(self.folder / "compiled"),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "PYTHONPATH": str(Path(__file__).parents[1]),  # for tests.signal_at_step
            "TMPDIR": str(self.folder),  # the processes' JAX logs (bertkit.parallel.supervisor)
        }
        self.started = []
        for process in range(self.processes):
            log = self.folder / f"{self.name}.{process}.writes"
            log.unlink(missing_ok=True)
            command = [
                sys.executable,
                "-c",
                AUDITED_FINETUNE,
                str(self.run_dir),
                str(log),
                "finetune",
                "recipe.yaml",
                "--output",
                self.name,
                "--features",
                "features.npz",
            ]
            if self.processes > 1:
                command += [
                    "--coordinator",
                    f"127.0.0.1:{port}",
                    "--num-processes",
                    str(self.processes),
                    "--process-id",
                    str(process),
                    "--heartbeat-timeout",
                    str(HEARTBEAT_TIMEOUT),
                ]
            signalled = {
                "BERTKIT_TEST_SIGNAL": ",".join(
                    ["SIGTERM" if process == sigterm_to else "PAUSE", *map(str, sigterm_at or ())]
                ),
                "BERTKIT_TEST_RENDEZVOUS": str(self.folder / f"{self.name}.signalled"),
            }
            self.started.append(
                subprocess.Popen(
                    command,
                    cwd=self.folder,
                    env={**env, **signalled} if sigterm_at else env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        return self

    def wait(self, timeout: float = 300) -> list:
        """Each process's (exit code, stdout, stderr)."""
        results = []
        for process in self.started:
            out, err = process.communicate(timeout=timeout)
            results.append((process.returncode, out, err))
        return results

    def writes(self, process: int) -> list[str]:
        log = self.folder / f"{self.name}.{process}.writes"
        return log.read_text().splitlines() if log.exists() else []


def kill_after_first_checkpoint(job: Job, victim: int) -> tuple[float, list]:
    """Kills process `victim` once epoch 1 is committed; the others' exit results and the
    seconds the slowest took to exit after the kill."""
    committed = job.run_dir / "checkpoint" / "training_metadata.json"
    deadline = time.time() + 300
    while not committed.exists() and time.time() < deadline:
        assert all(p.poll() is None for p in job.started), job.wait()
        time.sleep(0.1)
    job.started[victim].kill()
    killed_at = time.time()
    survivors = [p for i, p in enumerate(job.started) if i != victim]
    results = [(p.wait(timeout=HEARTBEAT_TIMEOUT + 120), p.stderr.read()) for p in survivors]
    job.started[victim].wait()
    return time.time() - killed_at, results


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    from bertkit.training.trainer import featurize

    folder = tmp_path_factory.mktemp("multi_process")
    write_tiny_checkpoint(folder / "ckpt")
    write_sentiment_tsv(folder / "train.tsv", 48, seed=0)  # 6 full batches of 8 an epoch
    write_sentiment_tsv(folder / "dev.tsv", 15, seed=1)  # odd: filler rows in inference
    (folder / "recipe.yaml").write_text(
        yaml.safe_dump(
            {
                "schema": 1,
                "task": "classification",
                "backbone": {"preset": "./ckpt", "sequence_length": 32},
                "data": {"train": "train.tsv", "validation": "dev.tsv", "text": "sentence"},
                "training": {
                    "epochs": EPOCHS,
                    "batch_size": 8,
                    "learning_rate": 3e-3,
                    "seed": 3,
                    "distribution": "data_parallel",
                },
                "output_dir": "unused",
            }
        )
    )
    cwd = os.getcwd()
    os.chdir(folder)  # the recipe's relative paths
    try:
        featurize("recipe.yaml", "features.npz")
    finally:
        os.chdir(cwd)

    one = Job(folder, "one_process", 1).start()
    two = Job(folder, "two_processes", 2).start()
    killed = Job(folder, "killed", 2).start()
    coordinator_killed = Job(folder, "coordinator_killed", 2).start()
    exit_seconds, survivors = kill_after_first_checkpoint(killed, victim=1)
    _, coordinator_survivors = kill_after_first_checkpoint(coordinator_killed, victim=0)
    interrupted = committed_position(killed)[0]
    # resumed, then preempted: SIGTERM to process 1 alone, before step 3 of epoch 2
    preempted = killed.start(sigterm_at=(1, 2)).wait()
    preempted_at = committed_position(killed)
    restarted = killed.start().wait()
    return {
        "one": (one, one.wait()),
        "two": (two, two.wait()),
        "killed": killed,
        "exit_seconds": exit_seconds,
        "survivors": survivors,
        "coordinator_survivors": coordinator_survivors,
        "interrupted_after": interrupted,
        "preempted": preempted,
        "preempted_at": preempted_at,
        "restarted": restarted,
    }


def committed_position(job: Job) -> tuple[int, int]:
    """(epoch, step) of the job's last checkpoint: `step` steps of epoch `epoch` (0-based)."""
    committed = json.loads((job.run_dir / "checkpoint" / "training_metadata.json").read_text())
    return committed["epoch"], committed.get("step", 0)


def metrics(job: Job) -> dict:
    return json.loads((job.run_dir / "metrics.json").read_text())


def weights(job: Job) -> dict:
    import h5py

    arrays = {}
    with h5py.File(job.run_dir / "model" / "model.weights.h5") as file:
        file.visititems(
            lambda name, item: (
                arrays.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset) else None
            )
        )
    return arrays


def test_two_processes_end_as_one_process(jobs):
    (one, one_results), (two, two_results) = jobs["one"], jobs["two"]
    for code, _, err in one_results + two_results:
        assert code == 0, err[-3000:]
    expected, got = metrics(one), metrics(two)
    # The same batches and dropout masks (JAX draws a sharded random array as the
    # whole one); only the order of float32 sums differs: each process sums the
    # gradient of its 4 rows, then gloo adds the two halves.
    for a, b in zip(expected["epochs"], got["epochs"], strict=True):
        print(
            f"epoch {a['epoch']}: loss {a['loss']!r} (1 process) vs {b['loss']!r} "
            f"(2 processes), val_macro_f1 {a['val_macro_f1']!r} vs {b['val_macro_f1']!r}"
        )
        np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-5)
        np.testing.assert_allclose(b["val_macro_f1"], a["val_macro_f1"], atol=1e-6)
    assert got["final"]["validation"] == pytest.approx(expected["final"]["validation"])
    reference, trained = weights(one), weights(two)
    assert reference.keys() == trained.keys()
    largest = max(float(np.max(np.abs(reference[k] - trained[k]))) for k in reference)
    scale = max(float(np.max(np.abs(v))) for v in reference.values())
    print(f"best weights: largest difference {largest:.3g} (largest weight {scale:.3g})")
    assert largest < 1e-5  # 18 Adam steps of lr 3e-3 from the same start: rounding only


def test_only_process_zero_writes(jobs):
    two, results = jobs["two"]
    assert jobs["two"][0].writes(0), "the audit hook saw process 0 write nothing"
    assert two.writes(1) == []
    _, worker_out, _ = results[1]
    assert "epoch" not in worker_out and "validation:" not in worker_out  # no progress
    assert "validation:" in results[0][1]
    listed = sorted(p.name for p in two.run_dir.iterdir())
    assert listed == sorted(p.name for p in jobs["one"][0].run_dir.iterdir())
    assert jobs["killed"].writes(1) == []  # the restarted worker only read the checkpoint


def test_a_killed_process_ends_the_job_and_the_restart_resumes(jobs):
    ((code, err),) = jobs["survivors"]
    print(
        f"process 0 exited with {code} {jobs['exit_seconds']:.1f} s after process 1 was "
        f"killed (heartbeat timeout {HEARTBEAT_TIMEOUT} s)"
    )
    # One line and exit 2 (issue 28: it was a traceback, then JAX's C++ stack trace and
    # SIGABRT once the heartbeat timed out), before the heartbeat timeout.
    assert code == 2, err[-3000:]
    assert "Traceback" not in err and "stack trace" not in err, err[-3000:]
    assert [line for line in err.splitlines() if "error" in line.lower()] == [
        "bertkit: error: process 1 of 2 stopped mid-run (its connection closed); run the same "
        "command on every process again to resume"
    ], err[-3000:]
    assert jobs["exit_seconds"] < HEARTBEAT_TIMEOUT
    killed = jobs["killed"]
    for _, _, err in jobs["preempted"]:
        assert f"resuming {killed.run_dir} after epoch {jobs['interrupted_after']}" in err
    assert jobs["interrupted_after"] >= 1
    resumed = metrics(killed)
    assert [e["epoch"] for e in resumed["epochs"]] == list(range(1, EPOCHS + 1))
    assert json.loads((killed.run_dir / "run.json").read_text())["status"] == "finished"
    uninterrupted = metrics(jobs["two"][0])
    for a, b in zip(uninterrupted["epochs"], resumed["epochs"], strict=True):
        np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-4)
    assert resumed["final"]["validation"] == pytest.approx(uninterrupted["final"]["validation"])


def test_sigterm_stops_every_process_after_one_step_and_the_restart_resumes_there(jobs):
    # SIGTERM reached process 1 alone, before step 3 of epoch 2: JAX's preemption service
    # told process 0, and both stopped before that step (held there until the notice was
    # out, see tests/signal_at_step.py), which process 0 saved.
    killed = jobs["killed"]
    epoch, step = jobs["preempted_at"]
    print(f"SIGTERM before epoch 2 step 3: both processes stopped at epoch {epoch + 1} step {step}")
    assert (epoch, step) == (1, 2)  # before the step the signal came before
    stopped = (
        f"bertkit: stopped by SIGTERM at epoch {epoch + 1} step {step}; run the same command "
        "again to resume"
    )
    for code, _, err in jobs["preempted"]:
        assert code == 143, err[-3000:]
        assert stopped in err.splitlines() and "Traceback" not in err, err[-3000:]
    for code, _, err in jobs["restarted"]:
        assert code == 0, err[-3000:]
        assert f"resuming {killed.run_dir} at epoch {epoch + 1} step {step}" in err
    # ... and ended as the uninterrupted job (test_a_killed_process_ends_...'s comparison)


def test_a_killed_process_0_ends_the_others_in_one_line_too(jobs):
    # Process 0 runs JAX's coordination service: with it gone, JAX aborts the others from a
    # C++ thread unless a broken collective ends them first (bertkit.parallel.supervisor).
    ((code, err),) = jobs["coordinator_survivors"]
    assert code == 2, err[-3000:]
    assert "Traceback" not in err and not re.search(r"^[IWEF]\d{4} ", err, re.M), err[-3000:]
    (line,) = [line for line in err.splitlines() if "error" in line.lower()]
    assert line.startswith("bertkit: error: ") and "run the same command on every process" in line


GLOO_ERROR = (
    "UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/pair.cc:547] "
    "Connection closed by peer [127.0.0.1]:52123"
)  # the survivor's, word for word


@pytest.mark.parametrize(
    "processes, index, who",
    [
        (2, 0, "process 1 of 2"),
        (2, 1, "process 0 of 2"),
        (3, 1, "another of the job's 3 processes"),
    ],
)
def test_a_collective_broken_by_a_stopped_process_ends_in_one_line(
    monkeypatch, capsys, processes, index, who
):
    from bertkit.parallel import multi_process

    def exit_now(code):
        raise SystemExit(code)

    monkeypatch.setattr(multi_process, "process_count", lambda: processes)
    monkeypatch.setattr(multi_process, "process_index", lambda: index)
    monkeypatch.setattr(os, "_exit", exit_now)
    with pytest.raises(SystemExit) as ended, multi_process.stopped_process_ends_job():
        try:
            raise ValueError(GLOO_ERROR)
        except ValueError as error:
            raise RuntimeError("a step failed") from error  # found through the chain too
    assert ended.value.code == 2
    assert capsys.readouterr().err == (
        f"bertkit: error: {who} stopped mid-run (its connection closed); run the same command "
        "on every process again to resume\n"
    )
    with pytest.raises(ValueError, match="shapes"), multi_process.stopped_process_ends_job():
        raise ValueError("incompatible shapes")  # any other error is left as it is
    monkeypatch.setattr(multi_process, "process_count", lambda: 1)
    with pytest.raises(ValueError, match="Gloo"), multi_process.stopped_process_ends_job():
        raise ValueError(GLOO_ERROR)  # one process: no job to end


@pytest.fixture
def recipe_here(tmp_path, monkeypatch):
    """A recipe `bertkit check` passes, in the working folder: the job options are refused
    after it (the recipe is checked before anything starts)."""
    write_tiny_checkpoint(tmp_path / "ckpt")
    write_sentiment_tsv(tmp_path / "train.tsv", 8)
    recipe = {"schema": 1, "task": "classification", "backbone": {"preset": "./ckpt"}}
    recipe["data"] = {"train": "train.tsv", "text": "sentence"}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    monkeypatch.chdir(tmp_path)


def finetune_command(argv, capsys) -> tuple[int, str]:
    from bertkit.cli import main

    code = main(["finetune", "recipe.yaml", *argv])
    return code, capsys.readouterr().err.strip()


TENSORFLOW_REFUSAL = (
    "training over several processes needs the JAX backend (KERAS_BACKEND=jax): "
    "TensorFlow's MultiWorkerMirroredStrategy does not train Keras 3 models "
    "(keras-team/keras#20585)"
)


def test_several_processes_on_tensorflow_are_one_line_pointing_to_jax(
    capsys, monkeypatch, recipe_here
):
    import keras

    if keras.backend.backend() != "tensorflow":
        pytest.skip("the refusal is the TensorFlow backend's")
    code, err = finetune_command(
        ["--coordinator", "10.0.0.1:1234", "--num-processes", "2", "--process-id", "1"], capsys
    )
    assert (code, err) == (2, f"bertkit: error: --num-processes: {TENSORFLOW_REFUSAL}")
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {
                "cluster": {"worker": ["10.0.0.1:1234", "10.0.0.2:1234"]},
                "task": {"type": "worker", "index": 0},
            }
        ),
    )
    code, err = finetune_command([], capsys)
    assert (code, err) == (2, f"bertkit: error: TF_CONFIG: {TENSORFLOW_REFUSAL}")


def test_a_missing_process_setting_names_its_option(capsys, monkeypatch, recipe_here):
    monkeypatch.setenv("KERAS_DISTRIBUTION_NUM_PROCESSES", "2")
    code, err = finetune_command(["--coordinator", "127.0.0.1:1234"], capsys)
    assert (code, err) == (
        2,
        "bertkit: error: --process-id: a job of several processes needs "
        "--process-id (or KERAS_DISTRIBUTION_PROCESS_ID)",
    )
    code, err = finetune_command(["--coordinator", "127.0.0.1:1234", "--process-id", "2"], capsys)
    assert (code, err) == (
        2,
        "bertkit: error: --process-id: expected 0 to 1 for 2 processes, got 2",
    )


@pytest.mark.parametrize("environment", [False, True], ids=["option", "variable"])
def test_a_coordinator_without_a_port_is_one_line(capsys, monkeypatch, environment, recipe_here):
    if environment:
        monkeypatch.setenv("KERAS_DISTRIBUTION_JOB_ADDRESSES", "garbage")
        key, argv = "KERAS_DISTRIBUTION_JOB_ADDRESSES", []
    else:
        key, argv = "--coordinator", ["--coordinator", "garbage"]
    code, err = finetune_command([*argv, "--num-processes", "2", "--process-id", "0"], capsys)
    assert (code, err) == (
        2,
        f"bertkit: error: {key}: expected HOST:PORT, process 0's address "
        "(e.g. 10.0.0.1:1234), got 'garbage'",
    )


def test_a_missing_process_ends_the_wait_with_one_line(tmp_path, recipe_here):
    """A job of two processes where only process 1 comes: it says what it waits for, then
    gives up after --startup-timeout with one line (JAX alone would wait 300 s, then abort
    with a C++ stack trace)."""
    port = free_port()
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    started = time.time()
    # Each process checks the recipe (as `bertkit check` does), then gathers.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertkit.cli",
            "finetune",
            "recipe.yaml",
            "--coordinator",
            f"127.0.0.1:{port}",
            "--num-processes",
            "2",
            "--process-id",
            "1",
            "--startup-timeout",
            "3",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert time.time() - started < 60
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"waiting for 2 processes at 127.0.0.1:{port} (this is process 1; giving up after 3 s)",
        f"bertkit: error: --startup-timeout: the job's 2 processes did not all start within 3 s; "
        f"start every process (--process-id 0 to 1), with process 0 at 127.0.0.1:{port}",
    ]
