"""Constrained decoding: the transitions each scheme allows, and Viterbi over them."""

import itertools
import math
import random

import numpy as np
import pytest
import tensorflow as tf

from bertkit_tasks.tagging.decoding import choose_tags, sentence_batch
from bertkit_tasks.tagging.schemes import allowed_transitions, validate_tags

IOB = ["O"] + [f"{p}-{t}" for t in ("PER", "LOC") for p in "BI"]
BIOES = ["O"] + [f"{p}-{t}" for t in ("PER", "LOC") for p in "BIES"]
MIXED_BIOES = BIOES[1:5] + ["O"] + BIOES[5:]  # nothing may assume O is id 0
CASES = [("iob1", IOB), ("iob2", IOB), ("bioes", BIOES), ("bioes", MIXED_BIOES)]


def well_formed(labels, ids, scheme) -> bool:
    try:
        validate_tags([labels[i] for i in ids], scheme)
    except ValueError:
        return False
    return True


def fits(ids, allowed) -> bool:
    edge = len(allowed) - 1
    path = [edge, *ids, edge]
    return all(allowed[a, b] for a, b in itertools.pairwise(path))


@pytest.mark.parametrize(("scheme", "labels"), CASES, ids=["iob1", "iob2", "bioes", "mixed"])
def test_allowed_transitions_decide_well_formedness(scheme, labels):
    allowed = allowed_transitions(labels, scheme)
    assert allowed.shape == (len(labels) + 1, len(labels) + 1)
    for length in range(1, 5):
        for ids in itertools.product(range(len(labels)), repeat=length):
            assert fits(ids, allowed) == well_formed(labels, ids, scheme), [labels[i] for i in ids]


def test_hand_checked_transitions():
    iob2 = allowed_transitions(IOB, "iob2")  # O B-PER I-PER B-LOC I-LOC, edge 5
    assert iob2[1, 2] and iob2[2, 2] and not iob2[0, 2] and not iob2[3, 2] and not iob2[5, 2]
    iob1 = allowed_transitions(IOB, "iob1")
    assert iob1[0, 2] and iob1[2, 1] and not iob1[0, 1] and not iob1[5, 1] and not iob1[4, 1]
    bioes = allowed_transitions(BIOES, "bioes")  # O B I E S -PER, B I E S -LOC, edge 9
    assert bioes[1, 3] and bioes[3, 5] and not bioes[1, 0] and not bioes[1, 9]
    assert not bioes[0, 3] and not bioes[9, 2] and bioes[4, 9]


def best_well_formed(probabilities, labels, scheme):
    """The brute-force answer: the well-formed sequence with the highest probability."""
    candidates = [
        ids
        for ids in itertools.product(range(len(labels)), repeat=len(probabilities))
        if well_formed(labels, ids, scheme)
    ]
    return max(candidates, key=lambda ids: log_score(probabilities, ids))


def log_score(probabilities, ids) -> float:
    return sum(math.log(probabilities[k][i]) for k, i in enumerate(ids))


@pytest.mark.parametrize(("scheme", "labels"), CASES, ids=["iob1", "iob2", "bioes", "mixed"])
def test_viterbi_finds_the_most_probable_well_formed_sequence(scheme, labels):
    rng = np.random.default_rng(len(labels) + len(scheme))
    # peaked probabilities, so that the argmax is often ill-formed
    sentences = [rng.dirichlet([0.3] * len(labels), size=rng.integers(0, 5)) for _ in range(60)]
    chosen = choose_tags(ragged(sentences, len(labels)), allowed_transitions(labels, scheme))
    ill_formed_argmax = 0
    for probabilities, ids in zip(sentences, chosen.to_list(), strict=True):
        assert len(ids) == len(probabilities)
        assert well_formed(labels, ids, scheme)
        best = best_well_formed(probabilities, labels, scheme)
        assert log_score(probabilities, ids) == pytest.approx(
            log_score(probabilities, best), abs=1e-4
        )
        ill_formed_argmax += not well_formed(labels, probabilities.argmax(axis=1), scheme)
    assert ill_formed_argmax >= 10  # the cases where constraining changes something


def ragged(sentences, num_labels) -> tf.RaggedTensor:
    return sentence_batch(sentences, num_labels)


def test_argmax_without_constraints_and_fallback_when_nothing_fits():
    rng = np.random.default_rng(0)
    sentences = [rng.dirichlet([0.3] * len(IOB), size=n) for n in (3, 0, 1)]
    argmax = [s.argmax(axis=1).tolist() for s in sentences]
    assert choose_tags(ragged(sentences, len(IOB))).to_list() == argmax
    nothing = np.zeros((len(IOB) + 1, len(IOB) + 1), dtype=bool)
    assert choose_tags(ragged(sentences, len(IOB)), nothing).to_list() == argmax


def test_zero_probabilities_and_a_traced_signature():
    allowed = allowed_transitions(IOB, "iob2")

    @tf.function(input_signature=[tf.RaggedTensorSpec([None, None, len(IOB)], tf.float32, 1)])
    def decode(probabilities):
        return choose_tags(probabilities, allowed)

    # I-LOC may not follow B-PER; B-LOC I-LOC and B-PER I-PER hold a zero: O wins
    sentence = np.array([[0, 1, 0, 0, 0], [0.1, 0, 0, 0, 0.9]], dtype=np.float32)
    assert decode(ragged([sentence], len(IOB))).to_list() == [[1, 0]]
    assert decode(ragged([sentence[:1], sentence[:0]], len(IOB))).to_list() == [[1], []]
    assert decode.experimental_get_tracing_count() == 1


def test_random_label_orders_give_the_same_tags():
    rng, order = np.random.default_rng(1), list(range(len(BIOES)))
    sentences = [rng.dirichlet([0.3] * len(BIOES), size=4) for _ in range(20)]
    expected = choose_tags(ragged(sentences, len(BIOES)), allowed_transitions(BIOES, "bioes"))
    random.Random(2).shuffle(order)
    shuffled = [BIOES[i] for i in order]
    got = choose_tags(
        ragged([s[:, order] for s in sentences], len(BIOES)), allowed_transitions(shuffled, "bioes")
    )
    assert [[shuffled[i] for i in row] for row in got.to_list()] == [
        [BIOES[i] for i in row] for row in expected.to_list()
    ]
