"""Entity-level scores as conlleval computes them; every expected number worked out by hand."""

import itertools
import random

import pytest

from bertkit_tasks.tagging.conlleval import (
    chunk_ends,
    chunk_starts,
    evaluate,
    extract_chunks,
    format_report,
    split_tag,
)

# (previous tag, tag, chunk starts at tag, chunk ends before tag), read off the
# rules of conlleval.pl and its BIOES edition.
BOUNDARY_RULES = [
    ("O", "O", False, False),
    ("O", "B-PER", True, False),
    ("O", "I-PER", True, False),  # I- after O starts a chunk
    ("O", "E-PER", True, False),
    ("O", "S-PER", True, False),
    ("B-PER", "I-PER", False, False),
    ("B-PER", "E-PER", False, False),
    ("B-PER", "B-PER", True, True),
    ("B-PER", "S-PER", True, True),
    ("B-PER", "O", False, True),
    ("B-PER", "I-LOC", True, True),  # a type change ends one chunk and starts another
    ("I-PER", "I-PER", False, False),
    ("I-PER", "E-PER", False, False),
    ("I-PER", "B-PER", True, True),  # IOB1: B- between two chunks of one type
    ("I-PER", "O", False, True),
    ("I-PER", "E-LOC", True, True),
    ("E-PER", "E-PER", True, True),
    ("E-PER", "I-PER", True, True),
    ("E-PER", "B-PER", True, True),
    ("E-PER", "O", False, True),
    ("S-PER", "I-PER", True, True),
    ("S-PER", "E-PER", True, True),
    ("S-PER", "S-PER", True, True),
    ("S-PER", "O", False, True),
]

ALL_TAGS = ["O"] + [f"{prefix}-{type_}" for prefix in "BIES" for type_ in ("PER", "LOC")]


@pytest.mark.parametrize("prev_tag, tag, starts, ends", BOUNDARY_RULES)
def test_boundary_rules(prev_tag, tag, starts, ends):
    assert chunk_starts(prev_tag, tag) is starts
    assert chunk_ends(prev_tag, tag) is ends


def test_rules_make_chunks_contiguous_and_disjoint():
    # What decode_chunks relies on: inside a chunk, a new start always ends the
    # old chunk, and a word left by an ended chunk is either O or starts one.
    for prev_tag, tag in itertools.product(ALL_TAGS, repeat=2):
        if prev_tag != "O" and chunk_starts(prev_tag, tag):
            assert chunk_ends(prev_tag, tag), (prev_tag, tag)
        if chunk_ends(prev_tag, tag) and tag != "O":
            assert chunk_starts(prev_tag, tag), (prev_tag, tag)
        if prev_tag == "O" and tag != "O":
            assert chunk_starts(prev_tag, tag), (prev_tag, tag)


def test_split_tag_keeps_hyphens_in_the_type_and_rejects_malformed_tags():
    assert split_tag("I-ORG-LOC") == ("I", "ORG-LOC")
    for tag in ("PER", "B-", "X-PER", "b-PER", ""):
        with pytest.raises(ValueError, match="unknown tag"):
            split_tag(tag)


@pytest.mark.parametrize(
    "tags, chunks",
    [
        (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 2), ("LOC", 3, 4)]),  # IOB2
        (["I-PER", "I-PER", "B-PER", "O"], [("PER", 0, 2), ("PER", 2, 3)]),  # IOB1
        (["I-PER", "I-LOC"], [("PER", 0, 1), ("LOC", 1, 2)]),  # IOB1 type change
        (["O", "I-PER", "I-PER"], [("PER", 1, 3)]),  # ill-formed IOB2: I- after O
        (["B-PER", "I-LOC"], [("PER", 0, 1), ("LOC", 1, 2)]),  # I-LOC after B-PER
        (["B-PER", "E-PER", "B-PER", "E-PER"], [("PER", 0, 2), ("PER", 2, 4)]),
        (["S-PER", "S-PER"], [("PER", 0, 1), ("PER", 1, 2)]),
        (["S-PER", "I-PER"], [("PER", 0, 1), ("PER", 1, 2)]),
        (["E-PER", "E-PER"], [("PER", 0, 1), ("PER", 1, 2)]),
        (["O", "E-PER", "O"], [("PER", 1, 2)]),  # E- after O is a one-word chunk
        (["B-PER", "I-PER"], [("PER", 0, 2)]),  # unclosed BIOES chunk ends with the sentence
        (["I-PER", "E-PER", "I-PER"], [("PER", 0, 2), ("PER", 2, 3)]),
        (["B-PER", "E-LOC"], [("PER", 0, 1), ("LOC", 1, 2)]),
        ([], []),
        (["O", "O"], []),
    ],
)
def test_extract_chunks(tags, chunks):
    assert extract_chunks(tags) == chunks


def test_perfect_iob2():
    tags = [["B-PER", "I-PER", "O", "B-LOC", "O"]]
    result = evaluate(tags, tags)
    assert (result["precision"], result["recall"], result["f1"], result["accuracy"]) == (1, 1, 1, 1)
    assert (result["found_gold"], result["found_predicted"], result["correct"]) == (2, 2, 2)
    assert result["tokens"] == 5


def test_type_mismatch():
    # gold PER(0,2) LOC(3,4); predicted PER(0,2) ORG(3,4): 1 of 2 correct each way.
    # Tags right at words 0, 1, 2 of 4.
    result = evaluate([["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "I-PER", "O", "B-ORG"]])
    assert (result["precision"], result["recall"], result["f1"]) == (0.5, 0.5, 0.5)
    assert result["accuracy"] == 0.75
    per_type = result["per_type"]
    assert list(per_type) == ["LOC", "ORG", "PER"]
    assert per_type["LOC"] == {
        "precision": 0.0,  # nothing predicted as LOC: 0, not a division error
        "recall": 0.0,
        "f1": 0.0,
        "support": 1,
        "found_predicted": 0,
        "correct": 0,
    }
    assert per_type["ORG"]["support"] == 0 and per_type["ORG"]["precision"] == 0.0
    assert per_type["PER"]["f1"] == 1.0


def test_boundary_mismatch_is_wrong():
    # gold LOC(0,3), predicted LOC(0,2): same start and type, different end.
    result = evaluate([["B-LOC", "I-LOC", "I-LOC", "O"]], [["B-LOC", "I-LOC", "O", "O"]])
    assert (result["correct"], result["precision"], result["recall"]) == (0, 0.0, 0.0)
    assert result["accuracy"] == 0.75


def test_outer_boundaries_match_but_an_inner_type_differs():
    # The predicted I-LOC splits the span into PER(0,1) LOC(1,2) PER(2,3): three
    # chunks, none equal to gold PER(0,3), although the outer boundaries agree.
    result = evaluate([["B-PER", "I-PER", "I-PER"]], [["B-PER", "I-LOC", "I-PER"]])
    assert (result["found_gold"], result["found_predicted"], result["correct"]) == (1, 3, 0)
    assert result["f1"] == 0.0
    assert result["accuracy"] == 2 / 3
    assert result["per_type"]["PER"]["found_predicted"] == 2
    assert result["per_type"]["LOC"]["support"] == 0


def test_iob1_and_iob2_spelling_of_one_chunk_agree():
    # I-PER I-PER (IOB1) and B-PER I-PER (IOB2) are both PER(0,2); only word 0's tag differs.
    result = evaluate([["I-PER", "I-PER", "O"]], [["B-PER", "I-PER", "O"]])
    assert (result["correct"], result["f1"]) == (1, 1.0)
    assert result["accuracy"] == 2 / 3


def test_iob1_b_tag_between_chunks_of_one_type():
    # gold PER(0,1) PER(1,2) LOC(3,4); predicted PER(0,2) LOC(3,4); LOC is correct.
    # P = 1/2, R = 1/3, F = 2 * 1/2 * 1/3 / (1/2 + 1/3) = (1/3) / (5/6) = 0.4.
    result = evaluate([["I-PER", "B-PER", "O", "I-LOC"]], [["I-PER", "I-PER", "O", "I-LOC"]])
    assert (result["found_gold"], result["found_predicted"], result["correct"]) == (3, 2, 1)
    assert result["precision"] == 0.5
    assert result["recall"] == pytest.approx(1 / 3)
    assert result["f1"] == pytest.approx(0.4)
    assert result["accuracy"] == 0.75  # words 0, 2, 3
    assert result["per_type"]["PER"]["support"] == 2
    assert result["per_type"]["PER"]["recall"] == 0.0


def test_ill_formed_predictions():
    # I-PER after O starts PER(1,3), equal to gold's B-PER I-PER.
    result = evaluate([["O", "B-PER", "I-PER"]], [["O", "I-PER", "I-PER"]])
    assert (result["correct"], result["f1"]) == (1, 1.0)
    # I-LOC after B-PER: PER(0,1) LOC(1,2), neither equal to gold PER(0,2).
    result = evaluate([["B-PER", "I-PER"]], [["B-PER", "I-LOC"]])
    assert (result["found_gold"], result["found_predicted"], result["correct"]) == (1, 2, 0)


def test_bioes():
    # gold PER(0,1) LOC(2,5); predicted PER(0,1) LOC(2,4) LOC(4,5): 1 correct.
    # P = 1/3, R = 1/2, F = (1/3) / (5/6) = 0.4; tags right at words 0, 1, 2 of 5.
    result = evaluate(
        [["S-PER", "O", "B-LOC", "I-LOC", "E-LOC"]], [["S-PER", "O", "B-LOC", "E-LOC", "S-LOC"]]
    )
    assert (result["found_gold"], result["found_predicted"], result["correct"]) == (2, 3, 1)
    assert result["precision"] == pytest.approx(1 / 3)
    assert result["recall"] == 0.5
    assert result["f1"] == pytest.approx(0.4)
    assert result["accuracy"] == 0.6


def test_empty_predictions_score_zero_without_division_errors():
    result = evaluate([["B-PER", "O"], ["B-LOC"]], [["O", "O"], ["O"]])
    assert (result["precision"], result["recall"], result["f1"]) == (0.0, 0.0, 0.0)
    assert (result["found_gold"], result["found_predicted"]) == (2, 0)
    assert result["accuracy"] == 1 / 3
    assert result["per_type"]["PER"]["precision"] == 0.0


def test_no_chunks_and_no_words():
    result = evaluate([["O", "O"]], [["O", "O"]])
    assert (result["f1"], result["accuracy"], result["per_type"]) == (0.0, 1.0, {})
    result = evaluate([], [])
    assert (result["tokens"], result["accuracy"], result["f1"]) == (0, 0.0, 0.0)


def test_chunks_never_cross_or_match_across_sentences():
    # Two one-word chunks, one per sentence; I-PER I-PER would merge within a sentence.
    result = evaluate([["O", "I-PER"], ["I-PER", "O"]], [["O", "I-PER"], ["I-PER", "O"]])
    assert (result["found_gold"], result["correct"]) == (2, 2)
    # Same (type, start, end) but in different sentences: not correct.
    result = evaluate([["B-PER"], ["O"]], [["O"], ["B-PER"]])
    assert (result["found_gold"], result["found_predicted"], result["correct"]) == (1, 1, 0)


GOLD = [["B-PER", "I-PER", "O", "B-LOC", "O", "B-ORG", "I-ORG"], ["B-LOC", "O", "B-PER"]]
PREDICTED = [["B-PER", "I-PER", "O", "B-LOC", "O", "B-ORG", "O"], ["B-LOC", "O", "B-LOC"]]
# gold:      PER(0,2) LOC(3,4) ORG(5,7) | LOC(0,1) PER(2,3)  -> PER 2, LOC 2, ORG 1
# predicted: PER(0,2) LOC(3,4) ORG(5,6) | LOC(0,1) LOC(2,3)  -> PER 1, LOC 3, ORG 1
# correct:   PER(0,2) LOC(3,4)          | LOC(0,1)           -> PER 1, LOC 2, ORG 0
# words: 10, wrong at sentence 0 word 6 and sentence 1 word 2 -> accuracy 0.8


def test_per_type_figures():
    result = evaluate(GOLD, PREDICTED)
    assert (result["found_gold"], result["found_predicted"], result["correct"]) == (5, 5, 3)
    assert result["precision"] == pytest.approx(0.6)
    assert result["recall"] == pytest.approx(0.6)
    assert result["f1"] == pytest.approx(0.6)
    assert result["accuracy"] == pytest.approx(0.8)
    loc, org, per = (result["per_type"][name] for name in ("LOC", "ORG", "PER"))
    # LOC: P 2/3, R 2/2, F = 2 * 2/3 / (5/3) = 0.8
    assert loc["precision"] == pytest.approx(2 / 3)
    assert (loc["recall"], loc["support"], loc["found_predicted"]) == (1.0, 2, 3)
    assert loc["f1"] == pytest.approx(0.8)
    assert (org["precision"], org["recall"], org["f1"], org["support"]) == (0.0, 0.0, 0.0, 1)
    # PER: P 1/1, R 1/2, F = 2 * 1/2 / (3/2) = 2/3
    assert (per["precision"], per["recall"], per["support"]) == (1.0, 0.5, 2)
    assert per["f1"] == pytest.approx(2 / 3)


def test_format_report_matches_conlleval_layout():
    assert format_report(evaluate(GOLD, PREDICTED)) == (
        "processed 10 tokens with 5 phrases; found: 5 phrases; correct: 3.\n"
        "accuracy:  80.00%; precision:  60.00%; recall:  60.00%; FB1:  60.00\n"
        "              LOC: precision:  66.67%; recall: 100.00%; FB1:  80.00  3\n"
        "              ORG: precision:   0.00%; recall:   0.00%; FB1:   0.00  1\n"
        "              PER: precision: 100.00%; recall:  50.00%; FB1:  66.67  1"
    )
    assert format_report(evaluate([], [])) == (
        "processed 0 tokens with 0 phrases; found: 0 phrases; correct: 0."
    )


def test_misaligned_input_is_rejected():
    with pytest.raises(ValueError, match="1 gold sentences but 2 predicted"):
        evaluate([["O"]], [["O"], ["O"]])
    with pytest.raises(ValueError, match="sentence 0: 2 gold tags but 1 predicted"):
        evaluate([["O", "O"]], [["O"]])
    with pytest.raises(ValueError, match="unknown tag 'PER'"):
        evaluate([["PER"]], [["O"]])


def conlleval_counts(gold, predicted):
    """conlleval.pl's main loop, transcribed: both columns walked in step, a
    boundary `O O` line after each sentence. Returns (correct, found gold, found predicted)."""
    correct = found_gold = found_predicted = 0
    in_correct, last_gold, last_predicted = False, "O", "O"
    lines = []
    for gold_tags, predicted_tags in zip(gold, predicted, strict=True):
        lines += [*zip(gold_tags, predicted_tags, strict=True), ("O", "O")]
    for gold_tag, predicted_tag in lines:
        gold_type, predicted_type = split_tag(gold_tag)[1], split_tag(predicted_tag)[1]
        gold_ends = chunk_ends(last_gold, gold_tag)
        predicted_ends = chunk_ends(last_predicted, predicted_tag)
        if in_correct:
            if (
                gold_ends
                and predicted_ends
                and split_tag(last_gold)[1] == split_tag(last_predicted)[1]
            ):
                in_correct, correct = False, correct + 1
            elif gold_ends != predicted_ends or gold_type != predicted_type:
                in_correct = False
        gold_starts = chunk_starts(last_gold, gold_tag)
        predicted_starts = chunk_starts(last_predicted, predicted_tag)
        if gold_starts and predicted_starts and gold_type == predicted_type:
            in_correct = True
        found_gold += gold_starts
        found_predicted += predicted_starts
        last_gold, last_predicted = gold_tag, predicted_tag
    return correct + in_correct, found_gold, found_predicted


def test_counts_equal_conllevals_walk_on_random_sequences():
    rng = random.Random(0)
    for _ in range(400):
        lengths = [rng.randint(0, 8) for _ in range(rng.randint(1, 3))]
        gold = [[rng.choice(ALL_TAGS) for _ in range(n)] for n in lengths]
        # Predictions that mostly copy gold, so that many chunks are correct.
        predicted = [[t if rng.random() < 0.7 else rng.choice(ALL_TAGS) for t in s] for s in gold]
        result = evaluate(gold, predicted)
        counts = (result["correct"], result["found_gold"], result["found_predicted"])
        assert counts == conlleval_counts(gold, predicted), (gold, predicted)
