"""The mlm task's `whole_word_masking`: which tokens one masked unit takes together.

`false`: each piece is a unit. `true`: a word piece with its `##` continuations (read off
the token ids at batch time, so features need nothing more). `"jieba"` and `"reference"`:
also a Chinese word of several characters, found by jieba or listed in a reference file;
those bounds cannot be read off the ids, so featurizing stores them as a `word_starts`
column (`sentence_word_starts`), which the rows' cutting and packing keep aligned.
"""

from __future__ import annotations

import itertools
import sys
from functools import cached_property

import numpy as np

from bertkit.errors import UserError
from bertkit.progress import say
from bertkit_tasks.mlm.masking import is_continuation_piece, word_start_mask
from bertkit_tasks.mlm.word_segments import (
    WordReference,
    chinese_continuations,
    corpus_references,
    jieba_words,
    masked_unit_sizes,
    reference_continuations,
    token_characters,
    unit_summary,
)

SEGMENTERS = ("jieba", "reference")


def word_reference_path(mode, data, path) -> str | None:
    """The word-reference file of corpus `path` under `whole_word_masking: mode`, or None.

    Checks the options first, so a wrong combination fails before anything is read: a
    reference file without `reference`, `reference` without `data.train_word_reference`,
    `jieba` without jieba installed. A corpus with no reference of its own (a validation or
    evaluation file) is said in one line on stderr: its words are pieces.
    """
    for key in ("train_word_reference", "validation_word_reference"):
        if getattr(data, key) and mode != "reference":
            message = "is read only with task.whole_word_masking: reference"
            raise UserError(message, key=f"data.{key}")
    if mode == "jieba":
        jieba_words()
    if mode != "reference":
        return None
    if not data.train_word_reference:
        raise UserError(
            "task.whole_word_masking: reference needs this file", key="data.train_word_reference"
        )
    references = {data.train: data.train_word_reference}
    references.setdefault(data.validation, data.validation_word_reference)
    if references.get(str(path)) is None:
        say(f"{path}: no word reference: its words are pieces with ## continuations", sys.stderr)
    return references.get(str(path))


def document_references(reference, documents, corpus) -> list:
    """Per document of `corpus`, its sentences' `(line, positions)` from the word-reference
    file `reference` (one line per sentence, in order); all None without a reference."""
    if reference is None:
        return [None] * len(documents)
    lines = iter(corpus_references(reference, sum(map(len, documents)), corpus))
    return [
        tuple((r.line, r.continuations) for r in itertools.islice(lines, len(sentences)))
        for sentences in documents
    ]


class WordUnits:
    """Word starts under one `whole_word_masking` mode, over one vocabulary.

    Args:
        mode: False, True, "jieba" or "reference".
        vocabulary: the tokenizer's tokens, in id order.

    Example:
        >>> units = WordUnits(True, ["[CLS]", "play", "##ing"])
        >>> units.starts(np.array([[0, 1, 2]])).tolist(), WordUnits(False, []).segmented
        ([[True, True, False]], False)
    """

    def __init__(self, mode, vocabulary):
        self.mode, self.vocabulary = mode, vocabulary

    @property
    def segmented(self) -> bool:
        """Whether word starts come from a segmenter, as a featurized column."""
        return self.mode in SEGMENTERS

    @cached_property
    def continuation_pieces(self) -> np.ndarray:
        return is_continuation_piece(self.vocabulary)

    def starts(self, token_ids, word_starts=None):
        """`mask_tokens`' `word_starts` for a batch: the featurized column when there is one,
        else read off the pieces; None without whole-word masking."""
        if word_starts is not None:
            return np.asarray(word_starts, dtype=bool)
        if self.mode:
            return word_start_mask(token_ids, self.continuation_pieces)
        return None

    def sentence_word_starts(self, documents, rows) -> list[np.ndarray]:
        """Per sentence of `documents`, True where a word starts: not at a `##` piece, not
        inside a segmented Chinese word. `rows`: each sentence's token ids, in order."""
        rows, starts = iter(rows), []
        for document in documents:
            references = document.word_reference or (None,) * len(document.sentences)
            for sentence, reference in zip(document.sentences, references, strict=True):
                ids = next(rows)
                tokens = [self.vocabulary[i] for i in ids]
                if reference is not None:
                    inside = reference_continuations(
                        WordReference(*reference), tokens, document.reference_source
                    )
                elif self.mode == "jieba":
                    inside = chinese_continuations(tokens, jieba_words()(sentence))
                else:  # a corpus without a reference of its own
                    inside = np.zeros(len(ids), bool)
                starts.append(~(self.continuation_pieces[ids] | inside))
        return starts

    def summary(self, token_ids, masked: dict, word_starts=None) -> str:
        """The measure of a masking (`mask_tokens`' output), as one line."""
        sizes = masked_unit_sizes(
            token_ids,
            masked["mask_positions"],
            masked["mask_weights"],
            self.starts(token_ids, word_starts),
            token_characters(self.vocabulary),
        )
        name = "pieces" if self.mode is True else self.mode
        return f"whole-word masking ({name}): {unit_summary(sizes)}"
