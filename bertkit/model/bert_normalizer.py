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

import unicodedata
from functools import lru_cache
from typing import NamedTuple

import numpy as np
import tensorflow as tf

# Rust's `char::is_whitespace` (the White_Space property), Hugging Face's definition.
_WHITESPACE = frozenset(
    [
        0x09,
        0x0A,
        0x0B,
        0x0C,
        0x0D,
        0x20,
        0x85,
        0xA0,
        0x1680,
        *range(0x2000, 0x200B),
        0x2028,
        0x2029,
        0x202F,
        0x205F,
        0x3000,
    ]
)
# Control, format, private use and surrogate characters are dropped; unassigned ones are kept.
_DROPPED_CATEGORIES = ("Cc", "Cf", "Co", "Cs")
# Private use code points (Co) are dropped by range, not listed: they are 137,468 of them.
_PRIVATE_USE_BMP = (0xE000, 0xF8FF)
_PRIVATE_USE_PLANES = 0xF0000  # planes 15 and 16, but their last 2 (non-)characters


def normalize_character(char: str, lowercase: bool) -> str:
    """What BERT's normalization makes of one character: 0 to 3 characters.

    As Hugging Face's `BertNormalizer`: control characters (but tab, newline and
    carriage return), NUL and U+FFFD go, whitespace becomes a space; uncased, the
    character's NFD decomposition loses its marks and is lowercased character by
    character (so no final-sigma rule). Compatibility characters stay.

    Example:
        >>> [normalize_character(c, lowercase=True) for c in "Å\\x07\\u00a0ß½ﬁİ"]
        ['a', '', ' ', 'ß', '½', 'ﬁ', 'i']
        >>> [normalize_character(c, lowercase=False) for c in "Å\\u200b\\t"]
        ['Å', '', ' ']
    """
    code = ord(char)
    if char not in "\t\n\r" and (
        code == 0xFFFD or unicodedata.category(char) in _DROPPED_CATEGORIES
    ):
        return ""
    if code in _WHITESPACE:
        return " "
    if not lowercase:
        return char
    decomposed = unicodedata.normalize("NFD", char)
    return "".join(c.lower() for c in decomposed if unicodedata.category(c) != "Mn")


@lru_cache(maxsize=2)
def normalization_table(lowercase: bool) -> dict[int, str]:
    """Every code point that `normalize_character` changes -> its replacement.

    Private use code points are left out (`BertNormalizer` drops them by range).
    About 0.5 s to build, once per process.

    Example:
        >>> table = normalization_table(lowercase=True)
        >>> table[ord("É")], table[ord("\\u200b")], ord("e") in table, ord("½") in table
        ('e', '', False, False)
    """
    table = {}
    for code in range(0x110000):
        char = chr(code)
        category = unicodedata.category(char)
        if category in ("Cn", "Co", "Cs"):
            continue
        unchanged = (
            category not in _DROPPED_CATEGORIES and code not in _WHITESPACE and code != 0xFFFD
        )
        if lowercase:
            unchanged = (
                unchanged
                and category != "Mn"
                and char.lower() == char
                and unicodedata.is_normalized("NFD", char)
            )
        if not unchanged and (replacement := normalize_character(char, lowercase)) != char:
            table[code] = replacement
    return table


def with_equivalents(table: dict[int, str], equivalents: dict[str, str]) -> dict[int, str]:
    """`table` (code point -> its normalization) followed by `equivalents` (normalized
    character -> its replacement), as one table.

    Example:
        >>> table = with_equivalents(normalization_table(lowercase=True), {"ａ": "a", "…": "..."})
        >>> table[ord("Ａ")], table[ord("ａ")], table[ord("…")], table[ord("É")]
        ('a', 'a', '...', 'e')
    """
    if not equivalents:
        return table
    composed = {
        code: "".join(equivalents.get(char, char) for char in replacement)
        for code, replacement in table.items()
    }
    for char, replacement in equivalents.items():
        composed.setdefault(ord(char), replacement)
    return composed


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
        private = ((codes >= _PRIVATE_USE_BMP[0]) & (codes <= _PRIVATE_USE_BMP[1])) | (
            (codes >= _PRIVATE_USE_PLANES) & (codes % 0x10000 < 0xFFFE)
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
