"""Whole words for masking where word pieces do not show them: Chinese, segmented.

A Chinese character is always a word of its own to WordPiece, so `##` continuations never
join characters into words. These functions mark the characters that continue a word,
from jieba's segmentation of each sentence or from a reference file, the way transformers'
`DataCollatorForWholeWordMask` reads them (`chinese_ref`, written by `run_chinese_ref.py`):
a continuation is a one-character Chinese token inside a segmented word of several Chinese
characters, after its first. The flags travel with the token ids through the cutting of
instances (`number_tokens`, `split_instance`), so a packed row keeps its words' bounds, and
`masked_unit_sizes` measures what a masking took: characters per masked unit.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import numpy as np

from bertkit.errors import UserError
from bertkit.files import numbered_lines, parse_json

_CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)  # BERT's `_is_chinese_char` blocks, which also split every such character off


def is_chinese(text: str) -> bool:
    """Whether every character of a non-empty `text` is a CJK ideograph, as BERT counts them.

    Example:
        >>> is_chinese("北京"), is_chinese("北京2"), is_chinese("")
        (True, False, False)
    """
    return bool(text) and all(
        any(low <= ord(char) <= high for low, high in _CJK_RANGES) for char in text
    )


def chinese_continuations(tokens: list[str], words) -> np.ndarray:
    """Which tokens continue a multi-character Chinese word of `words` (after its first).

    transformers' `add_sub_symbol`: from left to right, at a Chinese token, the longest run
    of tokens whose characters spell one of `words` of 2+ Chinese characters is one word;
    tokens inside no such word start their own.

    Args:
        tokens: a sentence's word pieces, as strings.
        words: the sentence's segmented words (any order; others are ignored).

    Returns:
        A bool array `(len(tokens),)`.

    Example:
        >>> tokens = ["我", "爱", "北", "京", "天", "安", "门", "!"]
        >>> chinese_continuations(tokens, ["我", "爱", "北京", "天安门", "!"]).astype(int).tolist()
        [0, 0, 0, 1, 0, 1, 1, 0]
    """
    vocabulary = {word for word in words if len(word) > 1 and is_chinese(word)}
    continues = np.zeros(len(tokens), dtype=bool)
    longest = max(map(len, vocabulary), default=0)
    start = 0
    while start < len(tokens):
        span = 1
        if is_chinese(tokens[start]):
            for length in range(min(longest, len(tokens) - start), 1, -1):
                if "".join(tokens[start : start + length]) in vocabulary:
                    span = length
                    break
        continues[start + 1 : start + span] = True
        start += span
    return continues


@functools.cache
def jieba_words():
    """jieba's segmenter, `text -> list of words`, loaded once and quietly.

    Raises:
        UserError: jieba is not installed (it is the `zh` extra).
    """
    try:
        import jieba
    except ImportError:
        raise UserError(
            "task.whole_word_masking: jieba needs the jieba package: pip install 'bertkit[zh]'"
        ) from None
    # Its own Tokenizer, not the module's shared one: nothing another user of jieba adds to
    # the global dictionary changes our words. Its startup logs "Building prefix dict..."
    # at DEBUG on stderr; only warnings pass.
    jieba.setLogLevel(logging.WARNING)
    segmenter = jieba.Tokenizer()
    segmenter.initialize()
    return lambda text: segmenter.lcut(text, HMM=True)


@dataclasses.dataclass(frozen=True)
class WordReference:
    """One line of a word-reference file: the positions of its sentence's tokens that
    continue a word, counted with `[CLS]` at 0 (transformers' `--train_ref_file`)."""

    line: int
    continuations: tuple[int, ...]


def read_word_reference(path) -> list[WordReference]:
    """The reference's lines, blank lines skipped as `run_mlm_wwm.py` skips them.

    Raises:
        UserError: a line that is not a JSON list of whole numbers; names file and line.

    Example:
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "ref.txt"
        >>> _ = path.write_text("[2, 4]\\n\\n[]\\n")
        >>> read_word_reference(path)
        [WordReference(line=1, continuations=(2, 4)), WordReference(line=3, continuations=())]
    """
    references = []
    for number, line in numbered_lines(path):
        if not line.strip():
            continue
        positions = parse_json(line, path, number)
        if not isinstance(positions, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) for p in positions
        ):
            message = f"expected a JSON list of token positions, got {line.strip()[:40]!r}"
            raise UserError(message, source=path, line=number)
        references.append(WordReference(number, tuple(positions)))
    return references


def reference_continuations(reference: WordReference, tokens: list[str], source) -> np.ndarray:
    """A reference line's positions as flags over its sentence's `tokens`.

    Raises:
        UserError: a position outside the sentence (1 to its token count: 0 is `[CLS]`), or
            at a token that is not one Chinese character (the reference was made with
            another tokenization); names file and line.

    Example:
        >>> flags = reference_continuations(WordReference(1, (2,)), ["北", "京"], "ref.txt")
        >>> flags.tolist()
        [False, True]
    """
    continues = np.zeros(len(tokens), dtype=bool)
    for position in reference.continuations:
        if not 1 <= position <= len(tokens):
            raise UserError(
                f"position {position} is outside the line's tokens, 1 to {len(tokens)} "
                "([CLS] is 0)",
                source=source,
                line=reference.line,
            )
        token = tokens[position - 1]
        if len(token) != 1 or not is_chinese(token):
            raise UserError(
                f"position {position} is {token!r}, not a Chinese character: was the "
                "reference made with this vocabulary?",
                source=source,
                line=reference.line,
            )
        continues[position - 1] = True
    return continues


# ---- carrying the flags through the cutting of instances
def number_tokens(documents: list[list[list[int]]]) -> list[list[list[int]]]:
    """The documents with each token replaced by its position in the whole corpus, so that
    `create_instances`, which only counts and slices, cuts any per-token column alike.

    Example:
        >>> number_tokens([[[7, 8], [9]], [[5]]])
        [[[0, 1], [2]], [[3]]]
    """
    numbered, position = [], 0
    for document in documents:
        numbered.append([])
        for sentence in document:
            numbered[-1].append(list(range(position, position + len(sentence))))
            position += len(sentence)
    return numbered


def split_instance(instance, columns: list[np.ndarray]) -> list:
    """A numbered instance (`number_tokens`) as one instance per flat column.

    Example:
        >>> from bertkit_tasks.mlm.pretraining_corpus import Instance
        >>> ids, starts = np.array([7, 8, 9]), np.array([1, 0, 1])
        >>> [i.segment_a for i in split_instance(Instance([1, 2], [], False), [ids, starts])]
        [[8, 9], [0, 1]]
    """
    return [
        dataclasses.replace(
            instance,
            segment_a=column[instance.segment_a].tolist(),
            segment_b=column[instance.segment_b].tolist(),
        )
        for column in columns
    ]


# ---- what a masking took
def token_characters(vocabulary) -> np.ndarray:
    """Characters each vocabulary entry stands for: `##` not counted, `[UNK]`-like tokens 1.

    Example:
        >>> token_characters(["[UNK]", "北", "play", "##ing"]).tolist()
        [1, 1, 4, 3]
    """
    return np.array(
        [
            1 if token.startswith("[") and token.endswith("]") else len(token.removeprefix("##"))
            for token in vocabulary
        ],
        dtype=np.int64,
    )


def masked_unit_sizes(token_ids, mask_positions, mask_weights, word_starts, characters):
    """Characters in each masked unit (a word taken whole) of a `mask_tokens` output.

    A unit starts at a chosen word start, or at a chosen position after one not chosen
    (a word cut at a row's start, or a special token, starts there too).

    Args:
        token_ids: the uncorrupted ids `(batch, seq)`.
        mask_positions: `(batch, P)`; mask_weights: `(batch, P)`, 1 for a used slot.
        word_starts: bool `(batch, seq)`, as given to `mask_tokens`.
        characters: `token_characters(vocabulary)`.

    Returns:
        An int array, one entry per masked unit.

    Example:
        >>> ids = np.array([[0, 5, 6, 7, 0]])  # 5, 6 one word; 7 another
        >>> starts = np.array([[True, True, False, True, True]])
        >>> masked_unit_sizes(ids, np.array([[1, 2, 3]]), np.ones((1, 3)), starts,
        ...                   np.array([1, 1, 1, 1, 1, 1, 1, 2])).tolist()
        [2, 2]
    """
    token_ids = np.asarray(token_ids)
    chosen = np.zeros(token_ids.shape, dtype=bool)
    rows = np.broadcast_to(np.arange(len(token_ids))[:, None], np.shape(mask_positions))
    used = np.asarray(mask_weights) > 0
    chosen[rows[used], np.asarray(mask_positions)[used]] = True
    after_unchosen = np.pad(~chosen[:, :-1], ((0, 0), (1, 0)), constant_values=True)
    unit_starts = chosen & (np.asarray(word_starts, dtype=bool) | after_unchosen)
    unit_of = np.cumsum(unit_starts.ravel()) - 1  # row-major: units never span rows
    sizes = np.bincount(unit_of[chosen.ravel()], weights=characters[token_ids[chosen]])
    return sizes.astype(np.int64)


def unit_summary(sizes: np.ndarray) -> str:
    """The measure in words: the share of masked units over one character, and their mean.

    Example:
        >>> unit_summary(np.array([1, 2, 3, 1]))
        '50.0% of masked units span more than one character, 1.75 characters a unit'
    """
    if not len(sizes):
        return "no masked units"
    return (
        f"{np.mean(sizes > 1):.1%} of masked units span more than one character, "
        f"{np.mean(sizes):.2f} characters a unit"
    )


def corpus_references(path, sentence_count: int, corpus) -> list[WordReference]:
    """`read_word_reference(path)`, which must hold one line per sentence of `corpus`.

    Raises:
        UserError: a bad line, or a line count other than the corpus's sentence count.
    """
    references = read_word_reference(path)
    if len(references) != sentence_count:
        extra = references[sentence_count].line if len(references) > sentence_count else None
        raise UserError(
            f"{len(references)} reference lines for the {sentence_count} sentences "
            f"(non-blank lines) of {corpus}",
            source=path,
            line=extra,
        )
    return references
