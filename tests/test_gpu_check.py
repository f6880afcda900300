"""benchmarks/gpu_check.py: the CPU dry run of every stage, end to end, from a tiny carry.

torch and transformers are not bertkit dependencies: where they are missing, their stages
must say so in their rows; where they are installed, they must run.
"""

import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path

from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPT = BENCHMARKS / "gpu_check.py"
sys.path.insert(0, str(BENCHMARKS / "gpu"))

from carry import prepare  # noqa: E402
from report import ROWS, derive, table  # noqa: E402
from stages import Runner, Stage  # noqa: E402

TORCH_STAGES = {"matmul_torch", "hf_steps_0", "hf_steps_1", "hf_sst2"}
MISSING = next(
    (
        f"skipped: {name} not installed"
        for name in ("torch", "transformers")
        if importlib.util.find_spec(name) is None
    ),
    None,
)


def write_conll(path: Path, count: int, seed: int) -> None:
    rng = random.Random(seed)
    lines = ["-DOCSTART- -X- -X- O", ""]
    for _ in range(count):
        lines += [f"{word} NN O" for word in rng.sample(["the", "film", "was", "in", "it"], 3)]
        lines += [f"{rng.choice(['paris', 'london'])} NNP B-LOC", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


def gpu_check(*arguments) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, arguments)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_dry_run_gives_every_row(tmp_path):
    data, carry, out = tmp_path / "data", tmp_path / "carry", tmp_path / "out"
    write_sentiment_tsv(data / "sst2" / "train.tsv", 64, seed=0)
    write_sentiment_tsv(data / "sst2" / "dev.tsv", 16, seed=1)
    write_conll(data / "conll2003" / "train.txt", 48, seed=0)
    write_conll(data / "conll2003" / "dev.txt", 12, seed=1)
    checkpoint = write_tiny_checkpoint(tmp_path / "checkpoint")

    prepare(data, carry, preset=str(checkpoint), wheels=False)  # `gpu_check.py prepare`
    manifest = json.loads((carry / "manifest.json").read_text())
    assert manifest["features"]["sst2"]["rows"] == {"train": 64, "validation": 16}
    assert manifest["features"]["conll"]["rows"] == {"train": 48}  # tagging decodes in TF
    assert {p.name for p in (carry / "sst2").iterdir()} == {"train.tsv.gz", "dev.tsv.gz"}

    done = gpu_check(
        "run", "--carry", carry, "--shape", "tiny", "--out", out, "--work", tmp_path / "work"
    )
    written = (out / "gpu_check.md").read_text()
    assert written.strip() in done.stdout
    assert "These are not GPU figures" in written
    results = json.loads((out / "gpu_check.json").read_text())["results"]
    for key, label in ROWS:
        assert f"| {label.format(32, 64)} |" in written
        expected = MISSING if key in TORCH_STAGES and MISSING else "ok"
        assert results[key]["status"] == expected, (key, results[key])
    sst2, conll = results["finetune_sst2"], results["finetune_conll"]
    assert {"first_step", "train_steps", "evaluation"} <= set(sst2["phases"])
    assert sst2["compilation"]["programs"] > 0 and "accuracy" in sst2["validation"]
    warm = results["finetune_sst2_warm"]["compilation"]  # the first run filled the cache
    assert warm["from_cache"] == warm["programs"] == sst2["compilation"]["programs"]
    assert conll["train_rows"] == 48 and conll["validation"] is None
    # the finetune stages ran without TensorFlow although it is installed here
    assert "export needs TensorFlow" in (out / "logs" / "finetune_sst2.log").read_text()


def test_run_refuses_a_folder_that_is_no_carry(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "run", "--carry", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert "is not a carry folder (no manifest.json" in done.stderr


def test_skip_leaves_stages_out_by_key_or_its_start(tmp_path):
    carry, out = tmp_path / "carry", tmp_path / "out"
    carry.mkdir()
    (carry / "manifest.json").write_text("{}")
    skip = ["matmul_torch", "checkpoint", "hf_steps", "bertkit_steps", "finetune", "hf_sst2"]
    gpu_check("run", "--carry", carry, "--shape", "tiny", "--out", out, "--skip", *skip)
    results = json.loads((out / "gpu_check.json").read_text())["results"]
    assert results.pop("matmul_jax")["status"] == "ok"
    assert {record["status"] for record in results.values()} == {"skipped: left out (--skip)"}
    assert len(results) == 10


def test_a_stage_past_its_time_is_a_row_and_the_next_runs(tmp_path):
    runner = Runner(tmp_path / "logs", None, tmp_path, deadline=float("inf"))
    slow = runner.run(
        Stage(
            "slow",
            "slow",
            [sys.executable, "-c", "import time; print('step 1', flush=True); time.sleep(60)"],
            1,
        )
    )
    failed = runner.run(Stage("bad", "bad", [sys.executable, "-c", "raise ValueError('no')"]))
    fine = runner.run(
        Stage(
            "fine",
            "fine",
            [
                sys.executable,
                "-c",
                "import json; print('GPU_CHECK_RESULT ' + json.dumps({'x': 1}))",
            ],
        )
    )
    assert slow["status"] == "timed out after 1 s; last: step 1"
    assert failed["status"] == "failed (exit 1): ValueError: no"
    assert fine["status"] == "ok" and fine["x"] == 1


def test_mfu_uses_one_formula_for_both_and_failures_say_why():
    def flops(shape, length):  # jax_train_throughput's form, any numbers do
        return 6.0 * length

    results = {
        "matmul_jax": {"status": "ok", "tflops": 1e-9, "size": 256},
        "hf_steps_0": {
            "status": "ok",
            "sequences_per_second": 100.0,
            "step_ms": 40.0,
            "sequence_length": 128,
            "batch_size": 4,
            "steps": 2,
            "build_and_warmup_seconds": 1.0,
            "wall_seconds": 3.0,
        },
        "bertkit_steps_0": {"status": "failed (exit 1): out of memory"},
        "hf_sst2": {
            "status": "ok",
            "phases": {"train": 2.0},
            "train_rows": 10,
            "train_lengths": {"8": 10},
            "steps": 3,
            "wall_seconds": 9.0,
            "imported_at": 101.0,
            "launched_at": 100.0,
        },
    }
    assert derive(results, {}, flops) == 1e-9
    assert abs(results["hf_steps_0"]["mfu"] - 100 * 6 * 128 / 1e12 / 1e-9) < 1e-9
    assert abs(results["hf_sst2"]["sequences_per_second"] - 5.0) < 1e-9
    assert results["hf_sst2"]["phases"] == {"start-up": 1.0, "train": 2.0}
    text = table(results, (128, 384), ["header"])
    assert "| bertkit steps, seq 128 | failed (exit 1): out of memory |" in text
    assert "| bertkit finetune --features, CoNLL-2003, 1 epoch | not run |" in text
