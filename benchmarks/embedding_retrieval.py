"""Question -> paragraph retrieval on SQuAD v1.1 dev: all-MiniLM-L6-v2 off the shelf, fine-tuned
by bertkit's `embedding` task, and fine-tuned by sentence-transformers 6, in one run.

Split by article, in the file's order: the questions of the first `--train-articles` articles,
each with its paragraph as the positive, are the training pairs (the first `--train-pairs`);
the questions of the other articles (the first `--eval-questions`) are each scored against all
paragraphs of those articles. Both toolkits train the same checkpoint on the same pairs with
MultipleNegativesRankingLoss (scale 20, in-batch negatives, random batches of `--batch-size`),
the same epochs, peak learning rate, warmup ratio (0.1), linear decay, weight decay (0.01),
gradient clipping (1.0), AdamW's epsilon (1e-8, transformers' default) and sequence length;
sentence-transformers runs in a subprocess with `--python` (torch never loads here). Every
model's vectors are scored here by the same functions (`bertkit_tasks.embedding
.retrieval_metrics`): MRR@10, recall@1, recall@10. Wall seconds: the whole `finetune` (load,
featurize, train, export off) for bertkit, the subprocess less its encoding (interpreter,
torch import, loading, `trainer.train()`) for sentence-transformers; encoding the evaluation
texts is timed apart for each.

    python benchmarks/embedding_retrieval.py --python /tmp/torchenv/bin/python --seeds 42 1 2
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
from common import PRESET, argument_parser, preset_folder, timed

from bertkit.serving.embedder import Embedder
from bertkit_tasks.embedding.retrieval_metrics import gold_ranks, mrr_at_k, recall_at_k

REFERENCE = Path(__file__).with_name("sentence_transformers_mnrl.py")


def split_squad(path: Path, train_articles: int, train_pairs: int, eval_questions: int):
    """(training pairs, evaluation questions, their gold paragraph index, paragraphs)."""
    articles = json.loads(path.read_text(encoding="utf-8"))["data"]
    pairs = [
        (qa["question"], paragraph["context"])
        for article in articles[:train_articles]
        for paragraph in article["paragraphs"]
        for qa in paragraph["qas"]
    ]
    paragraphs, questions, gold = [], [], []
    for article in articles[train_articles:]:
        for paragraph in article["paragraphs"]:
            paragraphs.append(paragraph["context"])
            for qa in paragraph["qas"]:
                questions.append(qa["question"])
                gold.append(len(paragraphs) - 1)
    rng = np.random.default_rng(0)  # the same pairs and questions for every model and seed
    pairs = [pairs[i] for i in rng.permutation(len(pairs))[:train_pairs]]
    picked = np.sort(rng.permutation(len(questions))[:eval_questions])
    return pairs, [questions[i] for i in picked], np.array(gold)[picked], paragraphs


def scores(queries: np.ndarray, passages: np.ndarray, gold: np.ndarray) -> dict:
    unit = lambda v: v / np.linalg.norm(v, axis=1, keepdims=True)  # noqa: E731
    ranks = gold_ranks(unit(queries) @ unit(passages).T, gold)
    return {
        "mrr_at_10": 100 * mrr_at_k(ranks, 10),
        "recall_at_1": 100 * recall_at_k(ranks, 1),
        "recall_at_10": 100 * recall_at_k(ranks, 10),
    }


def bertkit_run(args, seed: int, workdir: Path, texts: dict, gold) -> dict:
    import bertkit

    result = {"system": "bertkit", "seed": seed}
    with timed(result):
        bertkit.finetune(
            {
                "schema": 1,
                "task": "embedding",
                "backbone": {"preset": PRESET, "sequence_length": args.sequence_length},
                "data": {"train": str(workdir / "pairs.tsv")},
                "training": {
                    "epochs": args.epochs,
                    "batch_size": args.batch_size,
                    "batch_order": "random",
                    "learning_rate": args.learning_rate,
                    "adam_epsilon": 1e-8,
                    "seed": seed,
                },
                "export": {"saved_model": False},
            },
            output_dir=str(workdir / f"bertkit-{seed}"),
        )
    return {**result, **encoded(workdir / f"bertkit-{seed}", texts, gold)}


def encoded(source, texts: dict, gold) -> dict:
    embedder = Embedder.load(source)
    started = time.perf_counter()
    queries, passages = embedder.embed(texts["queries"]), embedder.embed(texts["passages"])
    return {"encode_seconds": time.perf_counter() - started, **scores(queries, passages, gold)}


def reference_run(args, seed: int, workdir: Path, gold, epochs: int) -> dict:
    out = workdir / f"st-{seed}-{epochs}.npz"
    command = [args.python, str(REFERENCE), "--model", str(preset_folder())]
    command += ["--train", str(workdir / "pairs.tsv"), "--texts", str(workdir / "texts.json")]
    command += ["--out", str(out), "--epochs", str(epochs), "--seed", str(seed)]
    command += ["--batch-size", str(args.batch_size), "--learning-rate", str(args.learning_rate)]
    command += ["--max-seq-length", str(args.sequence_length)]
    result = {"system": "sentence-transformers" if epochs else "off the shelf", "seed": seed}
    with timed(result):
        subprocess.run(command, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    saved = np.load(out)
    result["encode_seconds"] = float(saved["encode_seconds"])
    result["wall_seconds"] -= result["encode_seconds"]  # as bertkit's: loading and training
    return {**result, **scores(saved["queries"], saved["passages"], gold)}


def write_inputs(args, workdir: Path) -> np.ndarray:
    pairs, questions, gold, paragraphs = split_squad(
        args.data / "squad" / "dev-v1.1.json",
        args.train_articles,
        args.train_pairs,
        args.eval_questions,
    )
    one_line = lambda text: " ".join(text.split())  # noqa: E731 - TSV without quoting: no tabs or line ends
    rows = ["anchor\tpositive", *(f"{one_line(q)}\t{one_line(p)}" for q, p in pairs)]
    (workdir / "pairs.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    texts = {"queries": questions, "passages": paragraphs}
    (workdir / "texts.json").write_text(json.dumps(texts), encoding="utf-8")
    print(
        f"{len(pairs)} training pairs; {len(questions)} questions over {len(paragraphs)} "
        "paragraphs",
        flush=True,
    )
    return gold


def print_table(runs: list) -> None:
    print("\n| model | MRR@10 | recall@1 | recall@10 | wall s (training) | encode s | seeds |")
    print("|---|---|---|---|---|---|---|")
    for system in (
        "off the shelf",
        "off the shelf (bertkit embed)",
        "sentence-transformers",
        "bertkit",
    ):
        rows = [r for r in runs if r["system"] == system]
        if not rows:
            continue

        def cell(key, rows=rows):
            values = [r[key] for r in rows]
            spread = f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else ""
            return f"{statistics.mean(values):.2f}{spread}"

        wall = statistics.mean(r["wall_seconds"] for r in rows) if "seed" in rows[0] else 0
        print(
            f"| {system} | {cell('mrr_at_10')} | {cell('recall_at_1')} | "
            f"{cell('recall_at_10')} | {wall:.0f} | {cell('encode_seconds')} | {len(rows)} |"
        )


def parse_arguments():
    parser = argument_parser(__doc__, "folder holding squad/dev-v1.1.json")
    parser.add_argument("--train-articles", type=int, default=24)
    parser.add_argument("--train-pairs", type=int, default=2000)
    parser.add_argument("--eval-questions", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=2e-5)
    parser.add_argument("--sequence-length", type=int, default=256)
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 1, 2])
    parser.add_argument("--out", type=Path, help="JSON file of every run")
    return parser.parse_args()


def main() -> None:
    args = parse_arguments()
    runs = []
    with tempfile.TemporaryDirectory(prefix="embedding_retrieval-") as folder:
        workdir = Path(folder)
        gold = write_inputs(args, workdir)
        texts = json.loads((workdir / "texts.json").read_text(encoding="utf-8"))
        shelf = {"system": "off the shelf (bertkit embed)", "wall_seconds": 0}
        runs.append({**shelf, **encoded(PRESET, texts, gold)})
        runs.append(reference_run(args, 0, workdir, gold, epochs=0))
        for seed in args.seeds:
            runs.append(reference_run(args, seed, workdir, gold, args.epochs))
            runs.append(bertkit_run(args, seed, workdir, texts, gold))
            for run in runs[-2:]:
                print(json.dumps(run), flush=True)
            if args.out:
                args.out.write_text(json.dumps(runs, indent=1))
    print_table(runs)


if __name__ == "__main__":
    main()
