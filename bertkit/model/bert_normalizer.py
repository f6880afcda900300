"""BERT's text normalization in TensorFlow ops, keeping each character's bytes in the original.

A pretrained checkpoint expects the normalization it was trained with: Hugging
Face's `BertNormalizer` (Google's `BasicTokenizer`). It drops control and
format characters, turns whitespace into spaces and, for uncased checkpoints,
decomposes each character (NFD), drops its combining marks (category Mn) and
lowercases it, one character at a time. That is a per-code-point mapping, so it
is a table (`normalization_table`, built once with `unicodedata`) applied with
a hash table and gathers (`BertNormalizer`). tf-text's own lowercasing
(`lower_case_nfd_strip_accents`) is NFKC casefolding instead: it rewrites
'ﬁ', '½', '²', '™', full-width and mathematical letters, which BERT keeps.

Every normalized character remembers the bytes of the character it came from
(`Alignment`), so that offsets into the normalized text map back to the
original text (`Alignment.source_offsets`): a piece starts where its first
character's source starts and ends where its last one's ends.

With `equivalents` (`backbone.normalize_punctuation`, built from the vocabulary by
`bertkit.model.vocabulary_checks.punctuation_equivalents`), characters the vocabulary
lacks are then replaced by their equivalents ('“' -> '"', '…' -> '...'): the same
per-character table, composed (`with_equivalents`), so offsets stay those of the original.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from bertkit.model.bert_characters import (  # noqa: F401 (normalize_character: public here too)
    PRIVATE_USE_BMP,
    PRIVATE_USE_PLANES,
    normalization_table,
    normalize_character,
    with_equivalents,
)


class Alignment(NamedTuple):
    """Where a batch of normalized texts' characters came from.

    The normalized characters of the whole batch are numbered in one sequence,
    and their bytes counted in one sequence, text after text.

    Attributes:
        text_starts: (texts,) int64: the batch-wide byte where each normalized text starts.
        normalized_ends: (normalized chars,) int64: the batch-wide byte where each ends.
        source_starts, source_ends: (normalized chars,) int64: the bytes, in its original
            text, of the character each normalized character came from.
    """

    text_starts: object
    normalized_ends: object
    source_starts: object
    source_ends: object

    def source_offsets(self, starts, ends):
        """Byte offsets into the normalized texts -> byte offsets into the original texts.

        Args:
            starts, ends: (texts, (spans)) int64 ragged, at character boundaries.

        Returns:
            The spans' starts and ends in the original texts, of the same shape.
        """
        base = tf.gather(self.text_starts, starts.value_rowids())  # (spans,)
        ends_sorted = tf.reshape(self.normalized_ends, [1, -1])

        def character_at(byte):  # (spans,) batch-wide byte -> the normalized char holding it
            return tf.searchsorted(ends_sorted, tf.reshape(byte, [1, -1]), side="right")[0]

        first = character_at(starts.values + base)
        last = character_at(ends.values + base - 1)
        return (
            starts.with_values(tf.gather(self.source_starts, first)),
            ends.with_values(tf.gather(self.source_ends, last)),
        )


class BertNormalizer(tf.Module):
    """BERT's normalization (`normalize_character`) of string tensors, in graph-safe ops.

    A `tf.Module`: SavedModel export tracks its hash table.

    Args:
        lowercase: strip accents and lowercase (uncased checkpoints).
        equivalents: normalized character -> its replacement, applied after BERT's
            normalization (`with_equivalents`); None: none.

    Example:
        >>> normalizer = BertNormalizer(lowercase=True)
        >>> [t.decode() for t in normalizer.normalize(tf.constant(["Ångström\\x07 5½"])).numpy()]
        ['angstrom 5½']
        >>> mapped = BertNormalizer(lowercase=True, equivalents={"“": '"', "…": "..."})
        >>> [t.decode() for t in mapped.normalize(tf.constant(["“Oh…”"])).numpy()]
        ['"oh...”']
    """

    def __init__(self, lowercase: bool, equivalents: dict[str, str] | None = None):
        super().__init__(name="bert_normalizer")
        self.lowercase = bool(lowercase)
        self.equivalents = dict(equivalents or {})
        table = with_equivalents(normalization_table(self.lowercase), self.equivalents)
        codes = np.array(sorted(table), np.int32)
        replacements = [table[code] for code in codes.tolist()] + [""]  # last row: dropped
        lengths = np.array([len(r) for r in replacements], np.int32)
        values = [ord(c) for r in replacements for c in r] + [0]  # never empty, for gathers
        with tf.init_scope():  # eager constants, even when first built inside a graph
            self._dropped_row = tf.constant(len(replacements) - 1, tf.int32)
            self._lengths = tf.constant(lengths)
            self._starts = tf.constant(np.cumsum(lengths) - lengths, tf.int32)
            self._values = tf.constant(values, tf.int32)
            self._rows = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(codes, np.arange(len(codes), dtype=np.int32)),
                default_value=-1,
            )

    def normalize(self, texts):
        """(texts,) strings, or a ragged tensor of strings -> the normalized strings."""
        if isinstance(texts, tf.RaggedTensor):
            return texts.with_flat_values(self.normalize(texts.flat_values))
        return self.normalize_with_alignment(texts)[0]

    def normalize_with_alignment(self, texts):
        """(texts,) strings -> the normalized strings (texts,) and their `Alignment`."""
        chars, starts = tf.strings.unicode_decode_with_offsets(
            texts, "UTF-8", errors="replace"
        )  # each (texts, (chars))
        codes = chars.values  # (chars,)
        ends = _character_ends(chars, starts.values, tf.strings.length(texts))
        # Each character's replacement: itself (row -1) or a row of the table.
        rows = self._rows.lookup(codes)  # (chars,)
        private = ((codes >= PRIVATE_USE_BMP[0]) & (codes <= PRIVATE_USE_BMP[1])) | (
            (codes >= PRIVATE_USE_PLANES) & (codes % 0x10000 < 0xFFFE)
        )
        rows = tf.where(private, self._dropped_row, rows)
        counts = tf.where(rows < 0, 1, tf.gather(self._lengths, tf.maximum(rows, 0)))
        source = tf.repeat(tf.range(tf.size(codes)), counts)  # (normalized chars,)
        position = tf.range(tf.size(source)) - tf.gather(tf.cumsum(counts, exclusive=True), source)
        row = tf.gather(rows, source)
        normalized = tf.where(
            row < 0,
            tf.gather(codes, source),
            tf.gather(self._values, tf.gather(self._starts, tf.maximum(row, 0)) + position),
        )
        # Per text: where its normalized characters and their bytes (UTF-8: 1 to 4 per
        # character) start and end, in batch-wide counts.
        char_splits = tf.gather(_with_zero(tf.cumsum(counts)), chars.row_splits)  # (texts + 1,)
        widths = 1 + sum(
            tf.cast(normalized >= limit, tf.int64) for limit in (0x80, 0x800, 0x10000)
        )  # (normalized chars,)
        normalized_ends = tf.cumsum(widths)
        byte_splits = tf.gather(_with_zero(normalized_ends), char_splits)  # (texts + 1,)
        encoded = tf.strings.unicode_encode(
            tf.RaggedTensor.from_row_splits(normalized, char_splits, validate=False), "UTF-8"
        )
        return encoded, Alignment(
            text_starts=byte_splits[:-1],
            normalized_ends=normalized_ends,
            source_starts=tf.gather(starts.values, source),
            source_ends=tf.gather(ends, source),
        )


def _with_zero(cumulative):
    """(n,) cumulative sums -> (n + 1,) with a leading 0: the splits of n segments."""
    return tf.concat([tf.zeros([1], cumulative.dtype), cumulative], axis=0)


def _character_ends(chars, starts, text_bytes):
    """(texts, (chars)) characters, (chars,) their start bytes, (texts,) byte lengths ->
    (chars,) each character's end byte: the next one's start, or its text's end."""
    following = tf.concat([starts[1:], tf.zeros([1], starts.dtype)], axis=0)
    last = chars.row_limits()[chars.row_lengths() > 0] - 1  # (non-empty texts,)
    text_ends = tf.cast(text_bytes, starts.dtype)[chars.row_lengths() > 0]
    return tf.tensor_scatter_nd_update(following, last[:, None], text_ends)
