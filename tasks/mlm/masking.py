"""Dynamic masked-LM masking of one batch, as in BERT pretraining, and scoring (NumPy only).

`mask_tokens` is called for every training batch, so each epoch sees new masks
(RoBERTa's "dynamic masking"; Google BERT fixed them once per copy of the data).
Runs without TensorFlow, so it serves any Keras backend. The output keys are
keras-hub's (`MaskedLMMaskGenerator`, `BertMaskedLM`): `token_ids`,
`mask_positions`, `mask_ids`, `mask_weights`.

`masked_lm_scores` and `top_predictions` turn a batch's prediction-slot logits
`(batch, slots, vocabulary)` into what is worth keeping: per-row sums for
perplexity and accuracy, or the few most probable tokens.
"""

from __future__ import annotations

import math

import numpy as np


def default_max_predictions(sequence_length: int, mask_rate: float = 0.15) -> int:
    """The default number of prediction slots per row: `sequence_length * mask_rate`, rounded up.

    Example:
        >>> default_max_predictions(128), default_max_predictions(512), default_max_predictions(4)
        (20, 77, 1)
    """
    # The small epsilon keeps float noise (100 * 0.15 = 15.000000000000002) from adding a slot.
    return max(1, math.ceil(sequence_length * mask_rate - 1e-9))


def is_continuation_piece(vocabulary) -> np.ndarray:
    """Which WordPiece vocabulary entries continue a word (start with "##").

    Args:
        vocabulary: the tokens, in id order (e.g. the lines of `vocab.txt`).

    Returns:
        A bool array `(vocabulary_size,)`, for `word_start_mask`.

    Example:
        >>> is_continuation_piece(["[CLS]", "play", "##ing", "##s"]).tolist()
        [False, False, True, True]
    """
    return np.array([token.startswith("##") for token in vocabulary], dtype=bool)


def word_start_mask(token_ids, continuation_pieces: np.ndarray) -> np.ndarray:
    """Marks the first piece of every word, for whole-word masking.

    Args:
        token_ids: int array of any shape.
        continuation_pieces: `is_continuation_piece(vocabulary)`.

    Returns:
        A bool array shaped like `token_ids`: True where a word starts.

    Example:
        >>> continuation = is_continuation_piece(["[CLS]", "play", "##ing", "now"])
        >>> word_start_mask(np.array([[0, 1, 2, 3]]), continuation).tolist()
        [[True, True, False, True]]
    """
    return ~continuation_pieces[np.asarray(token_ids)]


def mask_tokens(
    token_ids,
    special_mask,
    mask_token_id: int,
    vocabulary_size: int,
    rng: np.random.Generator,
    *,
    mask_rate: float = 0.15,
    mask_token_rate: float = 0.8,
    random_token_rate: float = 0.1,
    word_starts=None,
    max_predictions: int | None = None,
) -> dict[str, np.ndarray]:
    """Chooses and corrupts the tokens a masked LM learns to predict, as BERT does.

    Per row, `max(1, round(n * mask_rate))` of the `n` maskable tokens are
    chosen uniformly at random (Python's round: half to even), at most
    `max_predictions`; a row with no maskable token gets none. Each chosen
    token independently becomes `mask_token_id` (`mask_token_rate`), a random
    id drawn uniformly from the whole vocabulary, special tokens included
    (`random_token_rate`), or stays as it is (the rest). As in BERT, a random
    id may equal the original or be `mask_token_id`.

    Whole-word masking (`word_starts` given) follows Google BERT's
    `create_pretraining_data.py`: words are visited in random order and a word
    is taken whole when it fits in what is left of the row's budget (counted in
    pieces), else skipped; so a word is never split. The 80/10/10 decision is
    still made per piece, independently, as BERT does.

    Args:
        token_ids: int array `(batch, seq)`.
        special_mask: bool array `(batch, seq)`, True where a token must never be
            chosen: `[CLS]`, `[SEP]`, padding.
        mask_token_id: the id of `[MASK]`.
        vocabulary_size: random ids are drawn from `[0, vocabulary_size)`.
        rng: the random generator; it advances, so every call masks differently.
        mask_rate: the share of maskable tokens chosen.
        mask_token_rate: the share of chosen tokens replaced by `[MASK]`.
        random_token_rate: the share of chosen tokens replaced by a random id.
        word_starts: optional bool array `(batch, seq)`, True at the first piece
            of each word (`word_start_mask`); a piece right after a special
            token also starts a word.
        max_predictions: prediction slots per row, `P`; default
            `default_max_predictions(seq, mask_rate)`.

    Returns:
        A dict of NumPy arrays: `token_ids` (a corrupted copy, input dtype),
        `mask_positions` `(batch, P)` int32, positions ascending, `mask_ids`
        `(batch, P)` the original ids there, and `mask_weights` `(batch, P)`
        float32, 1 for a used slot; unused slots hold position 0, id 0, weight 0.

    Example:
        >>> token_ids = np.array([[101, 7, 8, 9, 102, 0]], dtype=np.int32)
        >>> special = np.array([[True, False, False, False, True, True]])
        >>> out = mask_tokens(token_ids, special, mask_token_id=103, vocabulary_size=200,
        ...                   rng=np.random.default_rng(0), mask_token_rate=1.0,
        ...                   random_token_rate=0.0)
        >>> out["mask_weights"].tolist(), int((out["token_ids"] == 103).sum())
        ([[1.0]], 1)
        >>> int(out["mask_positions"][0, 0]) in (1, 2, 3), int(out["mask_ids"][0, 0]) in (7, 8, 9)
        (True, True)
    """
    token_ids, maskable = np.asarray(token_ids), ~np.asarray(special_mask, dtype=bool)
    starts = maskable if word_starts is None else np.asarray(word_starts, dtype=bool)
    _check_arguments(token_ids, maskable, starts, mask_rate, mask_token_rate, random_token_rate)
    if max_predictions is not None and max_predictions < 1:
        raise ValueError(f"max_predictions must be at least 1, got {max_predictions}")

    # Which positions: BERT's count per row, whole words when word starts are given.
    num_slots = max_predictions or default_max_predictions(token_ids.shape[1], mask_rate)
    num_maskable = maskable.sum(axis=1)  # (batch,)
    budgets = np.minimum(num_slots, np.maximum(1, np.round(num_maskable * mask_rate)))
    budgets = np.where(num_maskable > 0, budgets, 0).astype(np.int64)
    chosen = _choose_whole_words(maskable, starts, budgets, rng)  # (batch, seq)
    positions, used = _packed_positions(chosen, num_slots)  # (batch, P) each
    mask_ids = np.where(used, np.take_along_axis(token_ids, positions, axis=1), 0)

    # The 80/10/10 decision, one draw per slot.
    draws = rng.random(used.shape)
    random_ids = rng.integers(0, vocabulary_size, size=used.shape)
    replacements = np.where(draws < mask_token_rate, mask_token_id, mask_ids)
    is_random = (draws >= mask_token_rate) & (draws < mask_token_rate + random_token_rate)
    replacements = np.where(is_random, random_ids, replacements)

    # The corrupted copy: only used slots write, so the padding slots' position 0 stays intact.
    masked = token_ids.copy()
    rows = np.broadcast_to(np.arange(len(token_ids))[:, None], used.shape)
    masked[rows[used], positions[used]] = replacements[used]
    return {
        "token_ids": masked,
        "mask_positions": positions.astype(np.int32),
        "mask_ids": mask_ids.astype(token_ids.dtype),
        "mask_weights": used.astype(np.float32),
    }


def _check_arguments(token_ids, maskable, starts, mask_rate, mask_token_rate, random_token_rate):
    if token_ids.ndim != 2:
        raise ValueError(f"token_ids must be (batch, seq), got shape {token_ids.shape}")
    for name, array in (("special_mask", maskable), ("word_starts", starts)):
        if array.shape != token_ids.shape:
            raise ValueError(f"{name} has shape {array.shape}, token_ids {token_ids.shape}")
    if not 0 <= mask_rate <= 1 or min(mask_token_rate, random_token_rate) < 0:
        raise ValueError("mask rates must lie in [0, 1]")
    if mask_token_rate + random_token_rate > 1 + 1e-9:
        raise ValueError("mask_token_rate + random_token_rate must be at most 1")


def _choose_whole_words(maskable, starts, budgets, rng) -> np.ndarray:
    """Which positions to predict: whole words, at most `budgets[row]` pieces per row.

    Without whole-word masking every maskable token is its own one-piece word.
    """
    batch, seq = maskable.shape
    # A word starts at a marked piece or at the first maskable piece after a special one.
    after_special = np.pad(~maskable[:, :-1], ((0, 0), (1, 0)), constant_values=True)
    word_of = np.cumsum(maskable & (starts | after_special), axis=1) - 1  # (batch, seq)
    word_of = np.maximum(word_of, 0)  # -1 only before the first word, on special positions
    row_offsets = np.arange(batch)[:, None] * seq
    lengths = np.bincount((word_of + row_offsets)[maskable], minlength=batch * seq)
    lengths = lengths.reshape(batch, seq)  # (batch, word): pieces per word, 0 past the last

    # Visit each row's words in random order; words of length 0 go last.
    order = np.argsort(np.where(lengths > 0, rng.random((batch, seq)), 2.0), axis=1)
    taken_in_order = _fill_budgets(np.take_along_axis(lengths, order, axis=1), budgets)
    taken = np.zeros((batch, seq), dtype=bool)
    np.put_along_axis(taken, order, taken_in_order, axis=1)
    return maskable & np.take_along_axis(taken, word_of, axis=1)


def _fill_budgets(ordered_lengths, budgets) -> np.ndarray:
    """BERT's greedy rule: take each word in turn unless it would overflow the row's budget.

    Loops over word ranks, vectorized over rows; stops once no row has room
    and words left (for one-piece words: after `max(budgets)` ranks).
    """
    taken = np.zeros(ordered_lengths.shape, dtype=bool)
    remaining = budgets.copy()  # (batch,)
    for rank in range(ordered_lengths.shape[1]):
        lengths = ordered_lengths[:, rank]
        if not np.any((remaining > 0) & (lengths > 0)):
            break
        fits = (lengths > 0) & (lengths <= remaining)
        taken[:, rank] = fits
        remaining -= np.where(fits, lengths, 0)
    return taken


def _packed_positions(chosen, num_slots: int):
    """The chosen positions of each row, ascending, in `num_slots` slots; and which are used."""
    batch, seq = chosen.shape
    ascending = np.argsort(~chosen, axis=1, kind="stable")[:, :num_slots]  # chosen ones first
    positions = np.zeros((batch, num_slots), dtype=np.int64)
    positions[:, : ascending.shape[1]] = ascending
    used = np.arange(num_slots) < chosen.sum(axis=1, keepdims=True)
    return np.where(used, positions, 0), used


# ---- scoring the masked-LM head's logits
def masked_lm_scores(logits, target_ids) -> dict[str, np.ndarray]:
    """Per-row masked-LM sums, so that a corpus's mean loss and accuracy add up over rows.

    Args:
        logits: float array `(batch, P, vocabulary)` over the prediction slots.
        target_ids: int array `(batch, P)`, the original ids; -1 marks an unused slot.

    Returns:
        A dict of `(batch,)` arrays: `masked_tokens` (used slots), `correct` (used
        slots whose highest logit, first on ties, is the target) and `loss` (the
        targets' summed negative log-probability, float64).

    Example:
        >>> logits = np.log([[[0.5, 0.25, 0.25], [0.2, 0.2, 0.6]]])
        >>> scores = masked_lm_scores(logits, np.array([[0, -1]]))
        >>> {name: np.round(value, 4).tolist() for name, value in scores.items()}
        {'masked_tokens': [1], 'correct': [1], 'loss': [0.6931]}
    """
    logits, target_ids = np.asarray(logits, np.float32), np.asarray(target_ids)
    used = target_ids >= 0
    targets = np.where(used, target_ids, 0)  # (batch, P); unused slots read id 0, then drop
    target_logits = np.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    losses = np.where(used, _logsumexp(logits) - target_logits, 0.0)
    return {
        "masked_tokens": used.sum(axis=-1),
        "correct": (used & (logits.argmax(axis=-1) == targets)).sum(axis=-1),
        "loss": losses.sum(axis=-1, dtype=np.float64),
    }


def top_predictions(logits, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The `k` most probable ids over the last axis and their softmax probabilities.

    Best first; equal logits go to the lower id, as with `tf.math.top_k`.

    Args:
        logits: float array `(..., vocabulary)`.
        k: predictions to keep (all of them when the vocabulary is smaller).

    Returns:
        ids `(..., k)` and float64 probabilities `(..., k)`.

    Example:
        >>> ids, probabilities = top_predictions(np.log([[0.1, 0.3, 0.3, 0.3]]), 2)
        >>> ids.tolist(), np.round(probabilities, 2).tolist()
        ([[1, 2]], [[0.3, 0.3]])
    """
    logits = np.asarray(logits, np.float32)
    ids = np.argsort(-logits, axis=-1, kind="stable")[..., :k]
    chosen = np.take_along_axis(logits, ids, axis=-1)
    return ids, np.exp((chosen - _logsumexp(logits)[..., None]).astype(np.float64))


def _logsumexp(logits: np.ndarray) -> np.ndarray:
    """`log(sum(exp(logits)))` over the last axis, shifted by the maximum so exp cannot overflow."""
    peak = logits.max(axis=-1, keepdims=True)
    return np.log(np.exp(logits - peak).sum(axis=-1)) + peak[..., 0]
