"""Sentences -> word pieces, word by word, with character offsets for raw texts.

A tagger needs to know which pieces belong to which word: the word's label goes
on its first piece, and a prediction is read back from there. An example is
either a list of words (each tokenized on its own) or a raw text (split into
words by the task's rule, `bertkit_tasks.tagging.text_words`, whose byte offsets
become character offsets here).
"""

from __future__ import annotations

import numpy as np


def sentence_word_pieces(
    tokenizer, examples, max_pieces: int | None = None, text_words: str = "bert"
) -> list[tuple]:
    """Per example: (piece ids (flat), pieces per word, character offsets or None).

    Args:
        tokenizer: a `bertkit.model.tokenizer.WordPieceTokenizer`.
        examples: objects with `words` (a list of strings) or `text` (a string; a
            `text` that is not None wins).
        max_pieces: keep at most this many pieces of a word (see
            `WordPieceTokenizer.tokenize_words`).
        text_words: how a text becomes words, "bert" or "characters" (see
            `bertkit_tasks.tagging.text_words`).

    The character offsets are a (2, words) array of starts and ends for a text,
    None for a list of words.

    Example:
        >>> from types import SimpleNamespace
        >>> from bertkit.model.tokenizer import WordPieceTokenizer
        >>> tokenizer = WordPieceTokenizer(
        ...     ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "new", "york", "##er", "."], True)
        >>> (ids, lengths, chars), (_, _, offsets) = sentence_word_pieces(tokenizer, [
        ...     SimpleNamespace(words=["New", "Yorker"]), SimpleNamespace(text="Yorker.")])
        >>> ids.tolist(), lengths.tolist(), chars
        ([4, 5, 6], [1, 2], None)
        >>> offsets.tolist()  # "Yorker" is characters 0-6, "." 6-7
        [[0, 6], [6, 7]]
    """
    import tensorflow as tf

    from bertkit.model.tokenizer import character_offsets, in_chunks, split_rows, split_word_rows
    from bertkit_tasks.tagging.text_words import text_word_pieces

    results = [None] * len(examples)
    texts = [i for i, e in enumerate(examples) if getattr(e, "text", None) is not None]
    worded = [i for i, e in enumerate(examples) if getattr(e, "text", None) is None]
    for chunk in in_chunks(worded):
        words = tf.RaggedTensor.from_row_lengths(
            tf.constant([w for i in chunk for w in examples[i].words], tf.string),
            [len(examples[i].words) for i in chunk],
        )
        pieces = tokenizer.tokenize_words(words, max_pieces=max_pieces)
        for i, (ids, lengths) in zip(chunk, split_word_rows(pieces), strict=True):
            results[i] = (ids, lengths, None)
    for chunk in in_chunks(texts):
        pieces, byte_starts, byte_ends = text_word_pieces(
            tokenizer, tf.constant([examples[i].text for i in chunk]), text_words, max_pieces
        )
        for i, (ids, lengths), starts, ends in zip(
            chunk,
            split_word_rows(pieces),
            split_rows(byte_starts),
            split_rows(byte_ends),
            strict=True,
        ):
            results[i] = (ids, lengths, np.stack(character_offsets(examples[i].text, starts, ends)))
    return results
