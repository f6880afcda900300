"""Domain adaptation with the `mlm` task: held-out perplexity before and after, tokens/second.

Builds a corpus from SST-2 training sentences (documents of consecutive sentences, BERT's
one-sentence-a-line format), holds out 5% of the documents, evaluates the MiniLM checkpoint on
them before training, adapts it with `bertkit finetune` (masked LM + next-sentence prediction)
and reports the held-out perplexity after, plus training throughput in tokens/second
(non-padding tokens of the training instances / time inside `fit`).

Note: the MiniLM package ships no pretraining heads, so the "before" model has a freshly
initialised MLM head; its perplexity shows where the run starts, not the encoder's quality.

    python benchmarks/mlm_adaptation.py --data ../shared/data/sst2 --sentences 6000
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
from pathlib import Path

from common import PRESET

import bertkit
from bertkit.recipes.recipe import load_recipe
from bertkit.serving.inference import predict_rows
from bertkit.training.trainer import TaskData


def write_corpus(sst2_dir: Path, count: int, per_document: int, path: Path) -> None:
    with open(sst2_dir / "train.tsv", encoding="utf-8", newline="") as handle:
        rows = [
            r["sentence"].strip()
            for r in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        ]
    lines = []
    for i, sentence in enumerate(rows[:count]):
        if i and i % per_document == 0:
            lines.append("")
        lines.append(sentence)
    path.write_text("\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data/sst2")
    parser.add_argument("--sentences", type=int, default=6000)
    parser.add_argument("--per-document", type=int, default=10)
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="bertkit-mlm-bench-"))
    write_corpus(Path(args.data), args.sentences, args.per_document, workdir / "corpus.txt")
    recipe = load_recipe(
        {
            "schema": 1,
            "task": "mlm",
            "backbone": {"preset": PRESET, "sequence_length": args.sequence_length},
            "data": {"train": str(workdir / "corpus.txt")},
            "training": {
                "epochs": args.epochs,
                "batch_size": args.batch_size,
                "learning_rate": args.learning_rate,
            },
            "output_dir": str(workdir / "run"),
        }
    )

    # ---- before: the checkpoint as loaded, on the held-out documents
    data = TaskData.read(recipe)
    model = data.task.build_model(data.pretrained.backbone)
    data.task.initialize_head(model, data.pretrained.checkpoint_tensors())
    outputs = predict_rows(
        data.task,
        model,
        data.validation_features,
        2 * args.batch_size,
        tuple(data.description["bucket_lengths"]),
    )
    before = data.task.evaluate(
        data.validation, data.task.decode(data.validation, data.validation_features, outputs)
    )
    train_tokens = int(sum(data.train_features.lengths()))

    # ---- adapt
    bertkit.finetune(recipe, verbose=2)
    metrics = json.loads((workdir / "run" / "metrics.json").read_text())
    after = metrics["final"]["validation"]
    seconds = sum(e["train_seconds"] for e in metrics["epochs"])
    print(
        f"\nMLM adaptation of MiniLM on {args.sentences} SST-2 sentences "
        f"({len(data.train_features)} training instances of <= {args.sequence_length} "
        f"pieces, {len(data.validation_features)} held-out), {args.epochs} epoch(s)"
    )
    for name, result in (("before", before), ("after", after)):
        print(
            f"{name:7} perplexity {result['perplexity']:10.2f}   masked accuracy "
            f"{result['masked_accuracy']:.4f}   NSP accuracy {result['nsp_accuracy']:.4f}"
        )
    print(
        f"training: {args.epochs * train_tokens / seconds:.0f} tokens/s "
        f"({args.epochs * len(data.train_features) / seconds:.1f} sequences/s)"
    )
    print(
        json.dumps(
            {
                "before": before,
                "after": after,
                "train_seconds": seconds,
                "train_tokens": train_tokens * args.epochs,
            }
        )
    )


if __name__ == "__main__":
    main()
