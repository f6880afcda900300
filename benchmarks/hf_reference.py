"""The Hugging Face transformers + PyTorch (CPU) reference for the NER, QA and speed benchmarks.

Runs in its own virtual environment with torch and transformers; it never imports bertkit or
TensorFlow. `benchmarks/conll_ner.py` and `benchmarks/squad_qa.py` call it as a subprocess
with their data subsets and settings, then score its predictions with bertkit's scorers;
`benchmarks/throughput.py` calls its `throughput` command.

It follows the transformers examples `run_ner_no_trainer.py` and `run_qa_no_trainer.py`:
a plain PyTorch loop (the `Trainer` needs `accelerate`, which the venv does not have) with
AdamW (no weight decay on biases and LayerNorm weights), linear warmup then linear decay
(`get_linear_schedule_with_warmup`), gradient clipping by global norm, a shuffled
`DataLoader` and dynamic padding to each batch's longest row (the data collators). Adam's
epsilon is `--adam-epsilon`, by default 1e-6, bertkit's value (HF's default is 1e-8), so the
optimizers are the same.

    ner: `BertForTokenClassification`. Words are tokenized with `is_split_into_words=True`,
         truncated to `--max-length` tokens as run_ner does (words past the cut get no
         prediction: they are tagged O); a word's label sits on its first sub-token, -100
         elsewhere; its predicted tag is read from its first sub-token. Writes one list of
         tags per sentence for the dev and (`--test`) the test file (argmax, as run_ner),
         each word's label probabilities (`labels` gives their order) for other decodings.
    qa:  `BertForQuestionAnswering`, run_qa's preprocessing (question first, truncation
         only_second, max_length 384, overlap `--stride` tokens between windows,
         overflowing tokens, offset mapping; train labels on the first answer, [CLS] when the
         window does not hold it) and `postprocess_qa_predictions` (n-best start and end
         logits per window, spans inside the context up to `--max-answer-length` tokens, best
         start + end logit over all windows). Writes `{id: answer_text}`. With `--version
         2.0` (run_qa's `--version_2_with_negative`) an unanswerable question trains on
         [CLS], and `null_score_diffs` gives per question the null score (the lowest [CLS]
         start + end logit over its windows) minus its best span's score: run_qa answers ""
         when it is above 0; the official script's `--na-prob-file` tunes that threshold.
         The answers are then the best spans, "" only without any valid span.

         With `--patience P` (ner and classify) training runs as transformers' `Trainer` with
         `eval_strategy="epoch"`, `load_best_model_at_end=True` and
         `EarlyStoppingCallback(early_stopping_patience=P)`: dev is scored after every epoch
         (ner: entity F1 of the argmax tags, `entity_f1`, conlleval's chunks; classify:
         accuracy), the best epoch's weights are kept (a strictly higher score replaces
         them), training stops after P epochs without a higher one, and the best weights tag
         dev and test. `--epochs` is then the most epochs; the JSON adds `best_epoch`,
         `epochs_trained` and `dev_scores_by_epoch`. (No learned-nothing floor as bertkit's:
         transformers' patience counts from the first epoch.)

    classify: `BertForSequenceClassification` on GLUE-style TSVs (a `--text` column,
         `sentence` by default, a `--text-pair` column for pair tasks such as RTE, and
         `label`: GLUE's digits, or names, numbered in sorted order as `labels` lists),
         dynamic padding; writes the dev predictions after every epoch
         (`dev_predictions_by_epoch`), the dev labels and, with `--test`, the kept model's
         test predictions and labels. `--regression` trains a numeric `label` (STS-B) as
         run_glue does: one output, `problem_type="regression"`, MSE on the raw targets, the
         kept epoch by dev Spearman. `--multi-label` reads `label` as names joined by
         commas: `problem_type="multi_label_classification"` (BCE), sigmoid probabilities
         written per label (`labels` their order), the kept epoch by dev micro F1 at 0.5.
         `--eval-each-epoch` gives ner the
         same per-epoch dev tags (`benchmarks/learning_curve.py`).

    choose: `BertForMultipleChoice` on CommonsenseQA JSON lines (`question.stem`,
         `question.choices`, `answerKey`), as `run_swag.py` trains it: one `[CLS] question
         [SEP] choice [SEP]` per choice cut at `--max-length`, a question's choices padded
         together; dev predictions after every epoch, `--test` and `--patience` as classify.

    replay: `benchmarks/training_parity.py`'s reference: trains `BertForTokenClassification`
         on the batches bertkit made (an .npz of padded micro-batches, its head kernel, its
         label order) in bertkit's order, from the same head, and writes the loss after each
         micro-batch and the dev tags (argmax) of the trained model.

    throughput: `benchmarks/throughput.py`'s reference. One epoch over the first `--rows`
         rows of one task (`--task classification`: an SST-2 TSV with `sentence` and `label`
         columns, `BertForSequenceClassification`; `tagging`: as ner; `qa`: as qa), then two
         inference passes over the same rows (`model.eval()`, `torch.no_grad()`, dynamic
         padding, batches of `--eval-batch-size` in data order), the second one timed.
         Writes per-step records `{rows, width, tokens, tokens_squared, seconds}` (width:
         the padded length computed; tokens: real tokens; seconds: the step's wall time,
         collation included) and, with `--matmul-size`, torch's float32 matmul GFLOP/s;
         `--threads` sets `torch.set_num_threads`.

The ner and qa result JSON holds the predictions, `train_seconds` (the training loop only: batches,
forward, backward, optimizer steps), `train_rows` (feature rows per epoch),
`sequences_trained` (rows x epochs), token counts, `torch_threads`
(`torch.get_num_threads()`), `eval_seconds` (the per-epoch evaluations) and the Unix times
`imported_at` (torch and transformers imported) and `finished_at` (before the JSON is written),
from which `benchmarks/whole_command.py` splits the subprocess's wall time. With
`--eval-each-epoch`, ner's final dev tags are the last epoch's evaluation (the same weights),
not a second pass.

    /tmp/hfenv/bin/python benchmarks/hf_reference.py ner --model MODEL_DIR \\
        --train train.txt --dev dev.txt --test test.txt --out result.json
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import re
import time

import numpy as np
import torch
import transformers

IMPORTED_AT = time.time()  # benchmarks/whole_command.py: start-up ends here

IGNORED = -100  # the label the loss skips
# as bertkit_tasks.tagging.conll: a no-break space stays inside a word
_COLUMNS = re.compile(r"[ \t]+")


# ---- data
def read_conll(path) -> list[tuple[list[str], list[str]]]:
    """(words, tags) per sentence: first column and last column; -DOCSTART- lines skipped."""
    sentences, words, tags = [], [], []
    with open(path, encoding="utf-8-sig") as handle:
        for line in handle:
            line = line.rstrip("\r\n")
            if not line.strip() or line.startswith("-DOCSTART-"):
                if words:
                    sentences.append((words, tags))
                words, tags = [], []
                continue
            columns = _COLUMNS.split(line.strip())
            words.append(columns[0])
            tags.append(columns[-1])
    if words:
        sentences.append((words, tags))
    return sentences


def read_squad(path) -> list[dict]:
    """SQuAD JSON -> [{id, question, context, answers: {text, answer_start}}] (v2.0's
    unanswerable questions have empty answer lists)."""
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)["data"]
    return [
        {
            "id": qa["id"],
            "question": qa["question"],
            "context": paragraph["context"],
            "answers": {
                "text": [a["text"] for a in qa["answers"]],
                "answer_start": [a["answer_start"] for a in qa["answers"]],
            },
        }
        for article in data
        for paragraph in article["paragraphs"]
        for qa in paragraph["qas"]
    ]


def read_sentences(path) -> list[tuple[str, int]]:
    """(sentence, label) per row of a GLUE-style TSV with `sentence` and `label` columns."""
    with open(path, encoding="utf-8", newline="") as handle:
        rows = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [(row["sentence"], int(row["label"])) for row in rows]


def read_labelled_texts(path, text: str, pair: str | None) -> list[tuple[str, str | None, str]]:
    """(text, second text or None, label) per row of a GLUE-style TSV (columns named)."""
    with open(path, encoding="utf-8", newline="") as handle:
        rows = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [(row[text], row[pair] if pair else None, row["label"]) for row in rows]


def label_order(labels) -> list[str]:
    """The label set in id order: numerically for GLUE's digit labels, else sorted."""
    names = set(labels)
    return sorted(names, key=int) if all(n.isdigit() for n in names) else sorted(names)


# ---- NER features (run_ner's tokenize_and_align_labels)
def ner_features(tokenizer, sentences, label_ids: dict, max_length: int) -> tuple[list, list]:
    """Feature rows (input_ids, token_type_ids, attention_mask, labels) and each row's word ids."""
    encoded = tokenizer(
        [words for words, _ in sentences],
        is_split_into_words=True,
        truncation=True,
        max_length=max_length,
    )
    rows, word_ids = [], []
    for index, (_, tags) in enumerate(sentences):
        ids = encoded.word_ids(index)
        labels, previous = [], None
        for word in ids:  # first sub-token of a word: its tag; the rest and specials: -100
            labels.append(
                IGNORED if word is None or word == previous else label_ids.get(tags[word], IGNORED)
            )
            previous = word
        rows.append({key: encoded[key][index] for key in encoded.keys()} | {"labels": labels})
        word_ids.append(ids)
    return rows, word_ids


def word_tags(logits, word_ids, num_words: int, labels: list[str]) -> tuple[list, list, int]:
    """One tag per word, from its first sub-token; words cut by truncation get O.

    Returns the tags, each word's label probabilities (softmax of its first
    sub-token's logits; a cut word: O with probability 1) and the number of
    words without a sub-token in the row.
    """
    tags, seen = ["O"] * num_words, set()
    probabilities = np.zeros((num_words, len(labels)), dtype=np.float32)
    probabilities[:, labels.index("O")] = 1.0
    for position, word in enumerate(word_ids):
        if word is not None and word not in seen:
            tags[word] = labels[int(np.argmax(logits[position]))]
            shifted = np.exp(logits[position] - logits[position].max())
            probabilities[word] = shifted / shifted.sum()
            seen.add(word)
    return tags, probabilities.round(6).tolist(), num_words - len(seen)


# ---- QA features (run_qa's prepare_train_features / prepare_validation_features)
def qa_encode(tokenizer, examples, max_length: int, stride: int):
    return tokenizer(
        [e["question"].lstrip() for e in examples],
        [e["context"] for e in examples],
        truncation="only_second",
        max_length=max_length,
        stride=stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding=False,
    )


def qa_train_features(tokenizer, examples, max_length: int, stride: int) -> list[dict]:
    """Rows with start/end positions of the first answer; [CLS] when outside the window or
    when the question has no answer (v2.0)."""
    encoded = qa_encode(tokenizer, examples, max_length, stride)
    rows = []
    for index, offsets in enumerate(encoded["offset_mapping"]):
        example = examples[encoded["overflow_to_sample_mapping"][index]]
        answers = example["answers"]
        start, end = (
            answer_positions(
                encoded.sequence_ids(index),
                offsets,
                answers["answer_start"][0],
                len(answers["text"][0]),
            )
            if answers["text"]
            else (0, 0)
        )
        rows.append(
            {
                "input_ids": encoded["input_ids"][index],
                "token_type_ids": encoded["token_type_ids"][index],
                "attention_mask": encoded["attention_mask"][index],
                "start_positions": start,
                "end_positions": end,
            }
        )
    return rows


def answer_positions(sequence_ids, offsets, start_char: int, length: int) -> tuple[int, int]:
    """run_qa's rule: the tokens that hold [start_char, start_char + length), else (0, 0)."""
    end_char = start_char + length
    first = sequence_ids.index(1)
    last = len(sequence_ids) - 1 - sequence_ids[::-1].index(1)
    if not (offsets[first][0] <= start_char and offsets[last][1] >= end_char):
        return 0, 0  # the [CLS] index: the answer is not (entirely) in this window
    while first < len(offsets) and sequence_ids[first] == 1 and offsets[first][0] <= start_char:
        first += 1
    while sequence_ids[last] == 1 and offsets[last][1] >= end_char:
        last -= 1
    return first - 1, last + 1


def qa_eval_features(tokenizer, examples, max_length: int, stride: int) -> tuple[list, list]:
    """Model rows, and per row its example index and context offsets (None outside)."""
    encoded = qa_encode(tokenizer, examples, max_length, stride)
    rows, decoding = [], []
    for index, offsets in enumerate(encoded["offset_mapping"]):
        sequence_ids = encoded.sequence_ids(index)
        rows.append(
            {key: encoded[key][index] for key in ("input_ids", "token_type_ids", "attention_mask")}
        )
        decoding.append(
            (
                encoded["overflow_to_sample_mapping"][index],
                [o if s == 1 else None for o, s in zip(offsets, sequence_ids, strict=True)],
            )
        )
    return rows, decoding


def postprocess_qa(
    examples,
    decoding,
    start_logits,
    end_logits,
    n_best: int,
    max_answer_length: int,
    with_null: bool = False,
):
    """run_qa's `postprocess_qa_predictions`: the best span text per question id; with
    `with_null` (v2.0) also each question's null score difference (see the docstring)."""
    candidates = [[] for _ in examples]
    null_scores = [float("inf")] * len(examples)
    for (example, offsets), starts, ends in zip(decoding, start_logits, end_logits, strict=True):
        null_scores[example] = min(null_scores[example], float(starts[0] + ends[0]))
        best_starts = np.argsort(starts)[-1 : -n_best - 1 : -1]
        best_ends = np.argsort(ends)[-1 : -n_best - 1 : -1]
        for start in best_starts:
            for end in best_ends:
                if (
                    start >= len(offsets)
                    or end >= len(offsets)
                    or offsets[start] is None
                    or offsets[end] is None
                    or end < start
                    or end - start + 1 > max_answer_length
                ):
                    continue
                candidates[example].append(
                    (float(starts[start] + ends[end]), offsets[start][0], offsets[end][1])
                )
    predictions, null_score_diffs = {}, {}
    for example, found, null_score in zip(examples, candidates, null_scores, strict=True):
        if not found:
            predictions[example["id"]] = "" if with_null else "empty"  # as run_qa
            null_score_diffs[example["id"]] = 1e30  # nothing but "no answer"
            continue
        score, first, last = max(found, key=lambda c: c[0])
        predictions[example["id"]] = example["context"][first:last]
        null_score_diffs[example["id"]] = null_score - score
    return (predictions, null_score_diffs) if with_null else predictions


# ---- training and prediction
def train(model, rows, collator, args, after_epoch=None) -> dict:
    """The fine-tuning loop; returns its seconds and counts (padding included in `tokens`).

    `after_epoch(epoch)`, if given, runs after each epoch outside the timed loop
    (per-epoch evaluation) and leaves the model in training mode again; a true result
    stops training there (early stopping).
    """
    generator = torch.Generator().manual_seed(args.seed)
    loader = torch.utils.data.DataLoader(
        rows, batch_size=args.batch_size, shuffle=True, collate_fn=collator, generator=generator
    )
    total_steps = args.epochs * len(loader)
    optimizer, schedule = make_optimizer(model, args, total_steps)
    model.train()
    padded_tokens, eval_seconds, epoch_losses = 0, 0.0, []
    started = time.perf_counter()
    for epoch in range(args.epochs):
        epoch_losses.append(0.0)
        for step, batch in enumerate(loader):
            padded_tokens += batch["input_ids"].numel()
            loss = train_step(model, batch, optimizer, schedule, args.max_grad_norm)
            epoch_losses[-1] += loss.item() / len(loader)  # the mean, as Keras logs `loss`
            if step % 50 == 0:
                print(
                    f"epoch {epoch + 1} step {step}/{len(loader)} loss {loss.item():.4f} "
                    f"{time.perf_counter() - started:.0f}s",
                    flush=True,
                )
        if after_epoch is not None:
            paused = time.perf_counter()
            stop = after_epoch(epoch)
            model.train()
            eval_seconds += time.perf_counter() - paused
            started += time.perf_counter() - paused  # evaluation is not training time
            if stop:  # early stopping (`KeepBest`)
                break
    seconds = time.perf_counter() - started
    return {
        "train_seconds": seconds,
        "eval_seconds": eval_seconds,
        "train_rows": len(rows),
        "sequences_trained": len(rows) * (epoch + 1),
        "steps": total_steps,
        "epochs_trained": epoch + 1,
        "tokens_trained": sum(len(r["input_ids"]) for r in rows) * (epoch + 1),
        "padded_tokens_trained": padded_tokens,
        "epoch_losses": epoch_losses,
    }


def make_optimizer(model, args, total_steps: int):
    """AdamW (`--adam-epsilon`) and the linear warmup-then-decay schedule."""
    optimizer = torch.optim.AdamW(
        parameter_groups(model, args.weight_decay), lr=args.learning_rate, eps=args.adam_epsilon
    )
    schedule = transformers.get_linear_schedule_with_warmup(
        optimizer, int(args.warmup_ratio * total_steps), total_steps
    )
    return optimizer, schedule


def train_step(model, batch, optimizer, schedule, max_grad_norm: float):
    """One optimizer step: forward, backward, clipping, AdamW, schedule; returns the loss."""
    loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    schedule.step()
    optimizer.zero_grad()
    return loss


def parameter_groups(model, weight_decay: float) -> list[dict]:
    """Weight decay on everything but biases and LayerNorm weights (HF Trainer's rule)."""
    no_decay = {
        id(p)
        for module in model.modules()
        if isinstance(module, torch.nn.LayerNorm)
        for p in module.parameters()
    }
    decay, rest = [], []
    for name, parameter in model.named_parameters():
        (rest if name.endswith("bias") or id(parameter) in no_decay else decay).append(parameter)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


@torch.no_grad()
def predict(
    model, rows, collator, batch_size: int, keys, per_token: bool = True
) -> dict[str, list[np.ndarray]]:
    """Per row, each output in `keys`; `per_token` outputs cut to the row's own length
    (padding dropped)."""
    model.eval()
    outputs = {key: [] for key in keys}
    for first in range(0, len(rows), batch_size):
        chunk = rows[first : first + batch_size]
        result = model(**collator(chunk))
        for key in keys:
            values = result[key].float().numpy()
            if not per_token:
                outputs[key] += list(values)
                continue
            outputs[key] += [values[i, : len(row["input_ids"])] for i, row in enumerate(chunk)]
    return outputs


class KeepBest:
    """transformers' `load_best_model_at_end` with `EarlyStoppingCallback`: the weights of
    the epoch with the highest dev score so far (strictly higher replaces them, as the
    callback's threshold 0) and the stop after `patience` epochs without one."""

    def __init__(self, model, patience: int):
        self.model, self.patience = model, patience
        self.scores, self.best_epoch, self.state = [], None, None

    def __call__(self, epoch: int, score: float) -> bool:
        """Records epoch `epoch`'s (0-based) `score`; True when training should stop."""
        self.scores.append(score)
        if self.best_epoch is None or score > self.scores[self.best_epoch - 1]:
            self.best_epoch = epoch + 1
            self.state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return epoch + 1 - self.best_epoch >= self.patience

    def restore(self) -> dict:
        """Loads the best epoch's weights; what the result JSON records of the choice."""
        self.model.load_state_dict(self.state)
        return {"best_epoch": self.best_epoch, "dev_scores_by_epoch": self.scores}


def entity_f1(gold: list[list[str]], predicted: list[list[str]]) -> float:
    """Micro entity F1 over IOB2 / IOB1 tag sequences, conlleval's chunks (an I- after O or
    after another type starts a chunk), for choosing the best epoch; the benchmarks score
    the final tags with bertkit's conlleval."""
    found_gold = found_predicted = correct = 0
    for gold_tags, predicted_tags in zip(gold, predicted, strict=True):
        gold_chunks, predicted_chunks = _chunks(gold_tags), _chunks(predicted_tags)
        found_gold += len(gold_chunks)
        found_predicted += len(predicted_chunks)
        correct += len(gold_chunks & predicted_chunks)
    if not correct:
        return 0.0
    precision, recall = correct / found_predicted, correct / found_gold
    return 2 * precision * recall / (precision + recall)


def _chunks(tags: list[str]) -> set[tuple[str, int, int]]:
    chunks, start, kind = set(), None, None
    for index, tag in enumerate([*tags, "O"]):
        prefix, _, name = tag.partition("-")
        if kind is not None and (prefix in ("O", "B") or name != kind):
            chunks.add((kind, start, index))
            kind = None
        if prefix != "O" and kind is None:
            start, kind = index, name
    return chunks


# ---- the two tasks
def run_ner(args, tokenizer) -> dict:
    train_sentences = read_conll(args.train)
    labels = sorted({tag for _, tags in train_sentences for tag in tags})  # as run_ner
    label_ids = {label: i for i, label in enumerate(labels)}
    model = transformers.BertForTokenClassification.from_pretrained(
        args.model, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id=label_ids
    )
    collator = transformers.DataCollatorForTokenClassification(tokenizer)
    rows, _ = ner_features(tokenizer, train_sentences, label_ids, args.max_length)
    files = (("dev", args.dev), ("test", args.test)) if args.test else (("dev", args.dev),)
    splits = {
        split: (sentences, *ner_features(tokenizer, sentences, label_ids, args.max_length))
        for split, sentences in ((split, read_conll(path)) for split, path in files)
    }

    def tag(split):
        sentences, rows, word_ids = splits[split]
        logits = predict(model, rows, collator, 2 * args.batch_size, ["logits"])["logits"]
        return [
            word_tags(row_logits, ids, len(words), labels)
            for row_logits, ids, (words, _) in zip(logits, word_ids, sentences, strict=True)
        ]

    dev_tagged_by_epoch, keep = [], KeepBest(model, args.patience) if args.patience else None
    gold_dev = [tags for _, tags in splits["dev"][0]]

    def after_epoch(epoch):
        dev_tagged_by_epoch.append(tag("dev"))
        if keep is not None:
            return keep(epoch, entity_f1(gold_dev, [t for t, _, _ in dev_tagged_by_epoch[-1]]))
        return False

    every_epoch = args.eval_each_epoch or keep is not None
    result = train(model, rows, collator, args, after_epoch=after_epoch if every_epoch else None)
    final_dev = dev_tagged_by_epoch[-1] if dev_tagged_by_epoch else None  # the last weights'
    if keep is not None:
        result.update(keep.restore())
        final_dev = dev_tagged_by_epoch[result["best_epoch"] - 1]  # the kept weights'
    if args.eval_each_epoch:
        result["dev_tags_by_epoch"] = [
            [tags for tags, _, _ in tagged] for tagged in dev_tagged_by_epoch
        ]
    for split in splits:
        # an epoch's dev evaluation already tagged dev with the final weights
        tagged = final_dev if split == "dev" and final_dev else tag(split)
        result[f"{split}_tags"] = [tags for tags, _, _ in tagged]
        result[f"{split}_word_probabilities"] = [words for _, words, _ in tagged]
        result[f"{split}_truncated_words"] = sum(cut for _, _, cut in tagged)
        result[f"{split}_truncated_sentences"] = sum(cut > 0 for _, _, cut in tagged)
    result["labels"] = labels
    return result


def run_classify(args, tokenizer) -> dict:
    """`BertForSequenceClassification` on GLUE-style TSVs (`--text`, `--text-pair`,
    `label` columns); dev predictions per epoch, and (`--test`) the kept model's on test.
    With `--regression`: one output, `problem_type="regression"` (MSE on the raw targets,
    as run_glue trains STS-B), float predictions, the kept epoch by dev Spearman."""
    rows = {
        split: read_labelled_texts(path, args.text, args.text_pair)
        for split, path in (("train", args.train), ("dev", args.dev), ("test", args.test))
        if path
    }
    if args.regression:
        labels, target = ["score"], float
        model = transformers.BertForSequenceClassification.from_pretrained(
            args.model, num_labels=1, problem_type="regression"
        )
    elif args.multi_label:  # `label`: names joined by commas; a 0/1 target per name
        seen = {name for _, _, cell in rows["train"] for name in cell.split(",")}
        labels = args.label_names.split(",") if args.label_names else sorted(seen)
        target = lambda cell: [float(name in cell.split(",")) for name in labels]  # noqa: E731
        model = transformers.BertForSequenceClassification.from_pretrained(
            args.model, num_labels=len(labels), problem_type="multi_label_classification"
        )
    else:
        labels = label_order(label for _, _, label in rows["train"])
        ids = {name: i for i, name in enumerate(labels)}
        target = lambda label: ids.get(label, -1)  # noqa: E731
        model = transformers.BertForSequenceClassification.from_pretrained(
            args.model, num_labels=max(2, len(labels))
        )
    collator = transformers.DataCollatorWithPadding(tokenizer)

    def encode(split, with_labels):
        texts = [text for text, _, _ in rows[split]]
        pairs = [pair for _, pair, _ in rows[split]] if args.text_pair else None
        encoded = tokenizer(texts, pairs, truncation=True, max_length=args.max_length)
        return [
            {key: encoded[key][i] for key in encoded.keys()}
            | ({"labels": target(label)} if with_labels else {})
            for i, (_, _, label) in enumerate(rows[split])
        ]

    def predictions(features):
        logits = predict(model, features, collator, 2 * args.batch_size, ["logits"], False)
        logits = logits["logits"]
        if args.regression:
            return [float(row[0]) for row in logits]
        if args.multi_label:  # sigmoid probabilities, thresholds chosen by the caller
            return [(1 / (1 + np.exp(-row))).round(6).tolist() for row in logits]
        return [int(np.argmax(row)) for row in logits]

    dev = encode("dev", with_labels=False)
    gold = {split: [target(label) for _, _, label in found] for split, found in rows.items()}
    by_epoch, keep = [], KeepBest(model, args.patience) if args.patience else None

    def after_epoch(epoch):
        by_epoch.append(predictions(dev))
        predicted, wanted = np.array(by_epoch[-1]), np.array(gold["dev"])
        if args.regression:
            score = spearman(predicted, wanted)
        elif args.multi_label:  # micro F1 at 0.5, the kept epoch's score
            score = micro_f1(wanted > 0.5, predicted > 0.5)
        else:
            score = np.mean(predicted == wanted)
        return keep is not None and keep(epoch, float(score))

    result = train(model, encode("train", with_labels=True), collator, args, after_epoch)
    if keep is not None:
        result.update(keep.restore())
    result.update(dev_predictions_by_epoch=by_epoch, dev_labels=gold["dev"], labels=labels)
    if args.test:
        result["test_predictions"] = predictions(encode("test", with_labels=False))
        result["test_labels"] = gold["test"]
    return result


def run_choose(args, tokenizer) -> dict:
    """`BertForMultipleChoice` on CommonsenseQA-style JSON lines, as `run_swag.py` trains it:
    `[CLS] question [SEP] choice [SEP]` per choice, each cut at `--max-length`, the choices
    of a question padded together (its collator); dev predictions per epoch, and (`--test`)
    the kept model's on test."""
    rows = {
        split: read_questions(path)
        for split, path in (("train", args.train), ("dev", args.dev), ("test", args.test))
        if path
    }
    model = transformers.BertForMultipleChoice.from_pretrained(args.model)

    def encode(split):
        encoded = []
        for question, choices, answer in rows[split]:
            pieces = tokenizer(
                [question] * len(choices), choices, truncation=True, max_length=args.max_length
            )
            encoded.append({key: pieces[key] for key in pieces.keys()} | {"labels": answer})
        return encoded

    def collator(features):  # run_swag.py's DataCollatorForMultipleChoice
        choices = len(features[0]["input_ids"])
        flat = [
            {key: feature[key][i] for key in feature if key != "labels"}
            for feature in features
            for i in range(choices)
        ]
        batch = tokenizer.pad(flat, return_tensors="pt")
        batch = {key: value.view(len(features), choices, -1) for key, value in batch.items()}
        batch["labels"] = torch.tensor([feature["labels"] for feature in features])
        return batch

    def predictions(features):
        logits = predict(model, features, collator, 2 * args.batch_size, ["logits"])["logits"]
        return [int(np.argmax(row)) for row in logits]

    dev = encode("dev")
    gold = {split: [answer for _, _, answer in found] for split, found in rows.items()}
    by_epoch, keep = [], KeepBest(model, args.patience) if args.patience else None

    def after_epoch(epoch):
        by_epoch.append(predictions(dev))
        score = float(np.mean(np.array(by_epoch[-1]) == np.array(gold["dev"])))
        return keep is not None and keep(epoch, score)

    result = train(model, encode("train"), collator, args, after_epoch)
    if keep is not None:
        result.update(keep.restore())
    result.update(dev_predictions_by_epoch=by_epoch, dev_labels=gold["dev"])
    if args.test:
        result["test_predictions"] = predictions(encode("test"))
        result["test_labels"] = gold["test"]
    return result


def read_questions(path) -> list[tuple[str, list[str], int]]:
    """(question, choices, answer index) per CommonsenseQA JSON line."""
    questions = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                record = json.loads(line)
                labels = [choice["label"] for choice in record["question"]["choices"]]
                texts = [choice["text"] for choice in record["question"]["choices"]]
                questions.append(
                    (record["question"]["stem"], texts, labels.index(record["answerKey"]))
                )
    return questions


def micro_f1(gold: np.ndarray, predicted: np.ndarray) -> float:
    """Micro F1 of 0/1 (examples, labels) arrays."""
    hits = float(np.logical_and(gold, predicted).sum())
    return 2 * hits / max(float(gold.sum() + predicted.sum()), 1.0)


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties, as SciPy's)."""

    def ranks(values):
        order = np.argsort(values, kind="stable")
        ranked = np.empty(len(values))
        ranked[order] = np.arange(1, len(values) + 1)
        _, group, counts = np.unique(values, return_inverse=True, return_counts=True)
        return np.bincount(group, weights=ranked)[group] / counts[group]

    return float(np.corrcoef(ranks(x), ranks(y))[0, 1])


def run_qa(args, tokenizer) -> dict:
    model = transformers.BertForQuestionAnswering.from_pretrained(args.model)
    collator = transformers.DataCollatorWithPadding(tokenizer)
    rows = qa_train_features(tokenizer, read_squad(args.train), args.max_length, args.stride)
    result = train(model, rows, collator, args)
    decoded, result["eval_rows"] = qa_predict(model, tokenizer, collator, args.eval[0], args)
    if args.version == "2.0":
        result["predictions"], result["null_score_diffs"] = decoded
    else:
        result["predictions"] = decoded
    result["predictions_by_eval"] = {args.eval[0]: result["predictions"]}
    for path in args.eval[1:]:  # further files: their predictions only
        decoded, _ = qa_predict(model, tokenizer, collator, path, args)
        if args.version == "2.0":
            decoded = decoded[0]
        result["predictions_by_eval"][path] = decoded
    return result


def qa_predict(model, tokenizer, collator, path, args):
    """The decoded predictions on one SQuAD file (v2.0: with null score differences)."""
    examples = read_squad(path)
    rows, decoding = qa_eval_features(tokenizer, examples, args.max_length, args.stride)
    logits = predict(model, rows, collator, 2 * args.batch_size, ["start_logits", "end_logits"])
    decoded = postprocess_qa(
        examples,
        decoding,
        logits["start_logits"],
        logits["end_logits"],
        args.n_best,
        args.max_answer_length,
        with_null=args.version == "2.0",
    )
    return decoded, len(rows)


# ---- replay (benchmarks/training_parity.py)
def run_replay(args, tokenizer) -> dict:
    """Trains on bertkit's batches, in its order, from its head; losses and dev tags."""
    replay = np.load(args.batches)
    labels = [str(label) for label in replay["labels"]]
    model = transformers.BertForTokenClassification.from_pretrained(
        args.model, num_labels=len(labels)
    )
    with torch.no_grad():
        model.classifier.weight.copy_(torch.tensor(replay["kernel"].T))
        model.classifier.bias.zero_()
    steps, epochs = int(replay["steps_per_epoch"]), int(replay["epochs"])
    parts = int(replay["micro_batches"])  # micro-batches per update
    optimizer, schedule = make_optimizer(model, args, epochs * steps // parts)
    model.train()
    losses, total, rows = [], 0.0, 0
    for first in range(0, epochs * steps, parts):
        if first % steps == 0:
            total, rows = 0.0, 0  # Keras' running mean restarts every epoch
        batch = [
            {
                key: torch.tensor(replay[f"{key}_{first + k}"]).long()
                for key in ("token_ids", "padding_mask", "labels")
            }
            for k in range(parts)
        ]
        labelled = sum(int((part["labels"] != IGNORED).sum()) for part in batch)
        for part in batch:  # the whole batch's mean over its labelled tokens
            logits = model(
                input_ids=part["token_ids"],
                attention_mask=part["padding_mask"],
                token_type_ids=torch.zeros_like(part["token_ids"]),
            ).logits
            loss = (
                torch.nn.functional.cross_entropy(
                    logits.reshape(-1, len(labels)),
                    part["labels"].reshape(-1),
                    ignore_index=IGNORED,
                    reduction="sum",
                )
                / labelled
            )
            loss.backward()
            # Keras logs each micro-batch's loss scaled by the parts (its accumulation
            # averages them) and keeps a mean weighted by rows.
            total += loss.item() * parts * len(part["token_ids"])
            rows += len(part["token_ids"])
            losses.append(total / rows)
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    sentences = read_conll(args.dev)
    dev_rows, word_ids = ner_features(
        tokenizer, sentences, {label: i for i, label in enumerate(labels)}, args.max_length
    )
    logits = predict(
        model, dev_rows, transformers.DataCollatorForTokenClassification(tokenizer), 64, ["logits"]
    )["logits"]
    tags = [
        word_tags(row_logits, ids, len(words), labels)[0]
        for row_logits, ids, (words, _) in zip(logits, word_ids, sentences, strict=True)
    ]
    return {"losses": losses, "dev_tags": tags, "dev_gold": [tags for _, tags in sentences]}


# ---- throughput (benchmarks/throughput.py)
_TARGETS = ("labels", "start_positions", "end_positions")


def throughput_rows(args, tokenizer) -> tuple:
    """The task's model, data collator and its first `--rows` training rows."""
    if args.task == "classification":
        sentences = read_sentences(args.train)
        model = transformers.BertForSequenceClassification.from_pretrained(  # labels 0..k-1;
            args.model, num_labels=max(2, 1 + max(label for _, label in sentences))
        )  # >= 2
        encoded = tokenizer(
            [text for text, _ in sentences], truncation=True, max_length=args.max_length
        )
        rows = [
            {key: encoded[key][i] for key in encoded.keys()} | {"labels": label}
            for i, (_, label) in enumerate(sentences)
        ]
        return model, transformers.DataCollatorWithPadding(tokenizer), rows[: args.rows]
    if args.task == "tagging":
        sentences = read_conll(args.train)
        labels = sorted({tag for _, tags in sentences for tag in tags})
        model = transformers.BertForTokenClassification.from_pretrained(
            args.model, num_labels=len(labels)
        )
        rows, _ = ner_features(
            tokenizer, sentences, {label: i for i, label in enumerate(labels)}, args.max_length
        )
        return model, transformers.DataCollatorForTokenClassification(tokenizer), rows[: args.rows]
    model = transformers.BertForQuestionAnswering.from_pretrained(args.model)
    rows = qa_train_features(tokenizer, read_squad(args.train), args.max_length, args.stride)
    return model, transformers.DataCollatorWithPadding(tokenizer), rows[: args.rows]


def step_record(batch, seconds: float) -> dict:
    """A step's padded shape and real tokens (as benchmarks/throughput.py records them)."""
    lengths = batch["attention_mask"].sum(dim=1).long()
    return {
        "rows": int(lengths.numel()),
        "width": int(batch["input_ids"].shape[1]),
        "tokens": int(lengths.sum()),
        "tokens_squared": int((lengths**2).sum()),
        "seconds": seconds,
    }


def timed_train(model, rows, collator, args) -> list[dict]:
    """One epoch over `rows`, shuffled; a record per step (its seconds include collation)."""
    generator = torch.Generator().manual_seed(args.seed)
    loader = torch.utils.data.DataLoader(
        rows, batch_size=args.batch_size, shuffle=True, collate_fn=collator, generator=generator
    )
    optimizer, schedule = make_optimizer(model, args, len(loader))
    model.train()
    records, last = [], time.perf_counter()
    for batch in loader:
        train_step(model, batch, optimizer, schedule, args.max_grad_norm)
        now = time.perf_counter()
        records.append(step_record(batch, now - last))
        last = now
    return records


@torch.no_grad()
def timed_inference(model, rows, collator, batch_size: int) -> list[dict]:
    """A forward pass over `rows` in data order; a record per batch."""
    model.eval()
    rows = [{key: value for key, value in row.items() if key not in _TARGETS} for row in rows]
    records, last = [], time.perf_counter()
    for first in range(0, len(rows), batch_size):
        batch = collator(rows[first : first + batch_size])
        model(**batch)
        now = time.perf_counter()
        records.append(step_record(batch, now - last))
        last = now
    return records


def matmul_gflops(size: int, repeats: int = 3) -> float:
    """float32 `size` x `size` matmul GFLOP/s in torch, best of `repeats` after a warm-up."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    best = float("inf")
    for attempt in range(repeats + 1):
        started = time.perf_counter()
        torch.mm(a, b)
        if attempt:  # the first one warms up
            best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best / 1e9


def run_throughput(args, tokenizer) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    result = {"matmul_gflops": matmul_gflops(args.matmul_size) if args.matmul_size else None}
    model, collator, rows = throughput_rows(args, tokenizer)
    result["train_records"] = timed_train(model, rows, collator, args)
    timed_inference(model, rows, collator, args.eval_batch_size)  # warm-up pass
    result["inference_records"] = timed_inference(model, rows, collator, args.eval_batch_size)
    result["inference_seconds"] = sum(r["seconds"] for r in result["inference_records"])
    result["train_rows"] = len(rows)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    ner = commands.add_parser("ner", help="token classification on CoNLL files")
    ner.add_argument("--dev", required=True)
    ner.add_argument("--test", help="also tag this file after training")
    ner.add_argument(
        "--eval-each-epoch",
        action="store_true",
        help="also write the dev tags after every epoch (dev_tags_by_epoch)",
    )
    classify = commands.add_parser("classify", help="text classification on GLUE-style TSVs")
    classify.add_argument("--dev", required=True)
    classify.add_argument("--test", help="also classify this file with the kept model")
    classify.add_argument("--text", default="sentence", help="the text column")
    classify.add_argument("--text-pair", help="the second text's column (pair tasks)")
    classify.add_argument(
        "--regression", action="store_true", help="a numeric `label`: one output, MSE (STS-B)"
    )
    classify.add_argument(
        "--multi-label",
        action="store_true",
        help="`label` holds names joined by commas: a sigmoid per name, BCE (GoEmotions)",
    )
    classify.add_argument(
        "--label-names", help="--multi-label: every name, joined by commas (default: train's)"
    )
    choose = commands.add_parser("choose", help="multiple choice on CommonsenseQA JSON lines")
    choose.add_argument("--dev", required=True)
    choose.add_argument("--test", help="also answer this file with the kept model")
    replay = commands.add_parser("replay", help="train on bertkit's batches (training_parity)")
    replay.add_argument("--batches", required=True, help="the .npz training_parity.py writes")
    replay.add_argument("--dev", required=True)
    qa = commands.add_parser("qa", help="SQuAD v1.1 / v2.0 span QA")
    qa.add_argument(
        "--eval",
        required=True,
        nargs="+",
        help="the first: `predictions`; each: `predictions_by_eval`",
    )
    qa.add_argument("--version", choices=["1.1", "2.0"], default="1.1")
    qa.add_argument("--stride", type=int, default=128, help="overlap between windows (tokens)")
    qa.add_argument("--n-best", type=int, default=20)
    qa.add_argument("--max-answer-length", type=int, default=30)
    throughput = commands.add_parser("throughput", help="steady-state steps/s, one task")
    throughput.add_argument("--task", choices=["classification", "tagging", "qa"], required=True)
    throughput.add_argument("--rows", type=int, required=True, help="first N training rows")
    throughput.add_argument("--eval-batch-size", type=int, required=True)
    throughput.add_argument("--stride", type=int, default=128, help="qa: overlap (tokens)")
    throughput.add_argument("--matmul-size", type=int, default=0, help="0: no matmul timing")
    throughput.add_argument("--threads", type=int, default=0, help="0: torch's default")
    for command in (ner, classify, choose, qa):
        command.add_argument("--epochs", type=int, required=True)
    for command in (ner, classify, choose):
        command.add_argument(
            "--patience",
            type=int,
            default=None,
            help="dev after every epoch, the best epoch's model kept, stop after P epochs "
            "without a better one (Trainer's load_best_model_at_end + EarlyStoppingCallback)",
        )
    for command in (ner, classify, choose, qa, throughput, replay):
        command.add_argument("--model", required=True, help="a Hugging Face BERT folder")
        command.add_argument("--out", required=True)
        if command is not replay:
            command.add_argument("--train", required=True)
        command.add_argument("--max-length", type=int, required=True)
        command.add_argument("--batch-size", type=int, required=True)
        command.add_argument("--learning-rate", type=float, required=True)
        command.add_argument("--warmup-ratio", type=float, default=0.1)
        command.add_argument("--weight-decay", type=float, default=0.01)
        command.add_argument("--max-grad-norm", type=float, default=1.0)
        command.add_argument("--adam-epsilon", type=float, default=1e-6)
        command.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    transformers.logging.set_verbosity_error()  # no load report for the new head
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)  # the head's initialization and dropout
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    run = {
        "ner": run_ner,
        "classify": run_classify,
        "choose": run_choose,
        "qa": run_qa,
        "throughput": run_throughput,
        "replay": run_replay,
    }[args.command]
    result = run(args, tokenizer)
    result.update(
        torch_threads=torch.get_num_threads(),
        torch=torch.__version__,
        transformers=transformers.__version__,
        imported_at=IMPORTED_AT,
        finished_at=time.time(),
    )
    if args.command not in ("throughput", "replay"):
        result["train_sequences_per_second"] = result["sequences_trained"] / max(
            result["train_seconds"], 1e-9
        )
        print(
            f"trained {result['sequences_trained']} sequences in "
            f"{result['train_seconds']:.1f}s ({result['train_sequences_per_second']:.1f}/s, "
            f"{result['torch_threads']} threads)"
        )
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main()
