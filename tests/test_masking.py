"""Dynamic MLM masking: which tokens are chosen, how they are corrupted, and the output layout.

Rates are checked on large seeded batches against bounds of 5 binomial standard deviations.
"""

import math

import numpy as np
import pytest

from bertkit_tasks.mlm.masking import (
    default_max_predictions,
    is_continuation_piece,
    mask_tokens,
    masked_lm_scores,
    top_predictions,
    word_start_mask,
)

CLS, SEP, PAD, MASK, VOCABULARY_SIZE = 1, 2, 0, 3, 1000


def within_5_sigma(count, trials, probability):
    return abs(count - trials * probability) <= 5 * math.sqrt(
        trials * probability * (1 - probability)
    )


def packed_batch(rng, batch, seq, fixed_length=None):
    """`[CLS] A [SEP] B [SEP] [PAD]...` rows of random ids in [10, VOCABULARY_SIZE)."""
    token_ids = rng.integers(10, VOCABULARY_SIZE, size=(batch, seq)).astype(np.int32)
    lengths = np.full(batch, seq) if fixed_length else rng.integers(4, seq + 1, size=batch)
    for row, length in enumerate(lengths):
        token_ids[row, [0, length // 2, length - 1]] = CLS, SEP, SEP
        token_ids[row, length:] = PAD
    return token_ids, np.isin(token_ids, [CLS, SEP, PAD])


def chosen_mask(out, shape):
    """Bool `(batch, seq)`: True at the positions of used prediction slots."""
    chosen = np.zeros(shape, dtype=bool)
    rows, slots = np.nonzero(out["mask_weights"])
    chosen[rows, out["mask_positions"][rows, slots]] = True
    return chosen


def test_chooses_bert_share_of_maskable_tokens_never_special_ones():
    rng = np.random.default_rng(0)
    token_ids, special = packed_batch(rng, 2000, 64)
    out = mask_tokens(token_ids, special, MASK, VOCABULARY_SIZE, rng)
    chosen = chosen_mask(out, token_ids.shape)
    num_maskable = (~special).sum(axis=1)
    # Per row, exactly BERT's count: max(1, round(n * 0.15)), capped by the 10 slots.
    expected = np.minimum(10, np.maximum(1, np.round(num_maskable * 0.15)))
    np.testing.assert_array_equal(chosen.sum(axis=1), expected)
    assert abs(chosen.sum() / num_maskable.sum() - 0.15) < 0.01
    assert not (chosen & special).any()
    np.testing.assert_array_equal(out["token_ids"][special], token_ids[special])


def test_every_maskable_position_is_equally_likely():
    rng = np.random.default_rng(1)
    token_ids, special = packed_batch(rng, 4000, 48, fixed_length=True)
    chosen = chosen_mask(mask_tokens(token_ids, special, MASK, VOCABULARY_SIZE, rng), special.shape)
    probability = round(45 * 0.15) / 45  # 45 maskable tokens per row, 7 chosen
    for position in np.nonzero(~special[0])[0]:
        assert within_5_sigma(chosen[:, position].sum(), 4000, probability), position


def test_chosen_tokens_become_mask_random_or_stay_80_10_10():
    rng = np.random.default_rng(2)
    token_ids, special = packed_batch(rng, 4000, 128)
    out = mask_tokens(token_ids, special, MASK, VOCABULARY_SIZE, rng)
    used = out["mask_weights"] == 1
    new = np.take_along_axis(out["token_ids"], out["mask_positions"], axis=1)[used]
    original = out["mask_ids"][used]
    trials = len(new)
    # A random id is uniform over the vocabulary, so it is [MASK] or the original 1/V of the time.
    share = 0.1 / VOCABULARY_SIZE
    assert within_5_sigma((new == MASK).sum(), trials, 0.8 + share)
    assert within_5_sigma((new == original).sum(), trials, 0.1 + share)
    is_random = (new != MASK) & (new != original)
    assert within_5_sigma(is_random.sum(), trials, 0.1 - 2 * share)
    randoms = new[is_random]
    assert randoms.min() >= 0 and randoms.max() < VOCABULARY_SIZE
    sigma_of_mean = VOCABULARY_SIZE / math.sqrt(12 * len(randoms))
    assert abs(randoms.mean() - (VOCABULARY_SIZE - 1) / 2) <= 5 * sigma_of_mean


def test_output_layout():
    rng = np.random.default_rng(3)
    token_ids, special = packed_batch(rng, 300, 40)
    out = mask_tokens(token_ids, special, MASK, VOCABULARY_SIZE, rng)
    assert {key: (value.shape, value.dtype.name) for key, value in out.items()} == {
        "token_ids": ((300, 40), "int32"),
        "mask_positions": ((300, 6), "int32"),
        "mask_ids": ((300, 6), "int32"),
        "mask_weights": ((300, 6), "float32"),
    }
    used, positions = out["mask_weights"] == 1, out["mask_positions"]
    np.testing.assert_array_equal(
        out["mask_ids"], np.where(used, token_ids[np.arange(300)[:, None], positions], 0)
    )
    assert (positions[~used] == 0).all() and (out["mask_ids"][~used] == 0).all()
    for row in range(300):  # used slots come first, positions ascending
        count = int(used[row].sum())
        assert used[row, :count].all() and (np.diff(positions[row, :count]) > 0).all()
    unchosen = ~chosen_mask(out, token_ids.shape)
    np.testing.assert_array_equal(out["token_ids"][unchosen], token_ids[unchosen])


def test_every_batch_is_masked_anew_and_seeds_reproduce():
    token_ids, special = packed_batch(np.random.default_rng(4), 8, 64)
    rng = np.random.default_rng(5)
    first = mask_tokens(token_ids, special, MASK, VOCABULARY_SIZE, rng)
    second = mask_tokens(token_ids, special, MASK, VOCABULARY_SIZE, rng)
    assert not np.array_equal(first["mask_positions"], second["mask_positions"])
    again = mask_tokens(token_ids, special, MASK, VOCABULARY_SIZE, np.random.default_rng(5))
    for key in first:
        np.testing.assert_array_equal(first[key], again[key])


def test_max_predictions_caps_and_all_special_rows_get_none():
    token_ids, special = packed_batch(np.random.default_rng(6), 4, 100, fixed_length=True)
    special[3] = True
    out = mask_tokens(
        token_ids, special, MASK, VOCABULARY_SIZE, np.random.default_rng(7), max_predictions=5
    )
    assert out["mask_weights"].sum(axis=1).tolist() == [5, 5, 5, 0]
    np.testing.assert_array_equal(out["token_ids"][3], token_ids[3])


def words_of_row(maskable, starts):
    """The words of one row as lists of positions (a piece after a special one starts a word)."""
    words = []
    for position in np.nonzero(maskable)[0]:
        if starts[position] or not words or words[-1][-1] != position - 1:
            words.append([])
        words[-1].append(position)
    return words


def test_whole_word_masking_never_splits_a_word_and_fills_the_budget():
    rng = np.random.default_rng(8)
    token_ids, special = packed_batch(rng, 500, 64)
    word_starts = rng.random(token_ids.shape) < 0.6  # words of about 1.7 pieces
    out = mask_tokens(token_ids, special, MASK, VOCABULARY_SIZE, rng, word_starts=word_starts)
    chosen = chosen_mask(out, token_ids.shape)
    budgets = np.minimum(10, np.maximum(1, np.round((~special).sum(axis=1) * 0.15)))
    assert (chosen.sum(axis=1) <= budgets).all()
    assert chosen.sum() >= 0.97 * budgets.sum()  # words that overflow are skipped, not the rest
    mixed = multi_piece = 0
    for row in range(500):
        for word in words_of_row(~special[row], word_starts[row]):
            assert chosen[row, word].all() or not chosen[row, word].any()
            if len(word) > 1 and chosen[row, word[0]]:
                multi_piece += 1
                mixed += len(set((out["token_ids"][row, word] == MASK).tolist())) > 1
    # The 80/10/10 decision is per piece, as in BERT: some chosen words are partly [MASK].
    assert multi_piece > 100 and mixed / multi_piece > 0.2


def test_word_starts_from_the_vocabulary():
    vocabulary = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "un", "##afford", "##able", "deal"]
    continuation = is_continuation_piece(vocabulary)
    starts = word_start_mask(np.array([[1, 4, 5, 6, 7, 2]]), continuation)
    assert starts.tolist() == [[True, True, False, False, True, True]]


def test_default_max_predictions_rounds_up():
    assert [default_max_predictions(n) for n in (1, 20, 100, 128, 512)] == [1, 3, 15, 20, 77]


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"token_ids": np.zeros(5, np.int32)}, "must be \\(batch, seq\\)"),
        ({"special_mask": np.zeros((2, 4), bool)}, "special_mask has shape"),
        ({"word_starts": np.zeros((2, 4), bool)}, "word_starts has shape"),
        ({"mask_rate": 1.5}, "mask rates must lie in"),
        ({"mask_token_rate": 0.95}, "must be at most 1"),
        ({"max_predictions": 0}, "at least 1"),
    ],
)
def test_bad_arguments_are_rejected(arguments, message):
    defaults = {"token_ids": np.zeros((2, 5), np.int32), "special_mask": np.zeros((2, 5), bool)}
    with pytest.raises(ValueError, match=message):
        mask_tokens(
            mask_token_id=MASK,
            vocabulary_size=VOCABULARY_SIZE,
            rng=np.random.default_rng(0),
            **{**defaults, **arguments},
        )


def test_masked_lm_scores_sum_the_used_slots_of_each_row():
    rng = np.random.default_rng(8)
    logits = (rng.normal(size=(3, 4, 50)) * 5).astype(np.float16)  # as under mixed precision
    targets = rng.integers(0, 50, size=(3, 4))
    targets[0, 2:], targets[2] = -1, -1  # row 2 has no masked token
    logits[1, 0, targets[1, 0]] = 100  # surely right
    scores = masked_lm_scores(logits, targets)
    reference = np.asarray(logits, np.float64)
    log_probabilities = reference - np.log(np.exp(reference).sum(-1, keepdims=True))
    used = targets >= 0
    expected = [
        -sum(log_probabilities[r, s, targets[r, s]] for s in range(4) if used[r, s])
        for r in range(3)
    ]
    np.testing.assert_allclose(scores["loss"], expected, rtol=1e-5)
    np.testing.assert_array_equal(scores["masked_tokens"], [2, 4, 0])
    np.testing.assert_array_equal(
        scores["correct"], ((reference.argmax(-1) == targets) & used).sum(-1)
    )
    assert scores["correct"][1] >= 1


def test_top_predictions_are_the_best_softmax_entries_lower_id_first_on_ties():
    logits = np.array([[[1.0, 3.0, 3.0, 2.0, 0.0]], [[0.0, 0.0, 0.0, 0.0, 0.0]]])  # (2, 1, 5)
    ids, probabilities = top_predictions(logits, 3)
    assert ids.tolist() == [[[1, 2, 3]], [[0, 1, 2]]] and probabilities.shape == (2, 1, 3)
    softmax = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(probabilities, np.take_along_axis(softmax, ids, -1), rtol=1e-6)
    assert top_predictions(logits, 9)[0].shape == (2, 1, 5)
