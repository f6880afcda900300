"""The sentence-transformers side of `benchmarks/embedding_retrieval.py`.

Run with a Python that has torch and sentence-transformers 6 (never bertkit's): fine-tunes
a sentence-transformers folder with `MultipleNegativesRankingLoss` (scale 20, in-batch
negatives) through `SentenceTransformerTrainer`, with the budget it is given, then encodes
the queries and passages of a JSON file and writes their vectors and the timings to an
`.npz` file. `--epochs 0` encodes with the checkpoint as it is.

    /tmp/torchenv/bin/python benchmarks/sentence_transformers_mnrl.py --model FOLDER \\
        --train pairs.tsv --texts eval.json --out st.npz --seed 42
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
import time

import numpy as np


def read_pairs(path) -> dict:
    with open(path, encoding="utf-8", newline="") as file:
        rows = list(csv.DictReader(file, delimiter="\t", quoting=csv.QUOTE_NONE))
    return {"anchor": [r["anchor"] for r in rows], "positive": [r["positive"] for r in rows]}


def train(model, args) -> float:
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    with tempfile.TemporaryDirectory() as folder:
        settings = SentenceTransformerTrainingArguments(
            output_dir=folder,
            num_train_epochs=args.epochs,
            per_device_train_batch_size=args.batch_size,
            learning_rate=args.learning_rate,
            warmup_ratio=args.warmup_ratio,
            weight_decay=0.01,
            max_grad_norm=1.0,
            lr_scheduler_type="linear",
            seed=args.seed,
            data_seed=args.seed,
            save_strategy="no",
            report_to="none",
            logging_steps=50,
            use_cpu=True,
        )
        trainer = SentenceTransformerTrainer(
            model=model,
            args=settings,
            train_dataset=Dataset.from_dict(read_pairs(args.train)),
            loss=MultipleNegativesRankingLoss(model, scale=20.0),
        )
        started = time.perf_counter()
        trainer.train()
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("--model", "--train", "--texts", "--out"):
        parser.add_argument(name, required=name != "--train")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=2e-5)
    parser.add_argument("--warmup-ratio", type=float, default=0.1)
    parser.add_argument("--max-seq-length", type=int, default=256)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    started = time.perf_counter()
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(args.model, device="cpu")
    model.max_seq_length = args.max_seq_length
    train_seconds = train(model, args) if args.epochs else 0.0
    texts = json.loads(open(args.texts, encoding="utf-8").read())
    encoding = time.perf_counter()
    vectors = {name: model.encode(texts[name], batch_size=64) for name in ("queries", "passages")}
    np.savez(
        args.out,
        **vectors,
        train_seconds=train_seconds,
        encode_seconds=time.perf_counter() - encoding,
        wall_seconds=time.perf_counter() - started,
    )


if __name__ == "__main__":
    main()
