"""Seeds side by side (`training.parallel_seeds`, bertkit.training.seeds_side_by_side): each
seed a child `bertkit finetune` on its own GPUs, SIGTERM passed on and resumed, a failing
seed one line, and when seeds stay one after another."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

import bertkit
from bertkit.errors import UserError
from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint
from bertkit.training import seeds_side_by_side
from bertkit.training.preemption import Preempted
from bertkit.training.seeds_side_by_side import seeds_at_once, visible_gpus

SIGNAL_AT_STEP = Path(__file__).with_name("signal_at_step.py")


def recipe(folder, **training):
    return {
        "schema": 1,
        "task": "classification",
        "backbone": {"preset": str(folder / "ckpt"), "sequence_length": 16},
        "data": {
            "train": str(folder / "train.tsv"),
            "validation": str(folder / "dev.tsv"),
            "text": "sentence",
        },
        "training": {
            "epochs": 2,
            "batch_size": 4,
            "learning_rate": 1e-3,
            "seeds": 2,
            "checkpoint_every_steps": 2,
            **training,
        },
        "export": {"saved_model": False},
        "output_dir": str(folder / "run"),
    }


def steps_done(seed_run: Path) -> int:
    steps = seed_run / "steps.json"
    return len(json.loads(steps.read_text())["steps"]) if steps.is_file() else 0


def test_seeds_train_side_by_side_on_their_gpus_stop_on_sigterm_and_resume(
    tmp_path, monkeypatch, capsys
):
    write_tiny_checkpoint(tmp_path / "ckpt", num_layers=1, hidden_size=16, intermediate_size=32)
    write_sentiment_tsv(tmp_path / "train.tsv", 32, seed=0)  # 8 steps an epoch
    write_sentiment_tsv(tmp_path / "dev.tsv", 8, seed=1)
    # two "GPUs": on this CPU-only machine the children ignore their CUDA_VISIBLE_DEVICES
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    # each child holds before step 3 of epoch 2 until the test has sent its SIGTERM
    monkeypatch.setattr(seeds_side_by_side, "CHILD_COMMAND", [sys.executable, str(SIGNAL_AT_STEP)])
    monkeypatch.setenv("BERTKIT_TEST_SIGNAL", "PAUSE,1,3")
    monkeypatch.setenv("BERTKIT_TEST_RENDEZVOUS", str(tmp_path / "go"))
    seeds = [tmp_path / "run" / "seeds" / f"seed-{seed}" for seed in (42, 43)]

    def holding(seed_run):  # its progress line of the step before the held one is out
        log = Path(f"{seed_run}.log")
        return log.is_file() and "epoch 2/2  step 3/8" in log.read_text(errors="replace")

    def sigterm_once_both_hold():
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not all(map(holding, seeds)):
            time.sleep(0.1)
        signal.raise_signal(signal.SIGTERM)  # to this process, the seeds' parent
        time.sleep(1)
        (tmp_path / "go").touch()

    threading.Thread(target=sigterm_once_both_hold, daemon=True).start()
    with pytest.raises(Preempted, match="side by side"):
        bertkit.finetune(recipe(tmp_path), verbose=0)
    out = capsys.readouterr().out
    assert "seeds 42, 43: 2 at a time" in out
    assert f"seed 42: training on GPU 0 beside the other seeds; its output: {seeds[0]}.log" in out
    assert f"seed 43: training on GPU 1 beside the other seeds; its output: {seeds[1]}.log" in out
    for seed_run in seeds:
        assert json.loads((seed_run / "run.json").read_text())["status"] == "running"
        assert "stopped by SIGTERM at epoch 2 step 3" in Path(f"{seed_run}.log").read_text()

    monkeypatch.delenv("BERTKIT_TEST_SIGNAL")
    finetuned = bertkit.finetune(recipe(tmp_path), verbose=0)
    for seed_run in seeds:
        assert "resuming" in Path(f"{seed_run}.log").read_text()
        assert json.loads((seed_run / "run.json").read_text())["status"] == "finished"
        assert steps_done(seed_run) == 16
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert [entry["seed"] for entry in metrics["seeds"]] == [42, 43]
    assert finetuned.predict(["a warm film"])[0]["label"] in ("positive", "negative")
    # side by side: the two seeds' resumed runs overlapped in time
    spans = []
    for seed_run in seeds:
        record = json.loads((seed_run / "run.json").read_text())
        start = record["finetune_called_at"]
        spans.append((start, start + record["phases"]["total"]))
    assert max(s for s, _ in spans) < min(e for _, e in spans)


def test_a_seed_that_fails_stops_the_others_with_its_line(tmp_path, monkeypatch):
    write_tiny_checkpoint(tmp_path / "ckpt", num_layers=1, hidden_size=16, intermediate_size=32)
    write_sentiment_tsv(tmp_path / "train.tsv", 8, seed=0)
    write_sentiment_tsv(tmp_path / "dev.tsv", 8, seed=1)
    with (tmp_path / "train.tsv").open("a") as train:
        train.write("a row without its label\n")
    with pytest.raises(UserError, match=r"^seed 4[23]: .*train\.tsv:10"):
        bertkit.finetune(recipe(tmp_path, parallel_seeds=2), verbose=0)


def training(**values):
    defaults = {"seeds": 4, "parallel_seeds": "auto", "distribution": "auto"}
    return types.SimpleNamespace(**{**defaults, **values})


@pytest.mark.parametrize(
    "gpus, values, callbacks, expected",
    [
        ("0,1,2,3", {}, None, 4),
        ("0,1,2,3,4,5", {}, None, 4),  # at most `seeds`
        ("0,1", {"seeds": 1}, None, 1),
        ("0", {}, None, 1),
        ("", {}, None, 1),  # a CPU: one after another
        ("-1", {}, None, 1),
        ("0,1,2,3", {"distribution": "data_parallel"}, None, 1),
        ("0,1,2,3", {"distribution": "one_device"}, None, 4),  # one device each, side by side
        ("0,1,2,3", {}, [object()], 1),  # Python callbacks stay in this process
        ("0,1,2,3", {"parallel_seeds": 2}, None, 2),
        ("", {"parallel_seeds": 2}, None, 2),  # asked for: side by side on the CPU
        ("0,1,2,3", {"parallel_seeds": 1}, None, 1),
    ],
)
def test_how_many_seeds_train_at_once(monkeypatch, gpus, values, callbacks, expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", gpus)
    assert seeds_at_once(training(**values), callbacks) == expected


@pytest.mark.parametrize(
    "gpus, callbacks, message",
    [
        ("0,1", None, "3 seeds side by side need a GPU each, and 2 are visible"),
        ("", [object()], "Python callbacks cannot reach the child processes"),
    ],
)
def test_seeds_side_by_side_that_cannot_be_are_refused(monkeypatch, gpus, callbacks, message):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", gpus)
    with pytest.raises(UserError, match=message) as caught:
        seeds_at_once(training(parallel_seeds=3), callbacks)
    assert caught.value.key == "training.parallel_seeds"


def test_visible_gpus_without_the_variable_asks_nvidia_smi(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-a)'\n"
        "echo '  MIG 3g.40gb     Device  0: (UUID: MIG-b)'\necho 'GPU 1: NVIDIA H100 (UUID: GPU-c)'\n"
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert visible_gpus() == ["0", "1"]
    smi.unlink()
    assert visible_gpus() == []


def test_asking_for_the_process_count_starts_no_jax_backend():
    # JAX's backend, once started, takes most of each GPU's memory: the parent of seeds
    # side by side asks how many processes train together before it starts its children
    pytest.importorskip("jax", reason="the JAX backend is part of the dev install")
    script = (
        "import keras\n"
        "from jax._src import xla_bridge\n"
        "from bertkit.parallel.multi_process import process_count, process_index\n"
        "assert (process_count(), process_index()) == (1, 0)\n"
        "print(sorted(xla_bridge._backends))\n"
    )
    env = {**os.environ, "KERAS_BACKEND": "jax"}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert out.strip() == "[]"


def fake_seed_runs(folder: Path, seeds) -> dict:
    """`train_side_by_side`'s input for child commands that need no recipe."""
    recipe = types.SimpleNamespace(to_yaml=lambda: "schema: 1\n")
    return {s: (recipe, types.SimpleNamespace(path=folder / "seeds" / f"seed-{s}")) for s in seeds}


def test_seeds_side_by_side_on_a_cpu_each_run_on_their_own_cores(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU
    report_cores = "import os; print('cores', sorted(os.sched_getaffinity(0)))"
    monkeypatch.setattr(seeds_side_by_side, "CHILD_COMMAND", [sys.executable, "-c", report_cores])
    finished = []
    seeds_side_by_side.train_side_by_side(
        fake_seed_runs(tmp_path, [1, 2]), 2, None, finished.append
    )
    assert sorted(finished) == [1, 2]
    logs = [(tmp_path / "seeds" / f"seed-{s}.log").read_text() for s in (1, 2)]
    cores = sorted(os.sched_getaffinity(0))
    expected = [f"cores {sorted(group)}" for group in seeds_side_by_side.core_groups(cores, 2)]
    assert [log.strip() for log in logs] == expected
    if len(cores) > 1:
        assert len(cores) > max(len(group) for group in seeds_side_by_side.core_groups(cores, 2))


PARENT_OF_ONE_SEED = """
import sys
from pathlib import Path
from bertkit.training import seeds_side_by_side
sys.path.insert(0, sys.argv[2])
from test_seeds_side_by_side import fake_seed_runs
seeds_side_by_side.CHILD_COMMAND = [sys.executable, "-c", sys.argv[3]]
seeds_side_by_side.train_side_by_side(fake_seed_runs(Path(sys.argv[1]), [7]), 1, None, print)
"""

SEED_UNTIL_SIGTERM = """
import pathlib, signal, sys, time
recipe = pathlib.Path(sys.argv[-1])
def stop(signum, frame):
    recipe.with_suffix(".stopped").write_text(signal.Signals(signum).name)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
recipe.with_suffix(".started").write_text("")
time.sleep(60)
"""


def test_a_kill_9_of_the_parent_stops_the_seeds_with_sigterm(tmp_path):
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            PARENT_OF_ONE_SEED,
            str(tmp_path),
            str(Path(__file__).parent),
            SEED_UNTIL_SIGTERM,
        ],
        stdout=subprocess.DEVNULL,
    )
    started, stopped = tmp_path / "seeds" / "seed-7.started", tmp_path / "seeds" / "seed-7.stopped"
    deadline = time.monotonic() + 60
    while not started.exists() and parent.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists(), "the seed's child did not start"
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 30
    while not stopped.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stopped.read_text() == "SIGTERM"
