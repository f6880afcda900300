"""Tests for bertkit_tasks.span_qa.span_decoding: hand cases, a brute-force reference, tracing."""

import random

import numpy as np
import pytest
import tensorflow as tf

from bertkit.windows import sliding_windows
from bertkit_tasks.span_qa.span_decoding import (
    answer_char_span,
    decode_answer_spans,
    span_candidates,
)

NEG = float("-inf")


def decode(start_logits, end_logits, example_ids, start_ok, end_ok, **options):
    """decode_answer_spans on Python lists, results as Python lists."""
    outputs = decode_answer_spans(
        tf.constant(start_logits, tf.float32),
        tf.constant(end_logits, tf.float32),
        tf.constant(example_ids, tf.int32),
        tf.constant(start_ok, tf.bool),
        tf.constant(end_ok, tf.bool),
        **options,
    )
    return {key: value.numpy().tolist() for key, value in outputs.items()}


def spans(outputs, example=0):
    """The (window, start, end, score) entries of one example, best first."""
    keys = ("window_index", "start_index", "end_index", "span_score")
    return list(zip(*(outputs[key][example] for key in keys), strict=True))


def one_hot(length, scores):
    """A logits row of zeros with `scores` {position: value} set."""
    row = [0.0] * length
    for position, value in scores.items():
        row[position] = value
    return row


def test_answer_in_second_window():
    # 6 context tokens, windows (0, 4) and (2, 6); [CLS] q [SEP] puts them at 3...
    windows = sliding_windows(6, window_size=4, stride=2)
    start_ok, end_ok = span_candidates(windows, context_offset=3, sequence_length=8)
    start = [one_hot(8, {}), one_hot(8, {5: 4.0})]  # context token 4 in window 1
    end = [one_hot(8, {}), one_hot(8, {6: 3.0})]  # context token 5 in window 1
    outputs = decode(start, end, [0, 0], start_ok, end_ok, n_best_size=1)
    assert spans(outputs) == [(1, 5, 6, 7.0)]


def test_end_before_start_is_excluded():
    ok = [[False] + [True] * 5]
    start = [[0.0, 0.0, 0.0, 0.0, 5.0, 0.0]]
    end = [[0.0, 0.0, 5.0, 0.0, 1.0, 0.0]]  # (4, 2) would score 10
    outputs = decode(start, end, [0], ok, ok, n_best_size=3)
    # (4, 4) = 5 + 1 is best; (1, 2), (2, 2) and (4, 5) tie at 5, earlier start first.
    assert spans(outputs) == [(0, 4, 4, 6.0), (0, 1, 2, 5.0), (0, 2, 2, 5.0)]


def test_too_long_span_is_excluded():
    ok = [[False] + [True] * 5]
    start = [[0.0, 5.0, 0.0, 0.0, 0.0, 0.0]]
    end = [[0.0, 0.0, 0.0, 0.0, 5.0, 0.0]]  # (1, 4) is 4 tokens long
    outputs = decode(start, end, [0], ok, ok, max_answer_length=3, n_best_size=2)
    assert spans(outputs) == [(0, 1, 1, 5.0), (0, 1, 2, 5.0)]  # many ties at 5
    assert spans(decode(start, end, [0], ok, ok, max_answer_length=4, n_best_size=1)) == [
        (0, 1, 4, 10.0)
    ]


def test_max_context_window_decides_overlapping_tokens():
    # Context token 3 is in both windows; window 1 has more context around it.
    windows = sliding_windows(6, window_size=4, stride=2)  # (0, 4), (2, 6)
    start_ok, end_ok = span_candidates(windows, context_offset=1, sequence_length=6)
    start = [one_hot(6, {4: 9.0}), one_hot(6, {2: 1.0})]  # token 3 in each window
    end = [one_hot(6, {4: 1.0}), one_hot(6, {2: 1.0})]
    outputs = decode(start, end, [0, 0], start_ok, end_ok, n_best_size=1)
    assert spans(outputs) == [(1, 2, 2, 2.0)]  # window 0's 9.0 may not start a span


def test_several_examples_padding_and_null_scores():
    start = [[1.0, 2.0, 3.0], [-1.0, 0.0, 0.0], [2.0, 4.0, 0.0]]
    end = [[1.0, 2.0, 0.0], [0.0, 0.0, 0.0], [-5.0, 1.0, 0.0]]
    start_ok = [[False, True, False], [False, False, False], [False, True, False]]
    end_ok = [[False, True, True], [False, False, False], [False, True, True]]
    outputs = decode(start, end, [0, 1, 1], start_ok, end_ok, n_best_size=3)
    assert spans(outputs, 0) == [(0, 1, 1, 4.0), (0, 1, 2, 2.0), (-1, -1, -1, NEG)]
    assert spans(outputs, 1) == [(2, 1, 1, 5.0), (2, 1, 2, 4.0), (-1, -1, -1, NEG)]
    # Example 0: 1 + 1 = 2. Example 1: min(-1 + 0, 2 - 5) = -3.
    assert outputs["null_score"] == [2.0, -3.0]
    assert outputs["null_score_diff"] == [2.0 - 4.0, -3.0 - 5.0]


def test_example_without_valid_span_prefers_no_answer():
    outputs = decode([[0.0, 1.0]], [[0.0, 1.0]], [0], [[False, False]], [[False, True]])
    assert outputs["start_index"] == [[-1] * 20]
    assert outputs["null_score_diff"] == [float("inf")]


def brute_force(start, end, example_ids, start_ok, end_ok, max_answer_length, n_best_size):
    """Every valid span of every window, sorted and cut: the reference rule."""
    num_windows, seq_length = start.shape
    candidates = {example: [] for example in example_ids}
    for w in range(num_windows):
        for s in range(seq_length):
            for e in range(s, min(seq_length, s + max_answer_length)):
                if start_ok[w, s] and end_ok[w, e]:
                    score = float(start[w, s] + end[w, e])  # float32 sum, as in TF
                    candidates[example_ids[w]].append((-score, w, s, e))
    best, null = [], []
    for example in sorted(candidates):
        top = sorted(candidates[example])[:n_best_size]
        top += [(-NEG, -1, -1, -1)] * (n_best_size - len(top))
        best.append([(w, s, e, -negated) for negated, w, s, e in top])
        cls = [start[w, 0] + end[w, 0] for w in range(num_windows) if example_ids[w] == example]
        null.append(float(min(cls)))
    return best, null


def random_batch(rng):
    num_windows, seq_length = rng.randint(1, 6), rng.randint(1, 12)
    num_examples = rng.randint(1, num_windows)
    extra = [rng.randrange(num_examples) for _ in range(num_windows - num_examples)]
    example_ids = sorted(list(range(num_examples)) + extra)
    numbers = np.random.default_rng(rng.randrange(2**32))
    start, end = numbers.normal(size=(2, num_windows, seq_length)).astype(np.float32)
    start_ok, end_ok = numbers.random((2, num_windows, seq_length)) < 0.6
    return start, end, example_ids, start_ok, end_ok


def test_matches_brute_force_on_random_batches():
    rng = random.Random(7)
    for _ in range(40):
        batch = random_batch(rng)
        max_answer_length, n_best_size = rng.randint(1, 5), rng.randint(1, 8)
        outputs = decode(*batch, max_answer_length=max_answer_length, n_best_size=n_best_size)
        expected, expected_null = brute_force(*batch, max_answer_length, n_best_size)
        assert [spans(outputs, e) for e in range(len(expected))] == expected
        assert outputs["null_score"] == pytest.approx(expected_null)


SIGNATURE = [
    tf.TensorSpec([None, None], tf.float32, name="start_logits"),
    tf.TensorSpec([None, None], tf.float32, name="end_logits"),
    tf.TensorSpec([None], tf.int32, name="example_ids"),
    tf.TensorSpec([None, None], tf.bool, name="start_candidates"),
    tf.TensorSpec([None, None], tf.bool, name="end_candidates"),
]


def test_traces_with_unknown_windows_and_length_and_survives_a_saved_model(tmp_path):
    module = tf.Module()
    module.decode = tf.function(
        lambda *inputs: decode_answer_spans(*inputs, max_answer_length=4, n_best_size=3),
        input_signature=SIGNATURE,
    )
    traced = module.decode.get_concrete_function().structured_outputs
    assert traced["start_index"].shape.as_list() == [None, 3]  # n_best_size stays static
    assert traced["null_score"].shape.as_list() == [None]
    tf.saved_model.save(module, str(tmp_path / "decoder"))
    reloaded = tf.saved_model.load(str(tmp_path / "decoder"))
    rng = random.Random(3)
    for _ in range(3):  # different batch and sequence sizes, one trace
        batch = random_batch(rng)
        tensors = [tf.constant(x, spec.dtype) for x, spec in zip(batch, SIGNATURE, strict=True)]
        eager = decode_answer_spans(*tensors, max_answer_length=4, n_best_size=3)
        for outputs in (module.decode(*tensors), reloaded.decode(*tensors)):
            for key, value in eager.items():
                np.testing.assert_array_equal(outputs[key].numpy(), value.numpy())


def test_span_candidates_rejects_a_window_that_does_not_fit():
    with pytest.raises(ValueError, match="window 0 does not fit in 4 positions"):
        span_candidates([(0, 4)], context_offset=1, sequence_length=4)


def test_answer_char_span_cuts_from_the_original_context():
    context = "The  Eiffel-Tower stands."  # two spaces: detokenizing would lose them
    # [CLS] where [SEP] the eiffel - tower stands . [SEP]
    token_starts = [-1, -1, -1, 0, 5, 11, 12, 18, 24, -1]
    token_ends = [-1, -1, -1, 3, 11, 12, 17, 24, 25, -1]
    assert answer_char_span(token_starts, token_ends, 4, 6) == (5, 17)
    assert context[slice(*answer_char_span(token_starts, token_ends, 3, 6))] == "The  Eiffel-Tower"
    assert answer_char_span(np.array(token_starts), np.array(token_ends), 7, 7) == (18, 24)


@pytest.mark.parametrize(
    ("start", "end", "message"), [(2, 4, "not all in the context"), (5, 4, "not a span")]
)
def test_answer_char_span_rejects_bad_spans(start, end, message):
    token_starts, token_ends = [-1, -1, -1, 0, 5, 11], [-1, -1, -1, 3, 11, 12]
    with pytest.raises(ValueError, match=message):
        answer_char_span(token_starts, token_ends, start, end)
