"""`bertkit export --format transformers` checked by transformers itself: decoded outputs on dev.

For SST-2 classification, CoNLL-2003 tagging, SQuAD v1.1 span QA and CommonsenseQA multiple
choice, a tiny fine-tuning run
(the MiniLM checkpoint, a few hundred training examples, `--epochs` (3); an existing finished run in
`--workdir` is reused) is exported with `bertkit export RUN --format transformers`, and the
folder is loaded by transformers' own pipelines in the reference interpreter (`--python`,
torch + transformers; bertkit never imports torch). Both answer the same dev examples:

- classification: `pipeline("text-classification", truncation=True)`'s label against
  `bertkit.load(run).predict`'s;
- tagging (`decoding: argmax`, the rule transformers has): the raw text (the sentence's
  words joined by spaces), `pipeline("token-classification", aggregation_strategy="first")`'s
  entities (type, start, end) against bertkit's;
- span QA: `pipeline("question-answering", max_answer_len=30, max_seq_len=384,
  max_question_len=64)`'s answer text against bertkit's. Only SQuAD's dev files are here:
  the first `--train` questions train, the next `--examples` are compared;
- multiple choice (transformers has no pipeline for it): `AutoModelForMultipleChoice` on
  each question's `(question, choice)` pairs cut at the export's `choice_length`, the argmax
  choice against bertkit's answer.

Prints a Markdown table: per task, the examples whose decoded output is identical.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from common import PRESET, argument_parser, read_tsv, split_questions, write_first_sentences

import bertkit
from bertkit.run_dir import FINISHED, RunDirectory
from bertkit.serving.transformers_export import export_transformers
from bertkit_tasks.span_qa.squad import read_squad
from bertkit_tasks.tagging.conll import read_conll

# Runs in the reference interpreter: the exported folders through transformers' pipelines.
HF_SCRIPT = r"""
import json, sys, torch
from transformers import pipeline
torch.set_num_threads(2)
from transformers import AutoModelForQuestionAnswering, AutoTokenizer
jobs, results, loaded = json.load(open(sys.argv[1])), {}, {}
def answer(folder, question, context):
    # The best span (start <= end, at most 30 pieces, in the context) by start + end logit,
    # over windows of 384 pieces overlapping by 128, cut from the context by offsets.
    if folder not in loaded:
        loaded[folder] = (AutoTokenizer.from_pretrained(folder),
                          AutoModelForQuestionAnswering.from_pretrained(folder).eval())
    tokenizer, model = loaded[folder]
    rows = tokenizer(question, context, truncation="only_second", max_length=384, stride=128,
                     return_overflowing_tokens=True, return_offsets_mapping=True,
                     padding=True, return_tensors="pt")
    sequence_ids = [rows.sequence_ids(i) for i in range(len(rows["input_ids"]))]
    offsets = rows.pop("offset_mapping")
    rows.pop("overflow_to_sample_mapping")
    with torch.no_grad():
        out = model(**rows)
    best = (-1e9, "")
    for w in range(len(sequence_ids)):
        starts, ends = out.start_logits[w].tolist(), out.end_logits[w].tolist()
        in_context = [i for i, s in enumerate(sequence_ids[w]) if s == 1]
        for i in in_context:
            for j in in_context:
                if i <= j < i + 30 and starts[i] + ends[j] > best[0]:
                    best = (starts[i] + ends[j], context[offsets[w][i][0]:offsets[w][j][1]])
    return best[1]
def choose(folder, max_length, question, choices):
    # transformers has no multiple-choice pipeline: run_swag's inputs, the argmax choice
    from transformers import AutoModelForMultipleChoice
    if folder not in loaded:
        loaded[folder] = (AutoTokenizer.from_pretrained(folder),
                          AutoModelForMultipleChoice.from_pretrained(folder).eval())
    tokenizer, model = loaded[folder]
    rows = tokenizer([question] * len(choices), choices, truncation=True,
                     max_length=max_length, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**{k: v[None] for k, v in rows.items()}).logits[0]
    return choices[int(logits.argmax())]
for name, job in jobs.items():
    if job["pipeline"] == "":
        results[name] = [choose(job["folder"], job["max_length"], i["question"], i["choices"])
                         for i in job["inputs"]]
        continue
    if job["pipeline"] != "question-answering":
        pipe = pipeline(job["pipeline"], model=job["folder"], device="cpu")
    if job["pipeline"] == "text-classification":
        out = pipe(job["inputs"], batch_size=32, truncation=True)
        results[name] = [r["label"] for r in out]
        results[name + " scores"] = [r["score"] for r in out]
    elif job["pipeline"] == "token-classification":
        out = pipe(job["inputs"], aggregation_strategy="first", batch_size=32)
        results[name] = [[[e["entity_group"], e["start"], e["end"]] for e in row] for row in out]
    else:  # transformers 5 has no question-answering pipeline: run_qa's decoding, windows
        results[name] = [answer(job["folder"], q, c) for q, c in job["inputs"]]
json.dump(results, open(sys.argv[2], "w"))
"""


def recipe(task, data: dict, sequence_length: int, batch_size: int, epochs: int) -> dict:
    return {
        "schema": 1,
        "task": task,
        "backbone": {"preset": PRESET, "sequence_length": sequence_length},
        "data": data,
        "training": {
            "epochs": epochs,
            "batch_size": batch_size,
            "learning_rate": 1e-4,
            "seed": 1,
        },
    }


def prepare(data: Path, workdir: Path, train: int, examples: int, epochs: int) -> dict:
    """Per task: its recipe, and the dev inputs and gold answers of the compared examples."""
    workdir.mkdir(parents=True, exist_ok=True)
    sst2 = {"train": workdir / "sst2-train.tsv", "validation": workdir / "sst2-dev.tsv"}
    for name, source, count in (("train", "train.tsv", train), ("validation", "dev.tsv", examples)):
        rows = read_tsv(data / "sst2" / source, count)
        lines = ["sentence\tlabel"] + [f"{row['sentence']}\t{row['label']}" for row in rows]
        sst2[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    conll = {"train": workdir / "conll-train.txt", "validation": workdir / "conll-dev.txt"}
    write_first_sentences(data / "conll2003" / "train.txt", conll["train"], train)
    write_first_sentences(data / "conll2003" / "dev.txt", conll["validation"], examples)
    squad = {"train": workdir / "squad-train.json", "validation": workdir / "squad-dev.json"}
    split_questions(data / "squad" / "dev-v1.1.json", [train, examples], list(squad.values()))
    csqa = {"train": workdir / "csqa-train.jsonl", "validation": workdir / "csqa-dev.jsonl"}
    for name, source, count in (
        ("train", "train_rand_split.jsonl", train),
        ("validation", "dev_rand_split.jsonl", examples),
    ):
        lines = (data / "commonsenseqa" / source).read_text(encoding="utf-8").splitlines()
        csqa[name].write_text("\n".join(lines[:count]) + "\n", encoding="utf-8")
    choice_keys = {"question": "question.stem", "choices": "question.choices", "label": "answerKey"}
    sentences = read_conll(conll["validation"])
    questions, _ = read_squad(squad["validation"])
    asked = [json.loads(line)["question"] for line in csqa["validation"].read_text().splitlines()]
    return {
        "SST-2 classification": (
            recipe("classification", {**_paths(sst2), "text": "sentence"}, 64, 16, epochs),
            [row["sentence"] for row in read_tsv(sst2["validation"])],
        ),
        "CoNLL-2003 tagging": (
            recipe({"name": "tagging", "decoding": "argmax"}, _paths(conll), 128, 16, epochs),
            [" ".join(sentence.words) for sentence in sentences],
        ),
        "SQuAD v1.1 span QA": (
            recipe({"name": "span_qa", "version": "1.1"}, _paths(squad), 384, 16, epochs),
            [[question.question, question.context] for question in questions],
        ),
        "CommonsenseQA multiple choice": (
            recipe("multiple_choice", {**_paths(csqa), **choice_keys}, 126, 16, epochs),
            [{"question": q["stem"], "choices": [c["text"] for c in q["choices"]]} for q in asked],
        ),
    }


def _paths(files: dict) -> dict:
    return {key: str(path) for key, path in files.items()}


def finished_run(name: str, task_recipe: dict, workdir: Path) -> Path:
    """The task's run in `workdir`, fine-tuned unless a finished one is there."""
    run_dir = workdir / name.split()[0].lower() / "run"
    if RunDirectory(run_dir).status() != FINISHED:
        bertkit.finetune(task_recipe, output_dir=run_dir, verbose=0, overwrite=True)
    return run_dir


def bertkit_answers(run_dir: Path, inputs: list) -> list:
    """bertkit's decoded outputs, in the form the comparison reads."""
    predictions = bertkit.load(run_dir).predict(inputs)
    first = predictions[0]
    if "choice" in first:
        return [p["answer"] for p in predictions]
    if "label" in first:  # and the top label's probability, compared to the last digits
        return [p["label"] for p in predictions], [p["score"] for p in predictions]
    if "entities" in first:
        return [[[e["type"], e["start"], e["end"]] for e in p["entities"]] for p in predictions]
    return [p["answer"] for p in predictions]


def main() -> None:
    parser = argument_parser(__doc__, "the shared data folder")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bertkit-transformers-export"))
    parser.add_argument("--train", type=int, default=400, help="training examples per task")
    parser.add_argument("--examples", type=int, default=200, help="dev examples compared")
    parser.add_argument("--epochs", type=int, default=3, help="of the runs it fine-tunes")
    args = parser.parse_args()
    tasks = prepare(args.data, args.workdir, args.train, args.examples, args.epochs)
    jobs, ours, scores = {}, {}, {}
    for name, (task_recipe, inputs) in tasks.items():
        run_dir = finished_run(name, task_recipe, args.workdir)
        folder = run_dir.parent / "transformers"
        if folder.exists():
            subprocess.run(["rm", "-r", str(folder)], check=True)
        export = export_transformers(run_dir, folder)
        print(export.summary, flush=True)
        jobs[name] = {
            "pipeline": export.head.pipeline,
            "folder": str(folder),
            "inputs": inputs,
            "max_length": export.head.settings.get("choice_length"),
        }
        ours[name] = bertkit_answers(run_dir, inputs)
        if isinstance(ours[name], tuple):
            ours[name], scores[name] = ours[name]
    (args.workdir / "jobs.json").write_text(json.dumps(jobs))
    out = args.workdir / "transformers-answers.json"
    command = [args.python, "-c", HF_SCRIPT, str(args.workdir / "jobs.json"), str(out)]
    subprocess.run(command, check=True)
    theirs = json.loads(out.read_text())
    compared = {
        "SST-2": "label",
        "CoNLL-2003": "entities (type, start, end)",
        "SQuAD": "answer text",
        "CommonsenseQA": "the chosen answer (transformers: `AutoModelForMultipleChoice`, argmax)",
    }
    print("| task | dev examples | identical decoded outputs | what is compared |")
    print("|---|---:|---:|---|")
    for name, values in scores.items():
        largest = max(abs(a - b) for a, b in zip(values, theirs[name + " scores"], strict=True))
        compared[name.split()[0]] += f"; top-label probability differs by at most {largest:.1e}"
    differences = []
    for name, answers in ours.items():
        pairs = list(zip(answers, theirs[name], strict=True))
        same = sum(a == b for a, b in pairs)
        print(f"| {name} | {len(answers)} | {same} | {compared[name.split()[0]]} |")
        differences += [
            f"{name} #{i}: bertkit {a!r}, transformers {b!r}"
            for i, (a, b) in enumerate(pairs)
            if a != b
        ]
    print("\n".join(["", *differences]) if differences else "\nno differences")


if __name__ == "__main__":
    main()
