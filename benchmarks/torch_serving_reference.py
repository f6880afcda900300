"""The stack a user would otherwise serve with: transformers + PyTorch on the same model.

Run by `benchmarks/serve_load.py --torch-python PYTHON` in that interpreter (torch and
transformers; bertkit never imports torch), on the run's transformers export (`bertkit
export RUN --format transformers`): `AutoTokenizer` + `AutoModelForSequenceClassification`
in a loop, one sentence a call (tokenize, forward under `torch.inference_mode`, softmax,
label), eagerly and `torch.compile`d (its compile time apart), and in batches of
`--batch`. Prints one JSON object: the rows (latencies in seconds) and the dev accuracy.

    python benchmarks/torch_serving_reference.py FOLDER DEV.tsv --text sentence --label label
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("dev")
    parser.add_argument("--text", default="sentence")
    parser.add_argument("--label", default="label")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.set_num_threads(os.cpu_count())
    tokenizer = AutoTokenizer.from_pretrained(args.folder)
    model = AutoModelForSequenceClassification.from_pretrained(args.folder).eval()
    with open(args.dev, encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    texts, labels = [r[args.text] for r in rows], [r[args.label] for r in rows]
    names = model.config.id2label

    def classify(model, batch: list) -> list:
        encoded = tokenizer(
            batch, truncation=True, max_length=64, padding=True, return_tensors="pt"
        )
        with torch.inference_mode():
            probabilities = model(**encoded).logits.softmax(-1)
        return [names[int(i)] for i in probabilities.argmax(-1)]

    result = {"torch": torch.__version__, "accuracy": _accuracy(classify, model, texts, labels)}
    result["rows"] = [
        _timed("transformers + torch, eager", classify, model, texts, args.requests, 1),
        _timed(
            f"transformers + torch, eager, batches of {args.batch}",
            classify,
            model,
            texts,
            args.requests // args.batch * args.batch,
            args.batch,
        ),
    ]
    started = time.perf_counter()
    try:
        compiled = torch.compile(model)
        classify(compiled, texts[:1])
        row = _timed("transformers + torch.compile", classify, compiled, texts, args.requests, 1)
        row["compile_seconds"] = round(time.perf_counter() - started, 1)
    except Exception as error:  # noqa: BLE001 - reported in the table, not fatal
        row = {"how": "transformers + torch.compile", "failed": f"{type(error).__name__}: {error}"}
    result["rows"].append(row)
    print(json.dumps(result))


def _accuracy(classify, model, texts: list, labels: list) -> float:
    predicted = [p for i in range(0, len(texts), 64) for p in classify(model, texts[i : i + 64])]
    return sum(p == label for p, label in zip(predicted, labels, strict=True)) / len(labels)


def _timed(name: str, classify, model, texts: list, count: int, batch: int) -> dict:
    """`count` sentences, `batch` a call: each call's seconds, the CPU seconds and wall."""
    for i in range(5):  # warm up
        classify(model, texts[i * batch : (i + 1) * batch])
    latencies, cpu, started = [], time.process_time(), time.perf_counter()
    for first in range(0, count, batch):
        batch_texts = [texts[(first + j) % len(texts)] for j in range(batch)]
        start = time.perf_counter()
        classify(model, batch_texts)
        latencies.append(time.perf_counter() - start)
    wall = time.perf_counter() - started
    return {
        "how": name,
        "batch": batch,
        "latencies": latencies,
        "wall_seconds": wall,
        "sentences": count,
        "cores_used": round((time.process_time() - cpu) / wall, 2),
    }


if __name__ == "__main__":
    main()
