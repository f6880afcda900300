"""NLTK's word tokenizer (`nltk.word_tokenize`), the part the CMRC 2018 metric reaches.

The official CMRC 2018 script splits every run of non-Chinese text with
`nltk.word_tokenize`; bertkit does not depend on NLTK, so the regular expressions of
`nltk.tokenize.destructive.NLTKWordTokenizer` (NLTK 3.10, itself the Penn Treebank
tokenizer with NLTK's improvements) are ported here, in NLTK's order. NLTK is
Copyright (C) 2001-2026 NLTK Project and licensed under the Apache License, Version 2.0
(https://www.apache.org/licenses/LICENSE-2.0); this module is a derived work under that
licence.

Left out, as the metric never reaches them: sentence splitting first (Punkt; the text
is tokenized as one line, `word_tokenize(text, preserve_line=True)`, since the script's
runs are short answer fragments) and `convert_parentheses`.
"""

from __future__ import annotations

import re

# (pattern, replacement) pairs, applied in this order (NLTKWordTokenizer.tokenize).
_STARTING_QUOTES = (
    (re.compile("([«“‘„]|[`]+)"), r" \1 "),
    (re.compile(r"^\""), r"``"),
    (re.compile(r"(``)"), r" \1 "),
    (re.compile(r"([ \(\[{<])(\"|\'{2})"), r"\1 `` "),
    (re.compile(r"(?i)(?<!\w)(\')(?!(?:re|ve|ll|m|t|s|d|n)\b)(?=\w)"), r"\1 "),
)
_PUNCTUATION = (
    (re.compile(r'([^\.])(\.)([\]\)}>"\'' "»”’ " r"]*+)\s*$"), r"\1 \2 \3 "),
    (re.compile(r"([:,])([^\d])"), r" \1 \2"),
    (re.compile(r"([:,])$"), r" \1 "),
    (re.compile(r"\.{2,}"), r" \g<0> "),
    (re.compile(r"[;@#$%&]"), r" \g<0> "),
    (re.compile(r"[\u2012-\u2015]"), r" \g<0> "),
    (re.compile(r'([^\.])(\.)([\]\)}>"\']*)\s*$'), r"\1 \2\3 "),
    (re.compile(r"[?!]"), r" \g<0> "),
    (re.compile(r"([^'])' "), r"\1 ' "),
    (re.compile(r"[*]"), r" \g<0> "),
)
_PARENS_BRACKETS = (re.compile(r"[\]\[\(\)\{\}\<\>]"), r" \g<0> ")
_DOUBLE_DASHES = (re.compile(r"--"), r" -- ")
_ENDING_QUOTES = (
    (re.compile("([»”’])"), r" \1 "),
    (re.compile(r"''"), " '' "),
    (re.compile(r'"'), " '' "),
    (re.compile(r"\s+"), " "),
    (re.compile(r"([^' ])('[sS]|'[mM]|'[dD]|') "), r"\1 \2 "),
    (re.compile(r"([^' ])('ll|'LL|'re|'RE|'ve|'VE|n't|N'T) "), r"\1 \2 "),
)
# Robert MacIntyre's contractions, as NLTK lists them (CONTRACTIONS4 is unused there too).
_CONTRACTIONS = tuple(
    re.compile(pattern)
    for pattern in (
        r"(?i)\b(can)(?#X)(not)\b",
        r"(?i)\b(d)(?#X)('ye)\b",
        r"(?i)\b(gim)(?#X)(me)\b",
        r"(?i)\b(gon)(?#X)(na)\b",
        r"(?i)\b(got)(?#X)(ta)\b",
        r"(?i)\b(lem)(?#X)(me)\b",
        r"(?i)\b(more)(?#X)('n)\b",
        r"(?i)\b(wan)(?#X)(na)(?=\s)",
        r"(?i) ('t)(?#X)(is)\b",
        r"(?i) ('t)(?#X)(was)\b",
    )
)


def word_tokenize(text: str) -> list[str]:
    """`nltk.word_tokenize(text, preserve_line=True)`: Penn Treebank words of one line.

    Example:
        >>> word_tokenize("Good muffins cost $3.88 (roughly 3,36 euros) in New York.")
        ['Good', 'muffins', 'cost', '$', '3.88', '(', 'roughly', '3,36', 'euros', ')', \
'in', 'New', 'York', '.']
        >>> word_tokenize("They'll say \\"cannot\\"...")
        ['They', "'ll", 'say', '``', 'can', 'not', "''", '...']
    """
    for pattern, replacement in _STARTING_QUOTES + _PUNCTUATION:
        text = pattern.sub(replacement, text)
    for pattern, replacement in (_PARENS_BRACKETS, _DOUBLE_DASHES):
        text = pattern.sub(replacement, text)
    text = f" {text} "
    for pattern, replacement in _ENDING_QUOTES:
        text = pattern.sub(replacement, text)
    for pattern in _CONTRACTIONS:
        text = pattern.sub(r" \1 \2 ", text)
    return text.split()
