"""The transformers + PyTorch side of `gpu_check.py`, one command per process; never imports
bertkit, Keras or TensorFlow.

    matmul --size N          bf16 N x N matmul TFLOP/s through PyTorch, and the versions
                             and device
    checkpoint --shape S --tokenizer DIR --out DIR
                             a random BERT in Hugging Face format (as ../shared/gpu's
                             make_random_bert.py): speed needs the shape, not trained weights
    steps --shape S --sequence-length L
                             steady-state training steps as a transformers user gets them
                             with bf16 (../shared/gpu's hf_steps.py): autocast bf16, SDPA
                             attention, fused AdamW, clipping 1.0, dropout 0.1
    sst2 --model DIR --train TSV.gz --dev TSV.gz --max-length N --batch-size N
         --learning-rate X --epochs N
                             transformers' whole loop on SST-2: tokenize, train, evaluate on
                             dev, each phase timed (the same optimizer, schedule and clipping
                             as benchmarks/hf_reference.py, on the device, bf16 autocast)
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import time

import torch
import transformers

IMPORTED_AT = time.time()  # start-up (interpreter, torch, transformers) ends here

from protocol import SETTINGS, SHAPES, SYNTHETIC_VOCABULARY, hf_config, report  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def matmul(args) -> None:
    found = {
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "device": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu",
    }
    report(**found)  # kept in the row even if the timing below fails or times out
    n, repeats = args.size, 10
    a = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    synchronize()
    report(**found, tflops=2 * n**3 * repeats / (time.perf_counter() - started) / 1e12, size=n)


def checkpoint(args) -> None:
    import shutil
    from pathlib import Path

    tokenizer, out = Path(args.tokenizer), Path(args.out)
    vocabulary = (tokenizer / "vocab.txt").read_text(encoding="utf-8").splitlines()
    torch.manual_seed(0)
    config = transformers.BertConfig(**hf_config(args.shape, len(vocabulary)))
    transformers.BertModel(config, add_pooling_layer=True).save_pretrained(
        out, safe_serialization=True
    )
    for file in tokenizer.iterdir():
        if file.is_file() and file.name != "config.json":
            shutil.copy(file, out / file.name)
    report(
        writer="transformers",
        vocabulary_size=len(vocabulary),
        files=sorted(p.name for p in out.iterdir()),
    )


def steps(args) -> None:
    settings, length = SETTINGS[args.shape], args.sequence_length
    batch, warmup, timed = settings["batch_size"], settings["warmup"], settings["steps"]
    torch.manual_seed(0)
    config = transformers.BertConfig(num_labels=2, **hf_config(args.shape, SYNTHETIC_VOCABULARY))
    model = (
        transformers.BertForSequenceClassification._from_config(config, attn_implementation="sdpa")
        .to(DEVICE)
        .train()
    )
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=5e-5, weight_decay=0.01, fused=DEVICE == "cuda"
    )
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (batch, length), generator=generator).to(DEVICE)
    labels = torch.randint(0, 2, (batch,), generator=generator).to(DEVICE)
    batch_inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    started = time.perf_counter()
    for _ in range(warmup):
        train_step(model, batch_inputs, optimizer)
    synchronize()
    warm = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(timed):
        loss = train_step(model, batch_inputs, optimizer)
    float(loss)  # waits for the last step
    seconds = time.perf_counter() - started
    report(
        sequences_per_second=timed * batch / seconds,
        step_ms=1000 * seconds / timed,
        steps=timed,
        batch_size=batch,
        sequence_length=length,
        attention=model.config._attn_implementation,
        build_and_warmup_seconds=warm,
    )


def train_step(model, batch: dict, optimizer, schedule=None):
    """Forward under bf16 autocast, backward, clipping 1.0, AdamW (fused on a GPU)."""
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    if schedule is not None:
        schedule.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def synchronize() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def read_tsv(path) -> tuple[list[str], list[str]]:
    """A gzipped GLUE-style TSV's `sentence` and `label` columns."""
    with gzip.open(path, "rt", encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [row["sentence"] for row in rows], [row["label"] for row in rows]


def sst2(args) -> None:
    """Load, tokenize, train, evaluate: the phases of transformers' whole loop, timed."""
    phases, mark = {}, time.perf_counter()

    def phase(name):
        nonlocal mark
        synchronize()
        now = time.perf_counter()
        phases[name], mark = now - mark, now

    (train_texts, train_labels), (dev_texts, dev_labels) = read_tsv(args.train), read_tsv(args.dev)
    label_ids = {label: i for i, label in enumerate(sorted(set(train_labels)))}
    train_labels = [label_ids[label] for label in train_labels]
    dev_labels = [label_ids.get(label, -1) for label in dev_labels]
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    model = transformers.BertForSequenceClassification.from_pretrained(
        args.model, num_labels=len(label_ids), attn_implementation="sdpa"
    ).to(DEVICE)
    phase("load")
    encode = dict(truncation=True, max_length=args.max_length)
    train = tokenizer(train_texts, **encode)
    dev = tokenizer(dev_texts, **encode)
    rows = [
        {"input_ids": ids, "token_type_ids": types, "attention_mask": mask, "labels": label}
        for ids, types, mask, label in zip(
            train["input_ids"],
            train["token_type_ids"],
            train["attention_mask"],
            train_labels,
            strict=True,
        )
    ]
    phase("tokenize")
    steps = train_epochs(model, rows, tokenizer, args)
    phase("train")
    predictions = evaluate(model, dev, tokenizer, 2 * args.batch_size)
    phase("evaluation")
    accuracy = sum(p == g for p, g in zip(predictions, dev_labels, strict=True)) / len(dev_labels)
    lengths = collections.Counter(len(ids) for ids in train["input_ids"])
    report(
        phases=phases,
        imported_at=IMPORTED_AT,
        finished_at=time.time(),
        train_rows=len(rows),
        steps=steps,
        accuracy=accuracy,
        train_lengths={str(k): v for k, v in sorted(lengths.items())},
        attention=model.config._attn_implementation,
    )


def train_epochs(model, rows, tokenizer, args) -> int:
    """benchmarks/hf_reference.py's loop (AdamW without decay on biases and LayerNorm,
    linear warmup 10% then decay, clipping 1.0, shuffled DataLoader, dynamic padding) on
    the device with bf16 autocast and fused AdamW."""
    generator = torch.Generator().manual_seed(42)
    loader = torch.utils.data.DataLoader(
        rows,
        batch_size=args.batch_size,
        shuffle=True,
        generator=generator,
        collate_fn=transformers.DataCollatorWithPadding(tokenizer),
        pin_memory=DEVICE == "cuda",
    )
    total = args.epochs * len(loader)
    no_decay = {
        id(p) for m in model.modules() if isinstance(m, torch.nn.LayerNorm) for p in m.parameters()
    }
    decay = [
        p for n, p in model.named_parameters() if not n.endswith("bias") and id(p) not in no_decay
    ]
    rest = [p for n, p in model.named_parameters() if n.endswith("bias") or id(p) in no_decay]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
        lr=args.learning_rate,
        eps=1e-6,
        fused=DEVICE == "cuda",
    )
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, int(0.1 * total), total)
    model.train()
    for epoch in range(args.epochs):
        for step, batch in enumerate(loader):
            batch = {key: value.to(DEVICE, non_blocking=True) for key, value in batch.items()}
            loss = train_step(model, batch, optimizer, schedule)
            if step % 200 == 0:  # a host read now and then, as a logging user has
                print(
                    f"epoch {epoch + 1} step {step}/{len(loader)} loss {loss.item():.4f}",
                    flush=True,
                )
    return total


@torch.no_grad()
def evaluate(model, encoded, tokenizer, batch_size: int) -> list[int]:
    model.eval()
    collator = transformers.DataCollatorWithPadding(tokenizer)
    rows = [
        {key: encoded[key][i] for key in encoded.keys()} for i in range(len(encoded["input_ids"]))
    ]
    predictions = []
    for first in range(0, len(rows), batch_size):
        batch = {k: v.to(DEVICE) for k, v in collator(rows[first : first + batch_size]).items()}
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            predictions += model(**batch).logits.argmax(-1).tolist()
    return predictions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("matmul").add_argument("--size", type=int, required=True)
    for name in ("checkpoint", "steps"):
        sub = commands.add_parser(name)
        sub.add_argument("--shape", choices=sorted(SHAPES), required=True)
    commands.choices["checkpoint"].add_argument("--tokenizer", required=True)
    commands.choices["checkpoint"].add_argument("--out", required=True)
    commands.choices["steps"].add_argument("--sequence-length", type=int, required=True)
    sub = commands.add_parser("sst2")
    for flag in ("--model", "--train", "--dev"):
        sub.add_argument(flag, required=True)
    for flag in ("--max-length", "--batch-size", "--epochs"):
        sub.add_argument(flag, type=int, required=True)
    sub.add_argument("--learning-rate", type=float, required=True)
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()  # no load report for the new head
    {"matmul": matmul, "checkpoint": checkpoint, "steps": steps, "sst2": sst2}[args.command](args)


if __name__ == "__main__":
    main()
