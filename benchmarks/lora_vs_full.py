"""LoRA and a frozen encoder (BERT's feature-based approach) against full fine-tuning on the
same data, budget and seeds.

Modes: `full`; `lora` (`training.lora`); `frozen` (`backbone.trainable: false`, the head reads
the last layer); `frozen_last4` (frozen, the head reads the last four layers concatenated:
`backbone.features`, the paper's best feature-based CoNLL setting, with bertkit's dense tagging
head where the paper had a BiLSTM). A frozen encoder takes its own learning rate
(`--frozen-learning-rate`); `frozen_last4` trains unpacked (packed training reads the last
layer only), the other CoNLL modes packed as recipes/ner.yaml.

Per run: the dev metric (and test F1 for CoNLL-2003; SST-2's test labels are not public),
the weights that trained, the mean step time (steps after the first, which traces) and the
peak resident memory of the process. Each run is `bertkit finetune` in a child process of
its own, so the peak (`ru_maxrss`) is that run's. Same MiniLM checkpoint, epochs, batch size,
schedule and seeds for both; LoRA takes its own peak learning rate (`--lora-learning-rate`),
as LoRA wants a larger one.

    python benchmarks/lora_vs_full.py --corpus sst2 --train-size 4000 --seeds 42 1 2
    python benchmarks/lora_vs_full.py --corpus sst2 --train-size 0 --epochs 1 --seeds 42 \
        --batch-order length_buckets
    python benchmarks/lora_vs_full.py --corpus conll --train-size 4000 --seeds 42 1 2
    python benchmarks/lora_vs_full.py --corpus conll --train-size 4000 --seeds 42 1 2 \
        --modes full frozen frozen_last4
    python benchmarks/lora_vs_full.py --merge a.json b.json     # the table of earlier runs
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import PRESET, argument_parser, timed, write_first_sentences

SEQUENCE_LENGTH = {"sst2": 64, "conll": 128}  # sst2_classification.py's and recipes/ner.yaml's
MODES = ("full", "lora", "frozen", "frozen_last4")


def recipe_for(args, mode: str, seed: int, files: dict) -> dict:
    """The recipe of one run; `mode` is full or lora."""
    if args.corpus == "sst2":
        task = "classification"
        data = {"train": str(files["train"]), "validation": str(files["dev"]), "text": "sentence"}
    else:
        task = {"name": "tagging", "scheme": "iob2"}
        data = {**{split: str(path) for split, path in files.items()}, "format": "conll"}
        data["validation"] = data.pop("dev")
    training = {
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "learning_rate": args.learning_rate,
        "seed": seed,
        "batch_order": args.batch_order,
        "packing": args.corpus == "conll",  # as recipes/ner.yaml
    }
    backbone = {"preset": PRESET, "sequence_length": SEQUENCE_LENGTH[args.corpus]}
    if mode == "lora":
        training["learning_rate"] = args.lora_learning_rate
        training["lora"] = {"rank": args.rank, "alpha": args.alpha, "targets": args.targets}
    if mode.startswith("frozen"):
        training["learning_rate"] = args.frozen_learning_rate
        backbone["trainable"] = False
    if mode == "frozen_last4":
        backbone["features"] = {"layers": [-4, -3, -2, -1], "combine": "concat"}
        training["packing"] = False
    return {
        "schema": 1,
        "task": task,
        "backbone": backbone,
        "data": data,
        "training": training,
        "export": {"saved_model": False},  # the export is the same for both
    }


def child(recipe_file: str, run_dir: str) -> None:
    """In the child process: fine-tunes, then prints the weight counts and peak memory."""
    import bertkit

    recipe = json.loads(Path(recipe_file).read_text())
    finetuned = bertkit.finetune(recipe, output_dir=run_dir, verbose=2)
    weights = sum(int(w.numpy().size) for w in finetuned.model.weights)
    trainable = weights  # the loaded model trains everything; a frozen run trained its head
    if not recipe["backbone"].get("trainable", True):
        encoder = ("token_embedding", "position_embedding", "segment_embedding", "embeddings_")
        encoder += ("transformer_layer_", "pooled_dense")
        head = [w for w in finetuned.model.weights if not w.path.startswith(encoder)]
        trainable = sum(int(w.numpy().size) for w in head)
    lora = json.loads((Path(run_dir) / "model" / "task.json").read_text()).get("lora")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(
        "RESULT "
        + json.dumps(
            {
                "weights": weights,
                "trainable_weights": lora["trainable_weights"] if lora else trainable,
                "peak_memory_mb": round(peak),
            }
        ),
        flush=True,
    )


def run(args, mode: str, seed: int, files: dict, workdir: Path) -> dict:
    run_dir = workdir / f"{mode}-{seed}"
    recipe_file = workdir / f"{mode}-{seed}.json"
    recipe_file.write_text(json.dumps(recipe_for(args, mode, seed, files)))
    result = {"mode": mode, "seed": seed}
    with timed(result):
        finished = subprocess.run(
            [sys.executable, __file__, "--child", str(recipe_file), str(run_dir)],
            stdout=subprocess.PIPE,
            text=True,
        )
    if finished.returncode:
        raise SystemExit(f"{mode} seed {seed}: bertkit finetune failed ({finished.returncode})")
    (line,) = [x for x in finished.stdout.splitlines() if x.startswith("RESULT ")]
    result.update(json.loads(line.removeprefix("RESULT ")))
    final = json.loads((run_dir / "metrics.json").read_text())["final"]
    phases = json.loads((run_dir / "run.json").read_text())["phases"]
    steps = steps_trained(json.loads((run_dir / "steps.json").read_text())["steps"])
    result["step_seconds"] = phases["train_steps"] / max(steps - 1, 1)
    result["steps"] = steps
    if args.corpus == "sst2":
        result["dev"] = final["validation"]["accuracy"]
    else:
        result["dev"], result["test"] = final["validation"]["f1"], final["test"]["f1"]
    return result


def steps_trained(records: list) -> int:
    """The training steps of a run from its `steps.json` records, which are kept every
    few steps (about 50 an epoch) and always at each epoch's last step (its count).

        >>> steps_trained([{"epoch": 1, "step": 2}, {"epoch": 1, "step": 3},
        ...                {"epoch": 2, "step": 2}, {"epoch": 2, "step": 3}])
        6
    """
    last = {}
    for record in records:
        last[record["epoch"]] = max(last.get(record["epoch"], 0), record["step"])
    return sum(last.values())


def write_files(args, workdir: Path) -> dict:
    size = args.train_size or None
    if args.corpus == "sst2":
        source = args.data / "sst2"
        lines = (source / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
        train = workdir / "train.tsv"
        train.write_text("".join(lines[: size + 1] if size else lines), encoding="utf-8")
        return {"train": train, "dev": source / "dev.tsv"}
    source = args.data / "conll2003"
    write_first_sentences(source / "train.txt", workdir / "train.txt", size)
    return {"train": workdir / "train.txt", "dev": source / "dev.txt", "test": source / "test.txt"}


def summary(record: dict) -> list[dict]:
    """One row per mode: mean ± sd over seeds of the scores, means of the costs."""
    rows = []
    for mode in MODES:
        runs = [r for r in record["runs"] if r["mode"] == mode]
        if not runs:
            continue
        row = {"mode": mode, "seeds": [r["seed"] for r in runs]}
        for key in ("dev", "test"):
            values = [r[key] for r in runs if key in r]
            if values:
                row[key] = [100 * v for v in values]
        for key in ("trainable_weights", "weights", "step_seconds", "peak_memory_mb"):
            row[key] = statistics.mean(r[key] for r in runs)
        row["wall_seconds"] = statistics.mean(r["wall_seconds"] for r in runs)
        rows.append(row)
    return rows


def print_table(record: dict) -> None:
    settings = record["settings"]
    print(
        f"\n{settings['corpus']}, {settings['train_size'] or 'all'} training sentences, "
        f"{settings['epochs']} epochs, batch {settings['batch_size']}, lr full "
        f"{settings['learning_rate']} / LoRA {settings['lora_learning_rate']} / frozen "
        f"{settings.get('frozen_learning_rate', '-')}, LoRA rank "
        f"{settings['rank']}, alpha {settings['alpha']} on {', '.join(settings['targets'])}"
    )

    def scores(values):
        if values is None:
            return "-"
        spread = f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else ""
        each = f" ({', '.join(f'{v:.2f}' for v in values)})" if len(values) > 1 else ""
        return f"{statistics.mean(values):.2f}{spread}{each}"

    print("| run | dev | test | trainable weights | step s | peak memory MB | wall s | seeds |")
    print("|---|---|---|---|---|---|---|---|")
    for row in summary(record):
        share = 100 * row["trainable_weights"] / row["weights"]
        print(
            f"| {row['mode']} | {scores(row.get('dev'))} | {scores(row.get('test'))} | "
            f"{row['trainable_weights'] / 1e6:.3g}M ({share:.3g}%) | {row['step_seconds']:.3f} | "
            f"{row['peak_memory_mb']:,.0f} | {row['wall_seconds']:,.0f} | {len(row['seeds'])} |"
        )


def parse_arguments():
    parser = argument_parser(__doc__, "folder holding sst2/ and conll2003/", reference=False)
    parser.add_argument("--corpus", choices=["sst2", "conll"], default="sst2")
    parser.add_argument("--train-size", type=int, default=4000, help="first N sentences; 0: all")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=5e-5, help="full fine-tuning's")
    parser.add_argument("--lora-learning-rate", type=float, default=5e-4)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=16.0)
    parser.add_argument("--targets", nargs="+", default=["query", "value"])
    parser.add_argument(
        "--batch-order",
        choices=["random", "length_buckets"],
        default="random",
        help="random (as transformers' Trainer) or bertkit's default, whose batches of one length "
        "bucket pad less (SST-2's full training set: 1.5M padded tokens an epoch against 3.9M)",
    )
    parser.add_argument(
        "--frozen-learning-rate", type=float, default=1e-3, help="the frozen modes' (a head alone)"
    )
    parser.add_argument("--modes", nargs="+", choices=MODES, default=["full", "lora"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 1, 2])
    parser.add_argument("--out", type=Path, default=None, help="JSON file of every run")
    parser.add_argument("--merge", type=Path, nargs="+", help="only the table of these files")
    return parser.parse_args()


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(*sys.argv[2:4])
        return
    args = parse_arguments()
    if args.merge:
        records = [json.loads(path.read_text()) for path in args.merge]
        print_table({**records[0], "runs": [r for record in records for r in record["runs"]]})
        return
    settings = {
        key: getattr(args, key)
        for key in (
            *("corpus", "train_size", "epochs", "batch_size", "learning_rate"),
            *("lora_learning_rate", "rank", "alpha", "targets", "batch_order"),
            "frozen_learning_rate",
        )
    }
    record = {"settings": settings, "runs": []}
    with tempfile.TemporaryDirectory(prefix="lora_vs_full-") as folder:
        workdir = Path(folder)
        files = write_files(args, workdir)
        for seed in args.seeds:
            for mode in args.modes:
                record["runs"].append(run(args, mode, seed, files, workdir))
                print(json.dumps(record["runs"][-1]), flush=True)
                if args.out:
                    args.out.write_text(json.dumps(record, indent=1))
    print_table(record)


if __name__ == "__main__":
    main()
