"""Tokenizer: WordPiece with lowercasing/accent stripping, pair packing, byte offsets."""

import random

import numpy as np
import pytest
import tensorflow as tf

import bertkit.model.token_rows
from bertkit.errors import UserError
from bertkit.model.token_rows import split_word_rows, tokenize_in_chunks
from bertkit.model.tokenizer import WordPieceTokenizer, batch_substrings, character_offsets

VOCAB = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "cafe",
    "the",
    "film",
    "good",
    "##s",
    "a",
    "b",
    "c",
    "d",
    "e",
    "f",
    ".",
    "Film",
]


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
        "Film",
        "film",
    ]


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
    pieces = [
        text[s:e].decode() for s, e in zip(starts.to_list()[0], ends.to_list()[0], strict=True)
    ]
    assert pieces == ["Le", "café", "film", "s"]
    assert [VOCAB[i] for i in ids.to_list()[0]] == ["[UNK]", "cafe", "film", "##s"]


def test_save_and_load(tmp_path):
    tokenizer = WordPieceTokenizer(VOCAB, lowercase=True)
    tokenizer.save(tmp_path)
    again = WordPieceTokenizer.load(tmp_path)
    assert again.vocabulary == VOCAB and again.lowercase
    np.testing.assert_array_equal(
        again.encode(["good films"], sequence_length=8)[0][0], [2, 8, 7, 9, 3]
    )


def test_vocabulary_errors():
    with pytest.raises(UserError, match="lacks the special tokens \\[CLS\\]"):
        WordPieceTokenizer(["[PAD]", "[UNK]", "[SEP]", "x"], lowercase=True)
    with pytest.raises(UserError, match="repeats tokens: x"):
        WordPieceTokenizer(VOCAB[:5] + ["x", "x"], lowercase=True)


def test_words_are_basic_tokenization_with_byte_offsets():
    tokenizer = WordPieceTokenizer(VOCAB, lowercase=True)
    text = "Le café's films.\x07 Goodfilms"
    pieces, starts, ends = tokenizer.words_with_offsets(tf.constant([text, ""]))
    encoded = text.encode()
    words = [
        encoded[s:e].decode() for s, e in zip(starts.to_list()[0], ends.to_list()[0], strict=True)
    ]
    assert words == ["Le", "café", "'", "s", "films", ".", "Goodfilms"]  # \x07: no word
    assert [[VOCAB[i] for i in word] for word in pieces.to_list()[0]] == [
        ["[UNK]"],
        ["cafe"],
        ["[UNK]"],
        ["[UNK]"],
        ["film", "##s"],
        ["."],
        ["[UNK]"],
    ]
    assert pieces.to_list()[1] == starts.to_list()[1] == []
    # max_pieces cuts a word's pieces, not its offsets
    clipped, clipped_starts, clipped_ends = tokenizer.words_with_offsets(
        tf.constant(["good films"]), max_pieces=1
    )
    assert clipped.to_list() == [[[8], [7]]] and clipped_ends.to_list() == [[4, 10]]


def test_max_pieces_keeps_every_word():
    tokenizer = WordPieceTokenizer(VOCAB, lowercase=True)
    words = tf.ragged.constant([["films", "\x07", "a"], [], ["\x07"]])
    assert tokenizer.tokenize_words(words).to_list() == [[[7, 9], [], [10]], [], [[]]]
    assert tokenizer.tokenize_words(words, max_pieces=1).to_list() == [[[7], [1], [10]], [], [[1]]]
    assert tokenizer.tokenize_words(words, max_pieces=2).to_list() == [
        [[7, 9], [1], [10]],
        [],
        [[1]],
    ]
    [(ids, lengths), _, _] = split_word_rows(tokenizer.tokenize_words(words, max_pieces=2))
    assert ids.tolist() == [7, 9, 1, 10] and lengths.tolist() == [2, 1, 1]


def test_character_offsets_numpy_and_graph_agree():
    rng = random.Random(0)
    alphabet = ["a", "é", "’", "漢", "😀", " ", "."]
    texts = ["".join(rng.choices(alphabet, k=rng.randint(0, 12))) for _ in range(30)]
    byte_starts, byte_ends, expected = [], [], []
    for text in texts:  # a random span between character boundaries
        start = rng.randint(0, len(text))
        end = rng.randint(start, len(text))
        byte_starts.append(len(text[:start].encode()))
        byte_ends.append(len(text[:end].encode()))
        expected.append((text[start:end], start, end))
        chars = character_offsets(text, np.array([byte_starts[-1]]), np.array([byte_ends[-1]]))
        assert (chars[0].tolist(), chars[1].tolist()) == ([start], [end])
    substrings, starts, ends = batch_substrings(
        tf.constant(texts), tf.constant(byte_starts), tf.constant(byte_ends)
    )
    assert (
        list(
            zip(
                [t.decode() for t in substrings.numpy()],
                starts.numpy().tolist(),
                ends.numpy().tolist(),
                strict=True,
            )
        )
        == expected
    )
    # a byte inside a character maps to that character
    assert character_offsets("aé", np.array([2]), np.array([3]))[0].tolist() == [1]


def test_tokenize_in_chunks_keeps_order(monkeypatch):
    monkeypatch.setattr(bertkit.model.token_rows, "_CHUNK", 2)
    tokenizer = WordPieceTokenizer(VOCAB, lowercase=True)
    texts = ["good", "", "the film", "a b c", "films"]
    rows = tokenize_in_chunks(tokenizer.tokenize, texts)
    assert [ids.tolist() for (ids,) in rows] == [[8], [], [6, 7], [10, 11, 12], [7, 9]]
    assert tokenize_in_chunks(tokenizer.tokenize, []) == []


def test_repeated_calls_run_traced_and_give_the_eager_outputs():
    eager, traced = WordPieceTokenizer(VOCAB, lowercase=True), WordPieceTokenizer(VOCAB, True)
    traced.trace_repeated_calls()
    batches = [["Good films, café!", ""], ["the film"], ["a b. c", "cafés ☃ d e", "Films f"]]

    def outputs(tokenizer, texts):
        texts = tf.constant(texts)
        words = tf.strings.split(texts)
        pieces = tokenizer.tokenize(texts)
        results = [
            pieces,
            *tokenizer.tokenize_with_offsets(texts),
            tokenizer.tokenize_words(words, max_pieces=2),
            *tokenizer.words_with_offsets(texts, max_pieces=1),
            *tokenizer.pack([pieces, tokenizer.tokenize(texts[::-1])], 8),
        ]
        return [r.to_list() for r in results]

    for texts in batches:  # eager, then traced with another batch size, then traced again
        assert outputs(traced, texts) == outputs(eager, texts)
    traced_methods = {name.split("(")[0] for name in traced.traced_calls.traced_names()}
    assert traced_methods == {
        "tokenize",
        "tokenize_with_offsets",
        "tokenize_words",
        "words_with_offsets",
        "pack",
    }
    assert not eager.traced_calls.traced_names()
