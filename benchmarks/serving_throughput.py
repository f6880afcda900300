"""Inference throughput: the exported raw-text SavedModel against the bare Keras model.

Both see the same sentences in the same batches. The bare model gets pre-tokenized,
padded inputs (tokenization excluded); the SavedModel gets raw strings and tokenizes,
packs, runs the model and decodes inside its graph. The ratio says what serving raw text
costs on top of the model itself.

    python benchmarks/serving_throughput.py runs/quickstart --data ../shared/data/sst2/dev.tsv
"""

from __future__ import annotations

import argparse
import csv
import time

import common  # noqa: F401  (first: it sets TensorFlow's environment)
import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401

import bertkit
from bertkit.padding import pad_batch


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--data", default="../shared/data/sst2/dev.tsv")
    parser.add_argument("--column", default="sentence")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    with open(args.data, encoding="utf-8", newline="") as handle:
        texts = [
            r[args.column] for r in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        ]
    batches = [texts[i : i + args.batch_size] for i in range(0, len(texts), args.batch_size)]
    loaded = bertkit.load(args.run_dir)
    task, model = loaded.task, loaded.model
    features = task.featurize([task.parse_input(t) for t in texts], training=False)
    lengths = features.lengths()
    padded = []
    for start in range(0, len(texts), args.batch_size):
        rows = np.arange(start, min(start + args.batch_size, len(texts)))
        longest = (int(lengths[rows].max()),)  # pad to the batch's own length, as serving does
        batch = pad_batch(features, rows, longest)
        padded.append({k: batch[k] for k in ("token_ids", "segment_ids", "padding_mask")})
    forward = tf.function(lambda inputs: model(inputs, training=False), reduce_retracing=True)
    serve = tf.saved_model.load(str(loaded.run.saved_model_dir)).signatures["serving_default"]

    def timed(run):
        run()  # warm up: traces and compiles
        best = float("inf")
        for _ in range(args.repeats):
            started = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - started)
        return len(texts) / best

    bare = timed(lambda: [forward(b) for b in padded][-1].numpy())
    served = timed(lambda: [serve(text=tf.constant(b))["label"] for b in batches][-1].numpy())
    print(f"{len(texts)} sentences, batch {args.batch_size}")
    print(f"bare Keras model (pre-tokenized): {bare:8.1f} seq/s")
    print(f"SavedModel on raw text:           {served:8.1f} seq/s")
    print(f"ratio SavedModel / bare model:    {served / bare:8.2f}")


if __name__ == "__main__":
    main()
