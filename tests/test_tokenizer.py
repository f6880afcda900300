"""Tokenizer: WordPiece with lowercasing/accent stripping, pair packing, byte offsets."""

import numpy as np
import pytest
import tensorflow as tf

from bertkit.errors import UserError
from bertkit.tokenizer import WordPieceTokenizer

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "cafe", "the", "film", "good", "##s",
         "a", "b", "c", "d", "e", "f", ".", "Film"]


def longest_first(a, b, budget):
    """Hugging Face's `longest_first` truncation, one token at a time (reference)."""
    a, b = list(a), list(b)
    while len(a) + len(b) > budget:
        if len(a) > len(b):
            a.pop()
        else:
            b.pop()
    return a, b


def test_lowercase_and_accent_stripping():
    tokenizer = WordPieceTokenizer(VOCAB, lowercase=True)
    ids = tokenizer.tokenize(tf.constant(["Café FILMS."])).to_list()[0]
    assert [VOCAB[i] for i in ids] == ["cafe", "film", "##s", "."]
    cased = WordPieceTokenizer(VOCAB, lowercase=False)
    assert [VOCAB[i] for i in cased.tokenize(tf.constant(["Film film"])).to_list()[0]] == [
        "Film", "film"]


@pytest.mark.parametrize("length_a, length_b", [(3, 2), (9, 2), (2, 9), (7, 7), (8, 7), (6, 30)])
def test_pairs_are_truncated_longest_first(length_a, length_b):
    tokenizer = WordPieceTokenizer(VOCAB, lowercase=True)
    text_a, text_b = " ".join(["a"] * length_a), " ".join(["b"] * length_b)
    token_ids, segment_ids = tokenizer.encode([text_a], [text_b], sequence_length=12)
    kept_a, kept_b = longest_first([10] * length_a, [11] * length_b, 12 - 3)
    assert token_ids[0].tolist() == [2, *kept_a, 3, *kept_b, 3]
    assert segment_ids[0].tolist() == [0] * (len(kept_a) + 2) + [1] * (len(kept_b) + 1)


def test_offsets_are_bytes_of_the_original_text():
    tokenizer = WordPieceTokenizer(VOCAB, lowercase=True)
    ids, starts, ends = tokenizer.tokenize_with_offsets(tf.constant(["Le café films"]))
    text = "Le café films".encode()
    pieces = [text[s:e].decode() for s, e in zip(starts.to_list()[0], ends.to_list()[0])]
    assert pieces == ["Le", "café", "film", "s"]
    assert [VOCAB[i] for i in ids.to_list()[0]] == ["[UNK]", "cafe", "film", "##s"]


def test_save_and_load(tmp_path):
    tokenizer = WordPieceTokenizer(VOCAB, lowercase=True)
    tokenizer.save(tmp_path)
    again = WordPieceTokenizer.load(tmp_path)
    assert again.vocabulary == VOCAB and again.lowercase
    np.testing.assert_array_equal(again.encode(["good films"], sequence_length=8)[0][0],
                                  [2, 8, 7, 9, 3])


def test_vocabulary_errors():
    with pytest.raises(UserError, match="lacks the special tokens \\[CLS\\]"):
        WordPieceTokenizer(["[PAD]", "[UNK]", "[SEP]", "x"], lowercase=True)
    with pytest.raises(UserError, match="repeats tokens: x"):
        WordPieceTokenizer(VOCAB[:5] + ["x", "x"], lowercase=True)
