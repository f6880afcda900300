"""Tests for bertkit_tasks.span_qa.squad_eval, each expected number computed by hand."""

import json

import pytest

from bertkit_tasks.span_qa.squad import QAExample
from bertkit_tasks.span_qa.squad_eval import (
    evaluate,
    exact_match,
    f1_score,
    normalize_answer,
    write_predictions,
)


def question(id_, *answers):
    """A QAExample whose gold answers are `answers` (none: unanswerable)."""
    return QAExample(id_, "?", "unused", answers, (0,) * len(answers), not answers)


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("The Cat!", "cat"),
        ("an apple a day", "apple day"),
        ("theater and anthem", "theater and anthem"),  # articles only as whole words
        ("the-end", "theend"),  # punctuation goes first, so "the" is no longer a word
        ("U.S.A.", "usa"),
        ("  Many \t spaces\n", "many spaces"),
        ("“Paris”", "“paris”"),  # only ASCII punctuation is removed
        ("", ""),
    ],
)
def test_normalize_answer(text, normalized):
    assert normalize_answer(text) == normalized


def test_exact_match_compares_normalized_text():
    assert exact_match("The Denver Broncos.", "denver broncos") == 1
    assert exact_match("Denver", "Denver Broncos") == 0


def test_f1_partial_overlap():
    # "quick brown fox" vs "quick red fox jumps": common {quick, fox} = 2,
    # precision 2/3, recall 2/4, F1 = 2 * (2/3 * 1/2) / (2/3 + 1/2) = 4/7.
    assert f1_score("the quick brown fox", "a quick red fox jumps") == pytest.approx(4 / 7)


def test_f1_counts_repeated_tokens_once_per_match():
    # [new, york, new, york] vs [new, york]: common 2, p = 2/4, r = 2/2, F1 = 2/3.
    assert f1_score("New York New York", "New York") == pytest.approx(2 / 3)


def test_f1_with_empty_sides():
    assert f1_score("", "Paris") == 0.0
    assert f1_score("the", "") == 1.0  # both normalize to no tokens
    assert f1_score("the", "", version="1.1") == 0.0


def test_max_over_gold_answers():
    golds = question("q1", "Broncos", "Denver Broncos team")
    # exact: 0 and 0. F1: "denver" vs [broncos] = 0; vs [denver, broncos, team]:
    # p = 1, r = 1/3, F1 = 2 * (1/3) / (4/3) = 1/2.
    scores = evaluate([golds], {"q1": "Denver"})
    assert scores == {
        "exact": 0.0,
        "f1": 50.0,
        "total": 1,
        "HasAns_exact": 0.0,
        "HasAns_f1": 50.0,
        "HasAns_total": 1,
    }
    assert evaluate([golds], {"q1": "the broncos"})["exact"] == 100.0


TOY = [question("q1", "Paris"), question("q2", "the Eiffel Tower"), question("q3"), question("q4")]


def test_v2_has_answer_and_no_answer_breakdown():
    predictions = {"q1": "Paris", "q2": "Eiffel", "q3": "", "q4": "Lyon"}
    # exact: 1, 0, 1, 0.  F1: 1, "eiffel" vs [eiffel, tower] = 2 * 1/2 / (3/2) = 2/3, 1, 0.
    scores = evaluate(TOY, predictions)
    assert scores == pytest.approx(
        {
            "exact": 50.0,
            "f1": 100 * (1 + 2 / 3 + 1 + 0) / 4,
            "total": 4,
            "HasAns_exact": 50.0,
            "HasAns_f1": 100 * (1 + 2 / 3) / 2,
            "HasAns_total": 2,
            "NoAns_exact": 50.0,
            "NoAns_f1": 50.0,
            "NoAns_total": 2,
        }
    )


def test_best_threshold_search_on_four_questions():
    predictions = {"q1": "Paris", "q2": "Eiffel", "q3": "Lyon", "q4": "Nice"}
    na_probs = {"q1": 0.1, "q2": 0.6, "q3": 0.7, "q4": 0.9}
    # Raw exact 1, 0, 0, 0; raw F1 1, 2/3, 0, 0. The search starts from "all
    # no answer" = 2 right (q3, q4), then answers questions in na_probs order:
    #   exact: q1 +1 -> 3 (best, 0.1); q2 +0 -> 3; q3 -1 -> 2; q4 -1 -> 1.
    #   F1:    q1 +1 -> 3 (best, 0.1); q2 +2/3 -> 11/3 (best, 0.6); q3, q4 -1 each.
    scores = evaluate(TOY, predictions, na_probs)
    assert scores["exact"] == 25.0  # every na_prob <= 1.0, the default threshold
    assert scores["f1"] == pytest.approx(100 * (1 + 2 / 3) / 4)
    assert scores["best_exact"] == 75.0
    assert scores["best_exact_thresh"] == 0.1
    assert scores["best_f1"] == pytest.approx(100 * (11 / 3) / 4)
    assert scores["best_f1_thresh"] == 0.6


def test_na_prob_thresh_reads_questions_above_it_as_no_answer():
    predictions = {"q1": "Paris", "q2": "Eiffel", "q3": "Lyon", "q4": "Nice"}
    na_probs = {"q1": 0.1, "q2": 0.6, "q3": 0.7, "q4": 0.9}
    scores = evaluate(TOY, predictions, na_probs, na_prob_thresh=0.6)
    # q2 stays answered (0.6 is not above 0.6): F1 1, 2/3, 1, 1, the best_f1 found above.
    assert scores["f1"] == pytest.approx(scores["best_f1"])
    assert evaluate(TOY, predictions, na_probs, na_prob_thresh=0.5)["exact"] == 75.0


def test_threshold_search_penalizes_any_non_empty_prediction_like_the_official_script():
    examples = [question("q1", "Paris"), question("q2")]
    predictions = {"q1": "Paris", "q2": "."}  # "." normalizes to "": right on its own
    scores = evaluate(examples, predictions, {"q1": 0.9, "q2": 0.2})
    assert scores["exact"] == 100.0
    # Search: start 1 (q2); q2 has "." -> -1 -> 0; q1 +1 -> 1, not above 1.
    assert (scores["best_exact"], scores["best_exact_thresh"]) == (50.0, 0.0)


def test_missing_prediction_scores_zero_and_extra_ones_are_ignored():
    examples = [question("q1", "Paris"), question("q2", "Rome")]
    scores = evaluate(examples, {"q1": "Paris", "q9": "Oslo"})
    assert (scores["exact"], scores["total"]) == (50.0, 2)


def test_v1_keeps_gold_answers_that_normalize_to_nothing():
    examples = [question("q1", "The")]
    assert evaluate(examples, {"q1": "the"})["f1"] == 100.0  # v2.0: gold becomes ""
    assert evaluate(examples, {"q1": "the"}, version="1.1")["f1"] == 0.0
    assert evaluate(examples, {"q1": "the"}, version="1.1")["exact"] == 100.0


def test_argument_errors():
    with pytest.raises(ValueError, match="v1.1 has neither unanswerable"):
        evaluate(TOY, {}, version="1.1")
    with pytest.raises(ValueError, match="na_probs has no value for question 'q2'"):
        evaluate(TOY, {"q1": "", "q2": ""}, {"q1": 0.5})
    with pytest.raises(ValueError, match="no examples"):
        evaluate([], {})


def test_write_predictions_writes_the_official_layout(tmp_path):
    path = tmp_path / "run" / "predictions.json"
    write_predictions(path, {"q1": "Zürich", "q2": ""})
    assert json.loads(path.read_text(encoding="utf-8")) == {"q1": "Zürich", "q2": ""}
