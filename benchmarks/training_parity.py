"""Training parity: bertkit's fine-tuning step against transformers + PyTorch on the same batches.

Seed-to-seed noise in short runs (several F1 points on 1,000 CoNLL-2003 sentences) hides any
small systematic difference between two trainers. This benchmark removes the noise instead of
averaging it: both systems start from the same weights, including the same random tagging
head, see the same batches in the same order (bertkit's `TrainingBatches`, micro-batches
included), and train with dropout off, so any difference left is a difference in the
training computation itself: model, loss and its normalization over micro-batches,
gradient accumulation, clipping, AdamW, weight decay groups and the learning-rate schedule.

bertkit trains with Keras `fit` exactly as `bertkit finetune` does (its optimizer, `SetEpoch`
callback, tf.data input); the reference, `hf_reference.py replay`, runs a plain PyTorch loop
over the same batches with `BertForTokenClassification`, AdamW and
`get_linear_schedule_with_warmup`, summing each micro-batch's token losses over the whole
batch's labelled tokens before one optimizer step. Printed: the training loss of both after
every few micro-batches (Keras' running mean per epoch, the same mean for the reference), the
largest difference, and the dev entity F1 of both trained models, each predicted by its own
code and scored by bertkit's conlleval (argmax decoding).

Measured on this machine (1,000 sentences, 2 epochs, batch 32, 4 micro-batches, lr 5e-5,
seed 1): the losses of all 256 micro-batches agree to 3.6e-6, dev F1 0.4415 against 0.4413 (8
of 51,362 dev words tagged differently: bertkit reads long sentences in windows, the reference
cuts them at 128 pieces).

With `--dropout 0.1` both keep the checkpoint's dropout (and the head's) on: the same head and
batches, different masks. On 4,000 sentences (seed 2) the losses stayed within 1e-3 through
the first epoch and the dev F1 was 0.7474 against 0.7502.

    python benchmarks/training_parity.py --python /tmp/hfenv/bin/python
    python benchmarks/training_parity.py --python /tmp/hfenv/bin/python --corpus wnut16 \
        --train-size 0 --epochs 3 --micro-batches 1 --dropout 0.1 --seed 3
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np  # noqa: I001  (after common: it sets TensorFlow's environment)
from common import REFERENCE, argument_parser, preset_folder, write_first_sentences

CORPORA = {"conll2003": ("train.txt", "dev.txt"), "wnut16": ("train.conll", "dev.conll")}


def without_dropout(folder: Path) -> Path:
    """A copy of the Hugging Face checkpoint folder with every dropout rate set to 0."""
    shutil.copytree(preset_folder(), folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def train_bertkit(args, checkpoint: Path, train_file: Path, dev_file: Path, out: Path) -> dict:
    """Fits bertkit's tagger as `finetune` does; writes the batches and head for the replay."""
    import keras

    from bertkit.model.backbone import load_pretrained
    from bertkit.recipes.recipe import load_recipe
    from bertkit.serving.inference import predict_rows
    from bertkit.training.callbacks import SetEpoch
    from bertkit.training.optimization import make_optimizer
    from bertkit.training.trainer import batch_plan
    from bertkit_tasks.tagging.conlleval import evaluate

    recipe = load_recipe(
        {
            "schema": 1,
            "task": {"name": "tagging", "dropout": args.dropout, "decoding": "argmax"},
            "backbone": {"preset": str(checkpoint), "sequence_length": args.sequence_length},
            "data": {"train": str(train_file), "format": "conll"},
            "training": {
                "epochs": args.epochs,
                "batch_size": args.batch_size,
                "learning_rate": args.learning_rate,
                "seed": args.seed,
                "batch_order": "random",
                "micro_batches": args.micro_batches,
            },
        }
    )
    keras.utils.set_random_seed(args.seed)
    pretrained = load_pretrained(str(checkpoint), sequence_length=args.sequence_length)
    task = recipe.task_class()(
        recipe.task_options, recipe.data, pretrained.tokenizer, args.sequence_length
    )
    train = task.read(str(train_file))
    task.state = task.fit_state(train)
    batches = batch_plan(recipe).training_batches(task, task.featurize(train, training=True))
    model = task.build_model(pretrained.backbone)
    head = model.get_layer("tagger")
    kernel = np.random.default_rng(args.seed).normal(0, 0.02, head.kernel.shape)
    head.kernel.assign(kernel.astype("float32"))
    replay = {
        "kernel": kernel.astype("float32"),
        "labels": np.array(task.labels),
        "steps_per_epoch": len(batches),
        "epochs": args.epochs,
        "micro_batches": args.micro_batches,
    }
    for epoch in range(args.epochs):  # the batches fit will see, in order
        batches.set_epoch(epoch)
        for step in range(len(batches)):
            inputs, targets, weights = batches.batch(step)
            index = epoch * len(batches) + step
            replay[f"token_ids_{index}"] = inputs["token_ids"]
            replay[f"padding_mask_{index}"] = inputs["padding_mask"]
            replay[f"labels_{index}"] = np.where(weights > 0, targets, -100)
    np.savez(out / "replay.npz", **replay)
    batches.set_epoch(0)

    losses = []

    class RecordLoss(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            losses.append(float(logs["loss"]))

    model.compile(
        optimizer=make_optimizer(recipe.training, len(batches)),
        loss=task.loss(),
        weighted_metrics=task.metrics(),
        jit_compile=False,
    )
    model.fit(
        batches.as_dataset(),
        epochs=args.epochs,
        verbose=0,
        shuffle=False,
        callbacks=[SetEpoch(batches), RecordLoss()],
    )
    dev = task.read(str(dev_file))
    features = task.featurize(dev, training=False)
    outputs = predict_rows(task, model, features, 64, batches.plan.buckets)
    predictions = task.decode(dev, features, outputs)
    return {
        "losses": losses,
        "dev_f1": evaluate([list(s.tags) for s in dev], [p["tags"] for p in predictions])["f1"],
        "dev_tags": [p["tags"] for p in predictions],
    }


def main():
    parser = argument_parser(__doc__, "folder holding conll2003/ (or wnut16/)")
    parser.add_argument(
        "--corpus",
        choices=sorted(CORPORA),
        default="conll2003",
        help="conll2003 (train.txt, dev.txt) or wnut16 (train.conll, dev.conll: tweets)",
    )
    parser.add_argument("--train-size", type=int, default=1000, help="0: all")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--dropout",
        type=float,
        default=0.0,
        help="0: dropout off everywhere (the default); else the head's rate, "
        "with the checkpoint's own rates in the backbone (0.1)",
    )
    args = parser.parse_args()

    from bertkit_tasks.tagging.conlleval import evaluate

    workdir = Path(tempfile.mkdtemp(prefix="bertkit-parity-"))
    checkpoint = without_dropout(workdir / "checkpoint") if args.dropout == 0 else preset_folder()
    train_name, dev_name = CORPORA[args.corpus]
    train_file, dev_file = workdir / "train.txt", args.data / args.corpus / dev_name
    write_first_sentences(args.data / args.corpus / train_name, train_file, args.train_size or None)
    ours = train_bertkit(args, checkpoint, train_file, dev_file, workdir)
    subprocess.run(
        [
            args.python,
            str(REFERENCE),
            "replay",
            "--model",
            str(checkpoint),
            "--batches",
            str(workdir / "replay.npz"),
            "--dev",
            str(dev_file),
            "--max-length",
            str(args.sequence_length),
            "--out",
            str(workdir / "reference.json"),
            "--learning-rate",
            str(args.learning_rate),
            "--batch-size",
            str(args.batch_size),
        ],
        check=True,
    )
    theirs = json.loads((workdir / "reference.json").read_text())
    gold = [list(tags) for tags in theirs["dev_gold"]]
    theirs_f1 = evaluate(gold, theirs["dev_tags"])["f1"]

    print(
        f"\n{args.corpus}: {args.train_size or 'all'} sentences x {args.epochs} epochs, "
        f"batch {args.batch_size} in "
        f"{args.micro_batches} micro-batches, lr {args.learning_rate}, "
        f"{'dropout off' if args.dropout == 0 else 'dropout on'}, same head and batches"
    )
    print(f"{'micro-batch':>11} {'bertkit loss':>13} {'transformers':>13}")
    count = len(ours["losses"])
    for step in sorted({*range(0, count, max(1, count // 16)), count - 1}):
        print(f"{step:>11} {ours['losses'][step]:13.5f} {theirs['losses'][step]:13.5f}")
    gap = max(abs(a - b) for a, b in zip(ours["losses"], theirs["losses"], strict=True))
    differing = sum(
        a != b
        for x, y in zip(ours["dev_tags"], theirs["dev_tags"], strict=True)
        for a, b in zip(x, y, strict=True)
    )
    print(f"largest loss difference: {gap:.2e}")
    print(
        f"dev entity F1: bertkit {ours['dev_f1']:.4f}, transformers {theirs_f1:.4f}; "
        f"{differing} of {sum(map(len, gold))} dev words tagged differently"
    )


if __name__ == "__main__":
    main()
