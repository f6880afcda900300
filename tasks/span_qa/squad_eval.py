"""SQuAD v1.1 and v2.0 scores, with the official evaluation scripts' semantics.

Written from the documented behaviour of `evaluate-v1.1.py` and
`evaluate-v2.0.py`, including their quirks, so that numbers compare with
published ones:

* answers are compared after `normalize_answer`; F1 is over whitespace tokens;
  a question scores the max over its gold answers;
* v2.0 drops gold answers that normalize to "" and gives an unanswerable
  question the single gold answer "", so predicting "" scores 1 on it;
* with `na_probs`, a question whose no-answer value exceeds `na_prob_thresh`
  (default 1.0, as in the script) is scored as if "" was predicted, and the
  best threshold search walks questions in order of `na_probs`.

One deliberate difference: a question with no prediction scores 0 and counts in
every total (the v1.1 rule). The v2.0 script leaves it out of the overall total
and crashes on the HasAns/NoAns breakdown.

`metric="cmrc2018"` scores each question with the CMRC 2018 script's EM and F1
(`bertkit_tasks.span_qa.cmrc_eval`) instead, every gold answer kept; the totals, the
no-answer threshold and the keys stay those above.
"""

from __future__ import annotations

import collections
import json
import re
import string
from collections.abc import Mapping, Sequence
from pathlib import Path

from bertkit_tasks.span_qa.cmrc_eval import cmrc_scores
from bertkit_tasks.span_qa.squad import QAExample

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lowercases, drops ASCII punctuation, then the words a/an/the, and collapses spaces.

    Example:
        >>> normalize_answer("The  Eiffel-Tower, in Paris!")
        'eiffeltower in paris'
        >>> normalize_answer("a theory of an apple")
        'theory of apple'
    """
    text = "".join(char for char in text.lower() if char not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> int:
    """1 if the normalized texts are equal, else 0.

    Example:
        >>> exact_match("the Beatles.", "Beatles"), exact_match("Beatles", "The Who")
        (1, 0)
    """
    return int(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str, version: str = "2.0") -> float:
    """Harmonic mean of token precision and recall over normalized tokens.

    v2.0: if either side has no tokens, 1.0 when both are empty, else 0.0.
    v1.1: no common tokens always gives 0.0, even when both are empty.

    Example:
        >>> f1_score("the big red car", "red car")  # "big red car": p = 2/3, r = 1
        0.8
        >>> f1_score("", ""), f1_score("", "", version="1.1")
        (1.0, 0.0)
    """
    prediction_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if version == "2.0" and not (prediction_tokens and gold_tokens):
        return float(prediction_tokens == gold_tokens)
    common = collections.Counter(prediction_tokens) & collections.Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(prediction_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def evaluate(
    examples: Sequence[QAExample],
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float] | None = None,
    *,
    na_prob_thresh: float = 1.0,
    version: str = "2.0",
    metric: str = "squad",
) -> dict:
    """Official SQuAD scores of `predictions` (id → answer text) against `examples`.

    Args:
        examples: the gold questions; a question "has an answer" when it has
            gold answers.
        predictions: answer text per question id, "" for "no answer".
        na_probs: per question id, how strongly the model predicts no answer
            (a probability or Google BERT's null score difference); enables
            the threshold and the `best_*` keys. Needs every predicted id.
        na_prob_thresh: questions with `na_probs` above it count as "".
        version: "2.0" (the v2.0 script, which also scores v1.1 data) or
            "1.1" (the v1.1 script: no unanswerable questions, no `na_probs`,
            gold answers that normalize to "" are kept and never earn F1).
        metric: "squad" (the official SQuAD scripts' EM and F1) or "cmrc2018" (the
            CMRC 2018 script's, see `question_scores`).

    Returns:
        `exact`, `f1` (percentages), `total`; `HasAns_exact`, `HasAns_f1`,
        `HasAns_total` and the same for `NoAns_` when such questions exist;
        with `na_probs`: `best_exact`, `best_exact_thresh`, `best_f1`, `best_f1_thresh`.

    Example:
        >>> gold = [QAExample("q1", "Who?", "Ada wrote it.", ("Ada",), (0,), False),
        ...         QAExample("q2", "When?", "Ada wrote it.", (), (), True)]
        >>> scores = evaluate(gold, {"q1": "Ada", "q2": "Ada"})
        >>> scores["exact"], scores["HasAns_exact"], scores["NoAns_exact"]
        (50.0, 100.0, 0.0)
    """
    _check_arguments(examples, na_probs, version, metric)
    has_answer = {example.id: bool(example.answers) for example in examples}
    raw_exact, raw_f1 = _raw_scores(examples, predictions, version, metric)
    if na_probs is not None and any(id_ not in na_probs for id_ in raw_exact):
        missing = next(id_ for id_ in raw_exact if id_ not in na_probs)
        raise ValueError(f"na_probs has no value for question {missing!r}")
    exact = _apply_threshold(raw_exact, na_probs, has_answer, na_prob_thresh)
    f1 = _apply_threshold(raw_f1, na_probs, has_answer, na_prob_thresh)
    results = _summary(exact, f1, list(has_answer))
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        ids = [id_ for id_, answered in has_answer.items() if answered == wanted]
        if ids:  # the official script leaves out an empty group's keys
            summary = _summary(exact, f1, ids)
            results.update({f"{prefix}_{key}": value for key, value in summary.items()})
    if na_probs is not None:
        for name, raw in (("exact", raw_exact), ("f1", raw_f1)):
            best, threshold = _best_threshold(raw, predictions, na_probs, has_answer)
            results.update({f"best_{name}": best, f"best_{name}_thresh": threshold})
    return results


def write_predictions(path, predictions: Mapping[str, object]) -> None:
    """Writes `{id: answer_text}` as the JSON file the official scripts read.

    The same layout serves a `na_probs` file (`{id: float}`).

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "predictions.json")
        >>> write_predictions(path, {"q1": "Ada", "q2": ""})
        >>> open(path).read()
        '{"q1": "Ada", "q2": ""}'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(predictions), ensure_ascii=False), encoding="utf-8")


def question_scores(
    prediction: str, golds, version: str = "2.0", metric: str = "squad"
) -> tuple[float, float]:
    """(exact, f1) of one question, the max over its gold answers, as `evaluate` scores it.

    SQuAD v2.0 drops gold answers that normalize to "" and gives a question without
    gold answers the single gold ""; CMRC 2018 keeps every gold answer.

    Example:
        >>> question_scores("北京大", ["北京大学"])  # one whitespace token each
        (0, 0.0)
        >>> exact, f1 = question_scores("北京大", ["北京大学"], metric="cmrc2018")
        >>> exact, round(f1, 4)
        (0, 0.8571)
    """
    if metric == "cmrc2018":
        return cmrc_scores(prediction, golds)
    golds = list(golds)
    if version == "2.0":
        golds = [gold for gold in golds if normalize_answer(gold)] or [""]
    exact = max(exact_match(prediction, gold) for gold in golds)
    return exact, max(f1_score(prediction, gold, version) for gold in golds)


def _check_arguments(examples, na_probs, version: str, metric: str) -> None:
    if metric not in ("squad", "cmrc2018"):
        raise ValueError(f"metric must be 'squad' or 'cmrc2018', got {metric!r}")
    if not examples:
        raise ValueError("no examples to evaluate")
    if version not in ("1.1", "2.0"):
        raise ValueError(f"version must be '1.1' or '2.0', got {version!r}")
    if version == "1.1" and (na_probs is not None or any(not e.answers for e in examples)):
        raise ValueError("SQuAD v1.1 has neither unanswerable questions nor na_probs")


def _raw_scores(examples, predictions, version: str, metric: str) -> tuple[dict, dict]:
    """Per-question (exact, f1) before any threshold, for the predicted questions."""
    exact, f1 = {}, {}
    for example in examples:
        if example.id in predictions:
            scores = question_scores(predictions[example.id], example.answers, version, metric)
            exact[example.id], f1[example.id] = scores
    return exact, f1


def _apply_threshold(scores: dict, na_probs, has_answer: dict, threshold: float) -> dict:
    """Scores with every question whose no-answer value is above `threshold` read as ""."""
    if na_probs is None:
        return scores
    return {
        id_: float(not has_answer[id_]) if na_probs[id_] > threshold else score
        for id_, score in scores.items()
    }


def _summary(exact: dict, f1: dict, ids: list) -> dict:
    """Percentages over `ids`; an id without a prediction scores 0."""
    total = len(ids)
    return {
        "exact": 100.0 * sum(exact.get(id_, 0) for id_ in ids) / total,
        "f1": 100.0 * sum(f1.get(id_, 0) for id_ in ids) / total,
        "total": total,
    }


def _best_threshold(raw: dict, predictions, na_probs, has_answer: dict) -> tuple[float, float]:
    """Best score (percent) over no-answer thresholds, and the threshold reaching it.

    Starts from "every question answered with ''" (all unanswerable questions
    right), then lowers the bar one question at a time in `na_probs` order. As
    in the official script, an unanswerable question loses its point when its
    prediction is any non-empty string (even one that normalizes to "").
    """
    score = sum(1 for id_ in raw if not has_answer[id_])
    best_score, best_threshold = score, 0.0
    for id_ in sorted(na_probs, key=na_probs.get):
        if id_ not in raw:
            continue
        if has_answer[id_]:
            score += raw[id_]
        elif predictions[id_]:
            score -= 1
        if score > best_score:
            best_score, best_threshold = score, na_probs[id_]
    return 100.0 * best_score / len(has_answer), best_threshold
