"""NLTK's word tokenizer (`nltk.word_tokenize`), the part the CMRC 2018 metric reaches.

The official CMRC 2018 script splits every run of non-Chinese text with
`nltk.word_tokenize`; bertkit does not depend on NLTK, so the regular expressions of
`nltk.tokenize.treebank.TreebankWordTokenizer` with the improvements that
`nltk.tokenize` adds to it are ported here, in NLTK's order. They are NLTK 3.4.5's, the
last NLTK that runs on Python 2, the only Python the script runs on as published; newer
NLTKs also split the dashes U+2012-U+2015 and change the quote and contraction rules a
little (see `benchmarks/cmrc_metric_parity.py`). Python 2's `re` reads digit, space and
word classes as ASCII in a pattern NLTK compiled without `re.U`, hence `re.ASCII` there.

NLTK is Copyright (C) 2001-2019 NLTK Project and licensed under the Apache License,
Version 2.0 (https://www.apache.org/licenses/LICENSE-2.0); this module is a derived work
under that licence.

Left out, as the metric never reaches them: sentence splitting first (Punkt; the text
is tokenized as one line, `word_tokenize(text, preserve_line=True)`, since the script's
runs are short answer fragments) and `convert_parentheses`.
"""

from __future__ import annotations

import re

_A = re.ASCII  # a pattern NLTK compiled without re.U

# (pattern, replacement) pairs, applied in this order (TreebankWordTokenizer.tokenize).
_STARTING_QUOTES = (
    (re.compile("([«“‘„]|[`]+)"), r" \1 "),
    (re.compile(r"^\"", _A), r"``"),
    (re.compile(r"(``)", _A), r" \1 "),
    (re.compile(r"([ \(\[{<])(\"|\'{2})", _A), r"\1 `` "),
    (re.compile(r"(?i)(\')(?!re|ve|ll|m|t|s|d)(\w)\b"), r"\1 \2"),
)
_PUNCTUATION = (
    (re.compile(r'([^\.])(\.)([\]\)}>"\'' "»”’ " r"]*)\s*$"), r"\1 \2 \3 "),
    (re.compile(r"([:,])([^\d])", _A), r" \1 \2"),
    (re.compile(r"([:,])$", _A), r" \1 "),
    (re.compile(r"\.\.\.", _A), r" ... "),
    (re.compile(r"[;@#$%&]", _A), r" \g<0> "),
    (re.compile(r'([^\.])(\.)([\]\)}>"\']*)\s*$', _A), r"\1 \2\3 "),
    (re.compile(r"[?!]", _A), r" \g<0> "),
    (re.compile(r"([^'])' ", _A), r"\1 ' "),
)
_PARENS_BRACKETS = (re.compile(r"[\]\[\(\)\{\}\<\>]", _A), r" \g<0> ")
_DOUBLE_DASHES = (re.compile(r"--", _A), r" -- ")
_ENDING_QUOTES = (
    (re.compile("([»”’])"), r" \1 "),
    (re.compile(r'"', _A), " '' "),
    (re.compile(r"(\S)(\'\')", _A), r"\1 \2 "),
    (re.compile(r"([^' ])('[sS]|'[mM]|'[dD]|') ", _A), r"\1 \2 "),
    (re.compile(r"([^' ])('ll|'LL|'re|'RE|'ve|'VE|n't|N'T) ", _A), r"\1 \2 "),
)
# Robert MacIntyre's contractions, as NLTK 3.4.5 lists them (CONTRACTIONS4 is unused there).
_CONTRACTIONS = tuple(
    re.compile(pattern, _A)
    for pattern in (
        r"(?i)\b(can)(?#X)(not)\b",
        r"(?i)\b(d)(?#X)('ye)\b",
        r"(?i)\b(gim)(?#X)(me)\b",
        r"(?i)\b(gon)(?#X)(na)\b",
        r"(?i)\b(got)(?#X)(ta)\b",
        r"(?i)\b(lem)(?#X)(me)\b",
        r"(?i)\b(mor)(?#X)('n)\b",
        r"(?i)\b(wan)(?#X)(na)\s",
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
