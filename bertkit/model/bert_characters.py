"""BERT's normalization of one character (Hugging Face's `BertNormalizer`), in plain Python:
the table `bertkit.model.bert_normalizer` applies in TensorFlow, and what the TensorFlow-free
tokenizer of an ONNX folder (`bertkit.serving.onnx_tokenizer`) needs of it.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

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
PRIVATE_USE_BMP = (0xE000, 0xF8FF)
PRIVATE_USE_PLANES = 0xF0000  # planes 15 and 16, but their last 2 (non-)characters


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
