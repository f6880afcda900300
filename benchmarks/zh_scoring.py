"""The scorers `benchmarks/chinese.py` applies to both toolkits' predictions: entity F1 on
character spans and the CMRC 2018 metric.

`cmrc_scores` is the one place that scores span QA: it uses bertkit's own CMRC 2018 metric
(`bertkit_tasks.span_qa.cmrc_eval`) where that module is installed, else `official_cmrc`, a
port of the official `cmrc2018_evaluate.py` (ymcui/cmrc2018): mixed segmentation (each
CJK character a token, other runs split as words, `nltk.word_tokenize` there, a regex of
word runs and single symbols here), its punctuation list removed, F1 by the longest common
token substring, EM on the punctuation-free strings, the best over every gold answer, an
unanswered question scoring 0.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

# the official script's `sp_char`
PUNCTUATION = set("-:_*^/\\~`+=，。：？！“”；’《》·、「」（）－～『』") | {"……"}
_CJK = re.compile(r"[\u4e00-\u9fa5]")
_WORDS = re.compile(r"\w+|[^\w\s]")


def spans_from_tags(tags: list[str]) -> set:
    """IOB2 tags, one a character -> `{(type, start, end)}` character spans (end exclusive)."""
    from bertkit_tasks.tagging.conlleval import extract_chunks

    return set(extract_chunks(tags))


def span_f1(gold: list[set], predicted: list[set]) -> dict:
    """Micro precision / recall / F1 of exact `(type, start, end)` spans over sentences.

    Example:
        >>> span_f1([{("PER", 0, 2)}, {("LOC", 1, 3)}], [{("PER", 0, 2)}, {("LOC", 1, 2)}])
        {'precision': 0.5, 'recall': 0.5, 'f1': 0.5, 'gold': 2, 'predicted': 2, 'correct': 1}
    """
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sentences, {len(predicted)} predicted")
    correct = sum(len(g & p) for g, p in zip(gold, predicted, strict=True))
    found_gold, found = sum(map(len, gold)), sum(map(len, predicted))
    precision = correct / found if found else 0.0
    recall = correct / found_gold if found_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if correct else 0.0
    return {
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "gold": found_gold,
        "predicted": found,
        "correct": correct,
    }


def cmrc_scores(dataset: Path, predictions: dict) -> dict:
    """EM and F1 (fractions) of `{id: answer}` on a SQuAD-style file, CMRC 2018's way."""
    try:
        from bertkit_tasks.span_qa import cmrc_eval  # noqa: F401 (issue 50, item 2)
    except ImportError:
        return official_cmrc(dataset, predictions)
    return bertkit_cmrc(dataset, predictions)


def bertkit_cmrc(dataset: Path, predictions: dict) -> dict:
    """bertkit's CMRC 2018 metric, question by question (every gold answer kept; an
    unanswered question scores 0, as in the official script)."""
    from bertkit_tasks.span_qa import cmrc_eval

    em = f1 = total = 0
    for qa in _questions(dataset):
        total += 1
        if qa["id"] in predictions:
            golds = [answer["text"] for answer in qa["answers"]]
            exact, score = cmrc_eval.cmrc_scores(predictions[qa["id"]], golds)
            em, f1 = em + exact, f1 + score
    return {"em": em / total, "f1": f1 / total, "questions": total, "scorer": "cmrc_eval"}


def _questions(dataset: Path):
    data = json.loads(Path(dataset).read_text(encoding="utf-8"))["data"]
    for article in data:
        for paragraph in article["paragraphs"]:
            yield from paragraph["qas"]


def segments(text: str, drop_punctuation: bool) -> list[str]:
    """The official script's `mixed_segmentation`."""
    out, run = [], ""
    for char in str(text).lower().strip():
        if drop_punctuation and char in PUNCTUATION:
            continue
        if _CJK.search(char) or char in PUNCTUATION:
            out += _WORDS.findall(run)
            run = ""
            out.append(char)
        else:
            run += char
    return out + _WORDS.findall(run)


def _lcs_length(first: list, second: list) -> int:
    best, previous = 0, [0] * (len(second) + 1)
    for a in first:
        current = [0] * (len(second) + 1)
        for j, b in enumerate(second):
            if a == b:
                current[j + 1] = previous[j] + 1
                best = max(best, current[j + 1])
        previous = current
    return best


def answer_f1(answers: list[str], prediction: str) -> float:
    scores = [0.0]
    predicted = segments(prediction, drop_punctuation=True)
    for answer in answers:
        gold = segments(answer, drop_punctuation=True)
        common = _lcs_length(gold, predicted)
        if common:
            precision, recall = common / len(predicted), common / len(gold)
            scores.append(2 * precision * recall / (precision + recall))
    return max(scores)


def answer_em(answers: list[str], prediction: str) -> float:
    def strip(text):
        return "".join(c for c in str(text).lower().strip() if c not in PUNCTUATION)

    return float(any(strip(answer) == strip(prediction) for answer in answers))


def official_cmrc(dataset: Path, predictions: dict) -> dict:
    """The official script's EM / F1 over every question of the file (fractions).

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "d.json"
        >>> qa = {"id": "q", "question": "?", "answers": [{"text": "北京大学", "answer_start": 0}]}
        >>> paragraph = {"context": "北京大学", "qas": [qa]}
        >>> _ = path.write_text(json.dumps({"data": [{"paragraphs": [paragraph]}]}))
        >>> official_cmrc(path, {"q": "北京大"})["f1"]
        0.8571428571428571
    """
    em = f1 = total = 0
    for qa in _questions(dataset):
        total += 1
        if qa["id"] in predictions:
            answers = [answer["text"] for answer in qa["answers"]]
            f1 += answer_f1(answers, predictions[qa["id"]])
            em += answer_em(answers, predictions[qa["id"]])
    return {"em": em / total, "f1": f1 / total, "questions": total, "scorer": "official port"}
