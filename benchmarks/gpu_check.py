"""One call on a GPU machine: bertkit against transformers, one table (issue 30, item 4).

For a machine with one GPU and a stock CUDA Python (JAX, torch, transformers) without
TensorFlow, keras or bertkit, and without network. Two steps:

    # here, where bertkit's dependencies are installed (TensorFlow tokenizes):
    python benchmarks/gpu_check.py prepare --data ../shared/data --out gpu-carry/
    # there, in a copy of this checkout with gpu-carry/ beside it (about 10 minutes):
    python benchmarks/gpu_check.py run --carry gpu-carry/ [--out DIR]

`prepare` writes the carry folder (benchmarks/gpu/carry.py: features files, recipes,
tokenizer, SST-2 text, wheels). `run` installs the wheels into a folder of its own when keras
or bertkit is missing, makes a random BERT-base in Hugging Face format there, then runs each
stage as a process with its own timeout (a failed stage is a row saying why):

    matmul ceiling          bf16 8192^3 through JAX and through torch
    transformers steps      seq 128 and 384, batch 32: autocast bf16, SDPA, fused AdamW,
                            clipping (benchmarks/gpu/torch_worker.py)
    bertkit steps           the same shapes, benchmarks/jax_train_throughput.py's model
                            (keras-hub backbone, bertkit's head and AdamW), mixed_bfloat16
    bertkit finetune        the whole command on JAX from the features files, SST-2 and
                            CoNLL-2003 in full, 1 epoch each; phases and compilation from
                            run.json; the SST-2 run once more, every program then read
                            from the compilation cache the first filled
    transformers SST-2      transformers' whole loop on the same SST-2 epoch: tokenize,
                            train, evaluate on dev (same batch size, length, learning rate)

It prints one table and writes it (gpu_check.md), every figure (gpu_check.json), each
stage's log and the runs' run.json under `--out` (default `$OUT`, else gpu-check-out/).
TensorFlow is never imported by `run` (its stages block it even where it is installed).
`--shape tiny` is the CPU dry run of every stage (a 1-layer model, a few steps; use a carry
made with `prepare --limit 200`): its figures, like any figures from a CPU, are not GPU
figures, and the table says so.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(1, str(HERE / "gpu"))

from protocol import SETTINGS, SHAPES  # noqa: E402
from report import ROWS, derive, table  # noqa: E402
from stages import Runner, Stage, finetune_figures  # noqa: E402

# seconds: each stage's limit, and the whole check's (about 10 minutes with the set-up)
TIMEOUTS = {
    "base": dict(
        matmul=60,
        checkpoint=90,
        steps=90,
        finetune_sst2=210,
        finetune_sst2_warm=120,
        hf_sst2=150,
        finetune_conll=180,
        budget=570,
    ),
    "tiny": dict(
        matmul=120,
        checkpoint=120,
        steps=240,
        finetune_sst2=400,
        finetune_sst2_warm=400,
        hf_sst2=300,
        finetune_conll=400,
        budget=1800,
    ),
}
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
NOT_GPU = (
    "**These are not GPU figures**: {why}. They check that every stage runs; they say "
    "nothing about speed on a GPU."
)


class Check:
    """One run of the check: the stages in order, each one's record in `results`."""

    def __init__(
        self,
        carry: Path,
        shape: str,
        out: Path,
        work: Path,
        torch_python: str | None,
        budget: float | None,
        skip: tuple[str, ...] = (),
    ):
        self.carry, self.shape, self.out, self.work = carry, shape, out, work
        self.started, self.limits = time.time(), TIMEOUTS[shape]
        out.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        self.stock_env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.env, self.notes = environment(carry, work, shape)
        self.runner = Runner(
            out / "logs", self.env, work, self.started + (budget or self.limits["budget"])
        )
        self.jax = [sys.executable, str(HERE / "gpu" / "jax_worker.py")]
        self.torch = [torch_python or sys.executable, str(HERE / "gpu" / "torch_worker.py")]
        self.torch_missing = missing_torch(self.torch[0], self.stock_env)
        self.checkpoint = work / f"bert-{shape}"
        self.settings, self.results = SETTINGS[shape], {}
        self.skip = skip

    def run(self) -> dict:
        """Every stage, then the table printed and written under `out`."""
        self.ceilings()
        no_checkpoint = self.random_checkpoint()
        self.steps()
        self.finetune("sst2", no_checkpoint)
        self.finetune("sst2", no_checkpoint, key="finetune_sst2_warm")  # every program cached
        self.transformers_sst2(no_checkpoint)
        self.finetune("conll", no_checkpoint)
        return finish(self.results, self.shape, self.out, self.carry, self.notes, self.started)

    def stage(self, key, argv, timeout, skip=None, collect=None) -> dict:
        label = dict(ROWS)[key].format(*self.settings["sequence_lengths"])
        if any(key.startswith(prefix) for prefix in self.skip):
            skip = "left out (--skip)"
        # transformers runs in the machine's own environment, without the carry's wheels
        stage = Stage(
            key,
            label,
            argv,
            timeout,
            skip,
            env=self.stock_env if argv and argv[:2] == self.torch else None,
        )
        if collect:
            stage.collect = collect
        record = self.results[key] = self.runner.run(stage)
        print(f"    {record['status']} ({record.get('wall_seconds', 0):.1f} s)", flush=True)
        # what is done so far, should the machine be taken away before the table
        (self.out / "gpu_check.partial.json").write_text(json.dumps(self.results, default=str))
        return record

    def ceilings(self) -> None:
        """bf16 matmul through JAX and through torch (with the versions and devices)."""
        size = ["matmul", "--size", str(self.settings["matmul_size"])]
        self.stage("matmul_jax", self.jax + size, self.limits["matmul"])
        self.stage("matmul_torch", self.torch + size, self.limits["matmul"], self.torch_missing)

    def random_checkpoint(self) -> str | None:
        """A random BERT with the carry's vocabulary, written by transformers (else, or if
        that fails, with NumPy); returns why the stages that need it cannot run, or None."""
        arguments = [
            "checkpoint",
            "--shape",
            self.shape,
            "--tokenizer",
            str(self.carry / "tokenizer"),
            "--out",
            str(self.checkpoint),
        ]
        failed = None
        for writer in ([] if self.torch_missing else [self.torch]) + [self.jax]:
            shutil.rmtree(self.checkpoint, ignore_errors=True)
            made = self.stage("checkpoint", writer + arguments, self.limits["checkpoint"])
            if made["status"] == "ok":
                if failed:
                    made["writer"] += f" (transformers {failed})"
                return None
            failed = failed or made["status"]
        return "no checkpoint (its stage failed)"

    def steps(self) -> None:
        """Steady-state training steps, transformers then bertkit, at each length."""
        for who, argv in (("hf", self.torch), ("bertkit", self.jax)):
            for index, length in enumerate(self.settings["sequence_lengths"]):
                self.stage(
                    f"{who}_steps_{index}",
                    argv + ["steps", "--shape", self.shape, "--sequence-length", str(length)],
                    self.limits["steps"],
                    self.torch_missing if who == "hf" else None,
                )

    def finetune(self, name: str, no_checkpoint: str | None, key=None) -> None:
        """The whole `bertkit finetune --features` on JAX, TensorFlow blocked."""
        key = key or f"finetune_{name}"
        run_dir, features = self.work / f"{key}_run", self.carry / f"{name}.features.npz"
        shutil.rmtree(run_dir, ignore_errors=True)  # a run left there would be resumed
        self.stage(
            key,
            [
                sys.executable,
                str(HERE / "gpu" / "bertkit_without_tensorflow.py"),
                "finetune",
                str(self.carry / f"{name}.yaml"),
                "--features",
                str(features),
                "--set",
                f"backbone.preset={self.checkpoint}",
                "--output",
                str(run_dir),
            ],
            self.limits[key],
            no_checkpoint,
            finetune_figures(run_dir, features),
        )
        if (run_dir / "run.json").is_file():
            shutil.copy(run_dir / "run.json", self.out / "logs" / f"{key}.run.json")

    def transformers_sst2(self, no_checkpoint: str | None) -> None:
        """transformers' whole loop on the SST-2 recipe's epoch."""
        arguments, unreadable = hf_sst2_arguments(self.carry, self.checkpoint)
        self.stage(
            "hf_sst2",
            self.torch + arguments,
            self.limits["hf_sst2"],
            self.torch_missing or no_checkpoint or unreadable,
        )


def finish(results, shape, out, carry, notes, started) -> dict:
    """Figures derived, the table printed and written with the JSON of every figure."""
    sys.path.insert(1, str(HERE))
    try:
        from jax_train_throughput import training_flops_per_sequence
    except Exception as error:  # noqa: BLE001 (keras unusable: no MFU, the rest stays)
        notes.append(f"no FLOP counts (jax_train_throughput: {error})")
        training_flops_per_sequence = None
    peak = derive(results, SHAPES[shape], training_flops_per_sequence)
    lengths = SETTINGS[shape]["sequence_lengths"]
    text = table(results, lengths, header(shape, carry, results, notes, peak, started))
    print("\n" + text, flush=True)
    (out / "gpu_check.md").write_text(text + "\n")
    document = {
        "shape": shape,
        "model": SHAPES[shape],
        "settings": SETTINGS[shape],
        "peak_tflops": peak,
        "notes": notes,
        "rows": [key for key, _ in ROWS],
        "carry_manifest": _read_json(carry / "manifest.json"),
        "results": results,
        "seconds": time.time() - started,
    }
    (out / "gpu_check.json").write_text(json.dumps(document, indent=1, default=str))
    return document


def header(shape, carry, results, notes, peak, started) -> list[str]:
    jax, torch = results["matmul_jax"], results["matmul_torch"]
    versions = {**jax.get("versions", {}), **torch.get("versions", {})}
    commit = (_read_json(carry / "manifest.json") or {}).get("made_from", {})
    lines = [
        f"bertkit GPU check, shape {shape} ({SHAPES[shape]['num_layers']} layers, hidden "
        f"{SHAPES[shape]['hidden_dim']}), "
        f"{datetime.datetime.fromtimestamp(started):%Y-%m-%d %H:%M}",
        "",
        f"- device: {jax.get('device', '?')} (JAX platform {jax.get('platform', '?')}, "
        f"{jax.get('device_count', '?')} device(s)); torch: {torch.get('device', '-')}",
        "- versions: "
        + ", ".join(f"{k} {v}" for k, v in versions.items() if v)
        + f"; carry made at bertkit {commit.get('bertkit_commit', '?')[:10]}"
        + (
            f" with {commit['uncommitted_files']} uncommitted files"
            if commit.get("uncommitted_files")
            else ""
        ),
        f"- MFU: jax_train_throughput's training FLOPs / the matmul ceiling "
        f"({f'{peak:.3g} TFLOP/s' if peak else 'not measured'}); whole runs count real "
        "tokens only, over their training steps' seconds",
    ]
    platform = jax.get("platform", "unknown (the JAX ceiling's stage failed)")
    if shape == "tiny" or platform != "gpu":
        why = [f"JAX's platform is {platform}"] if platform != "gpu" else []
        lines.append(
            "- "
            + NOT_GPU.format(
                why="; ".join((["a dry run (--shape tiny)"] if shape == "tiny" else []) + why)
            )
        )
    return lines + [f"- note: {note}" for note in notes]


def environment(carry: Path, work: Path, shape: str) -> tuple[dict, list[str]]:
    """The stages' environment: JAX as Keras' backend, bertkit's compilation cache in the
    work folder (a fresh machine's: cold), and the carry's wheels where keras or bertkit
    is missing."""
    env = {
        **os.environ,
        "KERAS_BACKEND": "jax",
        "PYTHONUNBUFFERED": "1",
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "BERTKIT_COMPILATION_CACHE": str(work / "xla"),
    }
    if shape == "tiny" and FAST_COMPILE not in env.get("XLA_FLAGS", ""):
        # the dry run's figures mean nothing: compile without LLVM's costly passes
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {FAST_COMPILE}".strip()
    notes = []
    if bertkit_installed():
        return env, notes
    wheels = sorted((carry / "wheels").glob("*.whl"))
    if not wheels:
        return env, ["keras or bertkit is not installed and the carry has no wheels/"]
    wheels += [
        wheel
        for wheel in sorted((carry / "wheels" / "extra").glob("*.whl"))
        if importlib.util.find_spec(wheel.name.split("-")[0]) is None
    ]
    site = work / "site"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--upgrade",
            "--target",
            str(site),
            *map(str, wheels),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        notes.append(f"installing the wheels failed: {done.stderr.strip()[-200:]}")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    sys.path.insert(1, str(site))  # for the FLOP formula (jax_train_throughput imports keras)
    notes.append(
        f"installed from the carry into {site}: "
        + ", ".join(wheel.name.split("-")[0] for wheel in wheels)
    )
    return env, notes


def bertkit_installed() -> bool:
    return all(
        importlib.util.find_spec(name) for name in ("keras", "keras_hub", "bertkit")
    ) and bool(metadata.entry_points(group="bertkit.tasks"))


def missing_torch(python: str, env: dict) -> str | None:
    """None when `python` imports torch and transformers, else why the stages skip."""
    for name in ("torch", "transformers"):
        probe = subprocess.run(
            [
                python,
                "-c",
                f"import importlib.util as u, sys; sys.exit(u.find_spec({name!r}) is None)",
            ],
            env=env,
        )
        if probe.returncode:
            return f"{name} not installed"
    return None


def hf_sst2_arguments(carry: Path, checkpoint: Path) -> tuple[list[str], str | None]:
    """transformers' whole loop with the SST-2 recipe's length, batch, rate and epochs;
    or why the carry's recipe cannot be read."""
    import yaml

    try:
        recipe = yaml.safe_load((carry / "sst2.yaml").read_text())
        training, length = recipe["training"], recipe["backbone"]["sequence_length"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as error:
        return [], f"the carry's sst2.yaml cannot be read ({type(error).__name__})"
    return [
        "sst2",
        "--model",
        str(checkpoint),
        "--train",
        str(carry / "sst2" / "train.tsv.gz"),
        "--dev",
        str(carry / "sst2" / "dev.tsv.gz"),
        "--max-length",
        str(length),
        "--batch-size",
        str(training["batch_size"]),
        "--learning-rate",
        str(training["learning_rate"]),
        "--epochs",
        str(training["epochs"]),
    ], None


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sub = commands.add_parser("prepare", help="write the carry folder (needs TensorFlow)")
    sub.add_argument("--data", type=Path, required=True, help="with sst2/ and conll2003/")
    sub.add_argument("--out", type=Path, default=Path("gpu-carry"))
    sub.add_argument(
        "--preset",
        default=None,
        help="the checkpoint whose tokenizer featurizes (default: MiniLM, "
        "bert-base-uncased's vocabulary)",
    )
    sub.add_argument("--limit", type=int, help="only the first N rows/sentences of each file")
    sub.add_argument("--no-wheels", action="store_true", help="no wheels (a local dry run)")
    sub = commands.add_parser("run", help="every stage and the table (no TensorFlow)")
    sub.add_argument("--carry", type=Path, default=Path("gpu-carry"))
    sub.add_argument("--shape", choices=sorted(SHAPES), default="base")
    sub.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-check-out")))
    sub.add_argument(
        "--work",
        type=Path,
        help="checkpoint, runs, installed wheels (default: a new temporary folder)",
    )
    sub.add_argument(
        "--torch-python", help="an interpreter with torch and transformers (default: this one)"
    )
    sub.add_argument(
        "--budget", type=float, help="seconds for all stages (default: 570 for base, 1800 for tiny)"
    )
    sub.add_argument(
        "--skip",
        nargs="+",
        default=(),
        metavar="STAGE",
        help="stages left out, by their key or its start: "
        + ", ".join(key for key, _ in ROWS)
        + " (e.g. --skip matmul_torch finetune_conll)",
    )
    args = parser.parse_args()
    if args.command == "prepare":
        from carry import PRESET, prepare

        manifest = prepare(
            args.data,
            args.out,
            preset=args.preset or PRESET,
            limit=args.limit,
            wheels=not args.no_wheels,
        )
        print(json.dumps(manifest, indent=1))
        print(f"carry: {args.out} ({manifest['bytes'] / 2**20:.1f} MiB)")
        failed = [
            name
            for name, result in manifest.get("wheels", {}).items()
            if str(result).startswith("FAILED")
        ]
        if failed:
            raise SystemExit(
                f"gpu_check prepare: the carry lacks usable wheels for "
                f"{', '.join(failed)} (see manifest.json)"
            )
        return
    # as on the GPU machines: TensorFlow is absent for every stage and for this process
    sys.modules["tensorflow"] = sys.modules["tensorflow_text"] = None
    if not (args.carry / "manifest.json").is_file():
        raise SystemExit(
            f"gpu_check run: {args.carry} is not a carry folder (no manifest.json;"
            " make it with 'gpu_check.py prepare')"
        )
    work = args.work or Path(tempfile.mkdtemp(prefix="bertkit-gpu-check-"))
    Check(
        args.carry.resolve(),
        args.shape,
        args.out.resolve(),
        work.resolve(),
        args.torch_python,
        args.budget,
        tuple(args.skip),
    ).run()


if __name__ == "__main__":
    main()
