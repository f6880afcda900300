"""Chinese benchmarks: bertkit against transformers from the same random-weight Chinese BERT
(issue 50, item 7): CLUENER, Weibo NER and span QA (DRCD / CMRC 2018), seeds, wall times.

Both toolkits fine-tune the folder `benchmarks/chinese_bert.py` writes (a 2-layer, hidden-256
BERT with bert-base-chinese's vocabulary and random weights: small enough for CPU runs; its
scores say how well each toolkit trains from the same start, not what bert-base-chinese
reaches) with the same data and budget (`BUDGETS`: epochs, batch, lr, 10% warmup, weight
decay 0.01, clipping 1.0, sequence length). transformers is `benchmarks/hf_reference.py` in
`--python` (the torch venv); bertkit is `bertkit.finetune` in this process with its defaults
plus the recipe overrides in `BERTKIT` (the one place that names the Chinese options).

Rows (`--rows`):

    weibo    Weibo NER (`weibo_ner/`, revised 2nd version): the first column's trailing
             segmentation digit is dropped (a character a word) and the U+FFFD tokens, all
             tagged O, are left out, for both toolkits alike; train / dev / test as shipped.
             Entity F1 on the test file by `bertkit_tasks.tagging.conlleval`.
    cluener  CLUENER2020's training file (`cluener_train/train.json`, 10,748 lines) split in
             file order: the last 1,000 lines test, the 1,000 before them dev, the first
             8,748 train. bertkit reads the spans JSON itself (`data.format: spans`);
             transformers gets each line as a list of characters with IOB2 tags (written by
             `cluener_conll`; an entity overlapping an earlier one is left out of its tags, and
             counted). Both are scored by `span_f1`: exact (type, start, end) character spans
             against every gold span of the test lines; bertkit's from `predict` on the raw
             test texts, transformers' from its per-character tags.
    qa       span QA: training on DRCD dev (3,524 questions), evaluation on DRCD test (3,493)
             and the CMRC 2018 trial set (1,002); EM / F1 by the CMRC 2018 metric
             (`cmrc_scores`) on each toolkit's predictions, every gold answer kept.
             transformers' window overlap is `stride`; bertkit gets the step between windows
             that equals it for the median question (see `benchmarks/squad_qa.py`).

`--variant crf` / `crf_lr` trains bertkit's NER rows with the CRF head (`common.HEADS`;
issue 50, item 4), transformers unchanged; the summary names the variant beside the toolkit.

Every finished run is appended to `--out` (JSON) as it ends, with its wall seconds and the load
average (`os.getloadavg`) before and after it; the summary (mean ± sd over seeds) is printed as
a markdown table, also from saved files (`--summary FILE...`).

    python benchmarks/chinese_bert.py --python /work/venv-torch/bin/python --out /tmp/zh/bert
    python benchmarks/chinese.py --python /work/venv-torch/bin/python --model /tmp/zh/bert \\
        --rows weibo cluener qa --toolkits transformers bertkit --seeds 42 1 2 \\
        --out /tmp/zh/chinese.json
    python benchmarks/chinese.py --summary /tmp/zh/chinese.json
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from common import HEADS, argument_parser, run_reference, timed
from zh_scoring import cmrc_scores, span_f1, spans_from_tags

# The budget of each row, the same for both toolkits (random weights learn slowly: a high lr).
# Weibo, tuned once on transformers (seed 42, batch 32, lr 1e-3, dev F1 by epoch): 0.00 0.05
# 0.20 0.14 0.23 0.27 0.27 0.26 0.26 0.25 0.27 0.27 over 12 epochs; 3 epochs left both
# toolkits at all-O. On the shared 2-core machine (load 4: an epoch of Weibo took 136 s instead
# of 20 s) every row is cut to a few minutes a run: batch 16 (twice the steps an epoch), 2
# epochs; CLUENER and QA train on the first lines / questions only (not tuned).
BUDGETS = {
    "weibo": {"epochs": 2, "batch_size": 16, "learning_rate": 1e-3, "sequence_length": 128},
    "cluener": {
        "epochs": 2,
        "batch_size": 16,
        "learning_rate": 1e-3,
        "sequence_length": 128,
        "train_limit": 1000,
    },
    "qa": {
        "epochs": 1,
        "batch_size": 16,
        "learning_rate": 5e-4,
        "sequence_length": 256,
        "stride": 128,
        "train_limit": 200,
        "eval_limit": 100,
    },
}
# bertkit's recipe overrides per row (dotted keys): the options issue 50 adds. Their names
# follow the issue; change them here if they land under other names.
BERTKIT = {
    "weibo": {},
    "cluener": {"data.format": "spans", "task.text_words": "characters"},
    "qa": {"task.metric": "cmrc2018"},
}
WARMUP_RATIO = 0.1


# ---- data
def weibo_files(data: Path, workdir: Path) -> dict:
    """Weibo's files as `character<TAB>tag` CoNLL, U+FFFD tokens (all O) left out."""
    files = {}
    for split in ("train", "dev", "test"):
        lines = []
        source = data / "weibo_ner" / f"weiboNER_2nd_conll.{split}"
        for line in source.read_text(encoding="utf-8").split("\n"):
            if not line.strip():
                lines.append("")
                continue
            token, tag = line.split("\t")
            if token[0] == "\ufffd":
                assert tag == "O", line
                continue
            lines.append(f"{token[0]}\t{tag}")
        files[split] = workdir / f"weibo.{split}.conll"
        files[split].write_text("\n".join(lines).strip("\n") + "\n\n", encoding="utf-8")
    return files


def cluener_files(data: Path, workdir: Path, test: int = 1000, dev: int = 1000) -> dict:
    """CLUENER's lines split in file order (test last, dev before it), as spans JSON for
    bertkit and character CoNLL for transformers; the overlapping spans left out of the tags."""
    lines = (data / "cluener_train" / "train.json").read_text(encoding="utf-8").splitlines()
    parts = {
        "train": lines[: -(test + dev)],
        "dev": lines[-(test + dev) : -test],
        "test": lines[-test:],
    }
    files, dropped = {}, 0
    for split, part in parts.items():
        files[split] = workdir / f"cluener.{split}.json"
        files[split].write_text("\n".join(part) + "\n", encoding="utf-8")
        conll, left_out = cluener_conll(part)
        dropped += left_out
        files[f"{split}_conll"] = workdir / f"cluener.{split}.conll"
        files[f"{split}_conll"].write_text(conll, encoding="utf-8")
    files["overlapping_spans_left_out"] = dropped
    return files


def cluener_spans(line: str) -> tuple[str, set]:
    """A CLUENER line's text and its spans `(type, start, end)`, end exclusive."""
    record = json.loads(line)
    spans = {
        (type_, start, end + 1)
        for type_, entities in record.get("label", {}).items()
        for positions in entities.values()
        for start, end in positions
    }
    return record["text"], spans


def cluener_conll(lines: list[str]) -> tuple[str, int]:
    """One character a word with IOB2 tags; an entity overlapping an earlier one is left out."""
    blocks, left_out = [], 0
    for line in lines:
        text, spans = cluener_spans(line)
        tags = ["O"] * len(text)
        for type_, start, end in sorted(spans, key=lambda s: (s[1], s[2])):
            if any(tag != "O" for tag in tags[start:end]):
                left_out += 1
                continue
            tags[start:end] = [f"B-{type_}"] + [f"I-{type_}"] * (end - start - 1)
        blocks.append("\n".join(f"{char}\t{tag}" for char, tag in zip(text, tags, strict=True)))
    return "\n\n".join(blocks) + "\n\n", left_out


def qa_files(data: Path, workdir: Path, eval_limit: int | None = None) -> dict:
    """DRCD dev to train on; DRCD test and the CMRC trial set (or their first questions)."""
    return {
        "train": data / "drcd" / "DRCD_dev.json",
        "drcd_test": limited_squad(data / "drcd" / "DRCD_test.json", eval_limit, workdir),
        "cmrc_trial": limited_squad(
            data / "cmrc2018_trial" / "cmrc2018_trial.json", eval_limit, workdir
        ),
    }


def limited(path: Path, limit: int | None, workdir: Path) -> Path:
    """The first `limit` sentences (CoNLL) / lines (JSON lines) of `path`; all without a limit."""
    if not limit:
        return path
    text = path.read_text(encoding="utf-8")
    separator = "\n\n" if path.suffix == ".conll" else "\n"
    target = workdir / f"first{limit}.{path.name}"
    target.write_text(separator.join(text.split(separator)[:limit]) + separator, encoding="utf-8")
    return target


# ---- one run per toolkit
def reference_args(budget: dict, seed: int) -> dict:
    return {
        "epochs": budget["epochs"],
        "batch_size": budget["batch_size"],
        "learning_rate": budget["learning_rate"],
        "max_length": budget["sequence_length"],
        "warmup_ratio": WARMUP_RATIO,
        "seed": seed,
    }


def transformers_ner(args, row: str, files: dict, seed: int, folder: Path) -> dict:
    """transformers on the character CoNLL files; test F1 by the row's scorer."""
    from bertkit_tasks.tagging.conll import read_conll
    from bertkit_tasks.tagging.conlleval import evaluate

    suffix = "_conll" if row == "cluener" else ""
    split = {
        s: limited(files[f"{s}{suffix}"], args.limit if s == "train" else None, folder)
        for s in ("train", "dev", "test")
    }
    reference = run_reference(
        args.python,
        "ner",
        {"model": args.model, **split, **reference_args(BUDGETS[row], seed)},
        folder,
    )
    if row == "cluener":
        predicted = [spans_from_tags(tags) for tags in reference["test_tags"]]
        gold = [
            cluener_spans(line)[1]
            for line in files["test"].read_text(encoding="utf-8").splitlines()
        ]
        test = span_f1(gold, predicted)
    else:
        gold = [list(s.tags) for s in read_conll(files["test"])]
        test = evaluate(gold, reference["test_tags"])
    return {
        "test_f1": test["f1"],
        "test_precision": test["precision"],
        "test_recall": test["recall"],
        "test_truncated_words": reference.get("test_truncated_words"),
        "epoch_losses": reference.get("epoch_losses"),
        **{
            k: reference[k]
            for k in ("wall_seconds", "other_cores_busy", "train_seconds")
            if k in reference
        },
    }


def bertkit_recipe(args, row: str, data: dict, seed: int, task: dict) -> dict:
    budget = BUDGETS[row]
    recipe = {
        "schema": 1,
        "task": task,
        "backbone": {"preset": args.model, "sequence_length": budget["sequence_length"]},
        "data": data,
        "training": {
            "epochs": budget["epochs"],
            "batch_size": budget["batch_size"],
            "learning_rate": budget["learning_rate"],
            "warmup_ratio": WARMUP_RATIO,
            "seed": seed,
        },
        "export": {"saved_model": False},
    }
    overrides = {} if args.without_overrides else dict(BERTKIT[row])
    if row != "qa":
        overrides |= HEADS[args.variant]
    for key, value in overrides.items():
        section, name = key.split(".")
        recipe[section][name] = value
    return recipe


def bertkit_ner(args, row: str, files: dict, seed: int, folder: Path) -> dict:
    """bertkit on Weibo's CoNLL files or CLUENER's spans JSON; test F1 by the row's scorer."""
    import bertkit

    data = {
        "train": str(limited(files["train"], args.limit, folder)),
        "validation": str(files["dev"]),
        "test": str(files["test"]),
    }
    data |= {} if row == "cluener" else {"format": "conll", "scheme": "iob2"}
    recipe = bertkit_recipe(args, row, data, seed, {"name": "tagging", "scheme": "iob2"})
    result = {}
    with timed(result):
        bertkit.finetune(recipe, output_dir=folder / "bertkit-run", verbose=2)
    metrics = json.loads((folder / "bertkit-run" / "metrics.json").read_text())
    test = metrics["final"]["test"]
    if row == "cluener":  # raw-text predictions, scored as transformers' are
        lines = files["test"].read_text(encoding="utf-8").splitlines()
        texts, gold = zip(*(cluener_spans(line) for line in lines), strict=True)
        predictions = bertkit.load(folder / "bertkit-run").predict(list(texts))
        predicted = [
            {(e["type"], e["start"], e["end"]) for e in p["entities"]} for p in predictions
        ]
        result["bertkit_test_f1"] = test["f1"]  # its own evaluation of the test file
        test = span_f1(list(gold), predicted)
    return {
        "test_f1": test["f1"],
        "test_precision": test["precision"],
        "test_recall": test["recall"],
        "dev_f1": metrics["final"]["validation"]["f1"],
        "epochs_trained": len(metrics["epochs"]),
        "epoch_losses": [epoch["loss"] for epoch in metrics["epochs"]],
        "train_seconds": sum(epoch["train_seconds"] for epoch in metrics["epochs"]),
        **result,
    }


def transformers_qa(args, files: dict, seed: int, folder: Path) -> dict:
    budget = BUDGETS["qa"]
    evals = [files["drcd_test"], files["cmrc_trial"]]
    reference = run_reference(
        args.python,
        "qa",
        {
            "model": args.model,
            "train": limited_squad(files["train"], args.limit, folder),
            "eval": [str(p) for p in evals],
            "stride": budget["stride"],
            **reference_args(budget, seed),
        },
        folder,
    )
    scores = {
        name: cmrc_scores(path, reference["predictions_by_eval"][str(path)])
        for name, path in (("drcd_test", evals[0]), ("cmrc_trial", evals[1]))
    }
    return qa_row(scores) | {
        k: reference[k] for k in ("wall_seconds", "other_cores_busy", "train_seconds", "train_rows")
    }


def bertkit_qa(args, files: dict, seed: int, folder: Path) -> dict:
    import bertkit

    budget = BUDGETS["qa"]
    step = bertkit_doc_stride(args.model, files, budget["sequence_length"], budget["stride"])
    task = {
        "name": "span_qa",
        "version": "1.1",
        "doc_stride": step,
        "n_best_size": 20,
        "max_answer_length": 30,
    }
    data = {
        "train": str(limited_squad(files["train"], args.limit, folder)),
        "validation": str(files["drcd_test"]),
    }
    recipe = bertkit_recipe(args, "qa", data, seed, task)
    result = {"doc_stride_step": step}
    with timed(result):
        bertkit.finetune(recipe, output_dir=folder / "bertkit-run", verbose=2)
        model = bertkit.load(folder / "bertkit-run")
        scores = {}
        for name in ("drcd_test", "cmrc_trial"):
            model.evaluate(files[name], predictions_dir=folder / name)
            predictions = json.loads(
                (folder / name / "predictions.json").read_text(encoding="utf-8")
            )
            scores[name] = cmrc_scores(files[name], predictions)
    metrics = json.loads((folder / "bertkit-run" / "metrics.json").read_text())
    result["train_seconds"] = sum(epoch["train_seconds"] for epoch in metrics["epochs"])
    return qa_row(scores) | result


def qa_row(scores: dict) -> dict:
    row = {f"{name}_{key}": value[key] for name, value in scores.items() for key in ("em", "f1")}
    return row | {"test_f1": row["drcd_test_f1"]}


def limited_squad(path: Path, limit: int | None, workdir: Path) -> Path:
    """The first `limit` questions of a SQuAD-style file (all without a limit)."""
    if not limit:
        return path
    from common import split_questions

    target = workdir / f"first{limit}.{path.name}"
    split_questions(path, [limit], [target])
    return target


def bertkit_doc_stride(model: str, files: dict, sequence_length: int, overlap: int) -> int:
    """bertkit's step between windows equal to transformers' `overlap` for the median question."""
    import tensorflow as tf

    from bertkit.model.tokenizer import WordPieceTokenizer, read_vocabulary
    from bertkit_tasks.span_qa.squad import read_squad

    tokenizer = WordPieceTokenizer(read_vocabulary(Path(model) / "vocab.txt"), lowercase=True)
    questions = [
        e.question
        for key in ("train", "drcd_test", "cmrc_trial")
        for e in read_squad(files[key])[0]
    ]
    median = int(
        statistics.median(tokenizer.tokenize(tf.constant(questions)).row_lengths().numpy().tolist())
    )
    return sequence_length - 3 - median - overlap


# ---- the study
RUNNERS = {
    ("weibo", "transformers"): lambda a, f, s, d: transformers_ner(a, "weibo", f, s, d),
    ("weibo", "bertkit"): lambda a, f, s, d: bertkit_ner(a, "weibo", f, s, d),
    ("cluener", "transformers"): lambda a, f, s, d: transformers_ner(a, "cluener", f, s, d),
    ("cluener", "bertkit"): lambda a, f, s, d: bertkit_ner(a, "cluener", f, s, d),
    ("qa", "transformers"): transformers_qa,
    ("qa", "bertkit"): bertkit_qa,
}
SCORES = {
    "weibo": ["test_f1"],
    "cluener": ["test_f1"],
    "qa": ["drcd_test_em", "drcd_test_f1", "cmrc_trial_em", "cmrc_trial_f1"],
}


def summary_table(runs: list) -> str:
    """Markdown: per row and toolkit, mean ± sd over seeds of its scores (x 100) and wall s."""
    groups = {}
    for run in runs:
        toolkit = run["toolkit"] + (f" ({run['variant']})" if run.get("variant") else "")
        groups.setdefault((run["row"], toolkit), []).append(run)
    lines = [
        "| row | toolkit | seeds | scores (mean ± sd, x 100) | wall s | load (1-min avg) |",
        "|---|---|---|---|---|---|",
    ]
    for (row, toolkit), done in sorted(groups.items()):
        cells = []
        for key in SCORES[row]:
            values = [100 * run[key] for run in done]
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{key} {statistics.mean(values):.2f} ± {sd:.2f}")
        wall = statistics.mean(run["wall_seconds"] for run in done)
        load = statistics.mean(run["load_before"] for run in done)
        seeds = " ".join(str(run["seed"]) for run in done)
        lines.append(
            f"| {row} | {toolkit} | {seeds} | {'; '.join(cells)} | {wall:.0f} | {load:.2f} |"
        )
    return "\n".join(lines)


def parse_arguments():
    parser = argument_parser(
        __doc__, "folder holding weibo_ner/, cluener_train/, drcd/, cmrc2018_trial/"
    )
    parser.add_argument("--model", help="the Hugging Face folder chinese_bert.py wrote")
    parser.add_argument("--rows", nargs="+", choices=list(BUDGETS), default=list(BUDGETS))
    parser.add_argument(
        "--toolkits",
        nargs="+",
        choices=["transformers", "bertkit"],
        default=["transformers", "bertkit"],
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 1, 2])
    parser.add_argument(
        "--limit",
        type=int,
        default=None,
        help="train on the first N sentences / questions (a dry run)",
    )
    parser.add_argument(
        "--without-overrides",
        action="store_true",
        help="bertkit without `BERTKIT`'s options (a tree that lacks them; qa scores the same: "
        "both toolkits' predictions go through cmrc_scores)",
    )
    parser.add_argument(
        "--eval-limit",
        type=int,
        default=None,
        help="qa: evaluate on the first N questions of each file (a dry run)",
    )
    parser.add_argument(
        "--epochs", type=int, default=None, help="override every row's epochs (a dry run)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=None, help="override every row's batch size"
    )
    parser.add_argument(
        "--variant",
        choices=list(HEADS),
        default="softmax",
        help="bertkit's tagging head on the NER rows (`common.HEADS`); transformers is unchanged",
    )
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None, help="JSON file the runs are appended to")
    parser.add_argument(
        "--summary",
        type=Path,
        nargs="+",
        default=None,
        help="train nothing: the table of these files' runs",
    )
    return parser.parse_args()


def main():
    args = parse_arguments()
    if args.summary:
        runs = [run for path in args.summary for run in json.loads(path.read_text())["runs"]]
        return print(summary_table(runs))
    for budget in BUDGETS.values():
        budget["epochs"] = args.epochs or budget["epochs"]
        budget["batch_size"] = args.batch_size or budget["batch_size"]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bertkit-chinese-"))
    workdir.mkdir(parents=True, exist_ok=True)
    files = {
        "weibo": weibo_files,
        "cluener": cluener_files,
        "qa": lambda d, w: qa_files(d, w, args.eval_limit),
    }
    out = args.out or workdir / "chinese.json"
    record = json.loads(out.read_text()) if out.exists() else {"benchmark": "chinese", "runs": []}
    record.update(
        budgets=BUDGETS, bertkit_overrides=BERTKIT, model=args.model, python=sys.executable
    )
    cli_limits = args.limit, args.eval_limit
    for row in args.rows:
        # a row's own train / eval limits (`BUDGETS`) unless the command line gives one
        args.limit = cli_limits[0] or BUDGETS[row].get("train_limit")
        args.eval_limit = cli_limits[1] or BUDGETS[row].get("eval_limit")
        row_files = files[row](args.data, workdir)
        for seed in args.seeds:
            for toolkit in args.toolkits:
                folder = Path(tempfile.mkdtemp(prefix=f"{row}-{toolkit}-{seed}-", dir=workdir))
                load_before = os.getloadavg()[0]
                result = RUNNERS[row, toolkit](args, row_files, seed, folder)
                run = {
                    "row": row,
                    "toolkit": toolkit,
                    "seed": seed,
                    "limit": args.limit,
                    "eval_limit": args.eval_limit,
                    "without_overrides": args.without_overrides,
                    "variant": args.variant if toolkit == "bertkit" and row != "qa" else None,
                    "epochs": BUDGETS[row]["epochs"],
                    "batch_size": BUDGETS[row]["batch_size"],
                    "load_before": load_before,
                    "load_after": os.getloadavg()[0],
                    **result,
                }
                record["runs"].append(run)
                out.write_text(json.dumps(record, indent=1))
                print(
                    f"{row} {toolkit} seed {seed}: test F1 {result['test_f1']:.4f}, "
                    f"{result['wall_seconds']:.0f} s, load {load_before:.2f}",
                    flush=True,
                )
    print(summary_table(record["runs"]))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
