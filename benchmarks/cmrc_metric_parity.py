"""bertkit's CMRC 2018 EM/F1 against the official script's, on the same predictions.

    python benchmarks/cmrc_metric_parity.py PATH/cmrc2018_evaluate.py --python PYTHON \\
        --data ../shared/data/cmrc2018_trial/cmrc2018_trial.json ../shared/data/drcd/DRCD_dev.json

The official script (github.com/ymcui/cmrc2018, `squad-style-data/cmrc2018_evaluate.py`,
not copied here) is run by `--python`, an interpreter with NLTK installed: Python 2.7 runs
the file as it is; Python 3 runs it after four textual edits that only make it parse and
run there (`ur'` -> `r'`, no `reload(sys)` / `setdefaultencoding`, no `.decode('utf-8')`).
Either way `nltk.word_tokenize` is called with `preserve_line=True`, as NLTK's Punkt
sentence data cannot be downloaded here: each non-Chinese run is tokenized as one line.

Prediction sets, per question built from its first answer (seeded): `gold`; `short` (a
character less at the end); `long` (the next context character added); `random` (a random
span of the context, 1 to 20 characters); `latin` (a span around the first run of Latin
letters or digits of the context, else a random span); `padded` (the gold in 《》 with
spaces and a comma); `empty` (""). Per set: both scorers' EM and F1 over all questions,
their difference, and the questions whose EM or F1 differ by more than 1e-9.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# Run by --python (2.7 or 3): loads the official script and scores each prediction file.
_DRIVER = r"""
import io, json, sys
import nltk
_tokenize = nltk.word_tokenize
nltk.word_tokenize = lambda text, language="english", preserve_line=True: _tokenize(
    text, language, True)
script, gold_path, out_path = sys.argv[1:4]
if sys.version_info[0] >= 3:
    source = io.open(script, encoding="utf-8").read()
    for old, new in (("reload(sys)", ""), ("sys.setdefaultencoding('utf8')", ""),
                     (".decode('utf-8')", ""), ("ur'", "r'")):
        source = source.replace(old, new)
else:
    source = open(script, "rb").read()
namespace = {"__name__": "cmrc2018_evaluate"}
exec(compile(source, script, "exec"), namespace)
gold = json.load(io.open(gold_path, encoding="utf-8"))
results = {}
for path in sys.argv[4:]:
    predictions = json.load(io.open(path, encoding="utf-8"))
    f1, em, total, skip = namespace["evaluate"](gold, predictions)
    per_question = {}
    for article in gold["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                answers = [answer["text"] for answer in qa["answers"]]
                prediction = predictions[qa["id"].strip()]
                per_question[qa["id"]] = [namespace["calc_em_score"](answers, prediction),
                                          namespace["calc_f1_score"](answers, prediction)]
    results[path] = {"em": em, "f1": f1, "total": total, "per_question": per_question}
open(out_path, "w").write(json.dumps(results))
"""
_LATIN = re.compile(r"[A-Za-z0-9]+")


def prediction_sets(examples, seed: int) -> dict[str, dict[str, str]]:
    """{set name: {question id: prediction}} as the module docstring describes."""
    rng = random.Random(seed)
    sets = {name: {} for name in ("gold", "short", "long", "random", "latin", "padded", "empty")}
    for example in examples:
        gold, context = example.answers[0], example.context
        start = max(example.answer_starts[0], 0)
        end = start + len(gold)
        span_start = rng.randrange(len(context))
        random_span = context[span_start : span_start + rng.randint(1, 20)]
        latin = _LATIN.search(context)
        if latin:
            first = max(latin.start() - rng.randint(0, 4), 0)
            latin_span = context[first : latin.end() + rng.randint(0, 4)]
        else:
            latin_span = random_span
        predictions = {
            "gold": gold,
            "short": gold[:-1],
            "long": gold + context[end : end + 1],
            "random": random_span,
            "latin": latin_span,
            "padded": f" 《{gold}》， ",
            "empty": "",
        }
        for name, prediction in predictions.items():
            sets[name][example.id] = prediction
    return sets


def official_scores(script, python, gold_path, files: dict, folder: Path) -> dict:
    driver = folder / "driver.py"
    driver.write_text(_DRIVER, encoding="utf-8")
    out = folder / "official.json"
    command = [
        python,
        str(driver),
        str(script),
        str(gold_path),
        str(out),
        *map(str, files.values()),
    ]
    subprocess.run(command, check=True)
    results = json.loads(out.read_text(encoding="utf-8"))
    return {name: results[str(path)] for name, path in files.items()}


def bertkit_scores(examples, predictions: dict) -> dict:
    from bertkit_tasks.span_qa.squad_eval import evaluate, question_scores

    totals = evaluate(examples, predictions, version="1.1", metric="cmrc2018")
    per_question = {
        e.id: list(question_scores(predictions[e.id], e.answers, metric="cmrc2018"))
        for e in examples
    }
    return {"em": totals["exact"], "f1": totals["f1"], "per_question": per_question}


def compare(script, python, gold_path: Path, seed: int) -> list[list]:
    from bertkit_tasks.span_qa.squad import read_squad

    examples, placement = read_squad(gold_path)
    print(f"{gold_path.name}: {len(examples)} questions; {placement}", file=sys.stderr)
    sets = prediction_sets(examples, seed)
    with tempfile.TemporaryDirectory() as folder:
        files = {}
        for name, predictions in sets.items():
            files[name] = Path(folder) / f"{name}.json"
            files[name].write_text(json.dumps(predictions, ensure_ascii=False), encoding="utf-8")
        official = official_scores(script, python, gold_path, files, Path(folder))
    rows = []
    for name, predictions in sets.items():
        ours, theirs = bertkit_scores(examples, predictions), official[name]
        differing = [
            id_
            for id_, scores in theirs["per_question"].items()
            if any(
                abs(a - b) > 1e-9 for a, b in zip(ours["per_question"][id_], scores, strict=True)
            )
        ]
        for id_ in differing[:3]:
            gold = next(e.answers for e in examples if e.id == id_)
            print(
                f"  {name} {id_}: prediction {predictions[id_]!r}, gold {gold!r}: official "
                f"{theirs['per_question'][id_]}, bertkit {ours['per_question'][id_]}",
                file=sys.stderr,
            )
        differing = len(differing)
        rows.append(
            [gold_path.name, name, theirs["em"], ours["em"], theirs["f1"], ours["f1"], differing]
        )
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("script", type=Path, help="the official cmrc2018_evaluate.py")
    parser.add_argument("--python", required=True, help="an interpreter with NLTK installed")
    parser.add_argument("--data", type=Path, nargs="+", required=True, help="SQuAD-style files")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rows = [row for path in args.data for row in compare(args.script, args.python, path, args.seed)]
    print(
        "| data | predictions | official EM | bertkit EM | official F1 | bertkit F1 | "
        "questions differing |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for data, name, em_o, em_b, f1_o, f1_b, differing in rows:
        print(
            f"| {data} | {name} | {em_o:.4f} | {em_b:.4f} | {f1_o:.4f} | {f1_b:.4f} | {differing} |"
        )
    worst = max(max(abs(r[2] - r[3]), abs(r[4] - r[5])) for r in rows)
    print(f"largest difference in EM or F1: {worst:.6f} points")
    return 0 if worst <= 0.01 else 1


if __name__ == "__main__":
    sys.exit(main())
