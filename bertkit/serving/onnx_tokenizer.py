"""bertkit's WordPiece tokenization without TensorFlow, for the ONNX runtime
(`bertkit.serving.onnx_runtime`).

bertkit tokenizes with tf-text (`bertkit.model.tokenizer.WordPieceTokenizer`); an ONNX
folder is served where TensorFlow is not installed, so this module rebuilds the same
tokenization on Hugging Face `tokenizers` (a dependency of keras-hub, and of the `onnx`
extra): BERT's normalizer (clean text, CJK characters split, uncased: accents stripped and
lowercased), BERT's pre-tokenizer and a WordPiece model over the folder's `vocab.txt`. bertkit's
ids equal `BertTokenizerFast`'s piece for piece (`bertkit.model.tokenizer`'s docstring), and
`tests/test_onnx_export.py` checks these against bertkit's on its inputs. With
`normalize_punctuation`, the vocabulary's punctuation equivalents are replaced after BERT's
normalization, as bertkit does (`bertkit.model.bert_normalizer`); offsets stay those of the
original text.

What it gives is what the tasks' featurizers read from bertkit's tokenizer: piece ids with
their character offsets in the original text, words as bertkit reads them back from the pieces
(`WordPieceTokenizer.words_with_offsets`) or one word a character, and `pack`, tf-text's
round-robin trimming and `[CLS] a [SEP] b [SEP]` packing.

Example:
    >>> tokenizer = PieceTokenizer(
    ...     ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "good", "film", "##s", "!"], lowercase=True)
    >>> [(p.ids.tolist(), p.starts.tolist(), p.ends.tolist())
    ...  for p in tokenizer.pieces(["Good films!"])]
    [([4, 5, 6, 7], [0, 5, 9, 10], [4, 9, 10, 11])]
    >>> token_ids, segment_ids = tokenizer.pack([[4, 5, 6], [7]], sequence_length=5)
    >>> token_ids.tolist(), segment_ids.tolist()
    ([2, 4, 3, 7, 3], [0, 0, 0, 1, 1])
"""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path
from typing import NamedTuple

import numpy as np

from bertkit.errors import UserError

VOCABULARY_FILE = "vocab.txt"
SETTINGS_FILE = "tokenizer.json"  # bertkit's settings (`WordPieceTokenizer.save`)
MAX_WORD_CHARACTERS = 100  # tf-text's and BERT's: a longer word is [UNK]


class Pieces(NamedTuple):
    """A text's word pieces: ids and character starts and ends, each (pieces,)."""

    ids: np.ndarray
    starts: np.ndarray
    ends: np.ndarray


class PieceTokenizer:
    """bertkit's tokenizer of one vocabulary, on Hugging Face `tokenizers` (no TensorFlow).

    Args:
        vocabulary: word pieces, one per id, with [PAD], [UNK], [CLS] and [SEP].
        lowercase: an uncased vocabulary (lowercase, strip accents).
        normalize_punctuation: replace characters the vocabulary lacks by its equivalents.
    """

    def __init__(self, vocabulary: list[str], lowercase: bool, normalize_punctuation: bool = False):
        from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

        from bertkit.model.vocabulary_checks import punctuation_equivalents

        self.vocabulary, self.lowercase = list(vocabulary), bool(lowercase)
        index = {token: i for i, token in enumerate(self.vocabulary)}
        missing = [t for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]") if t not in index]
        if missing:
            raise UserError(f"vocabulary lacks the special tokens {', '.join(missing)}")
        self.pad_id, self.unk_id = index["[PAD]"], index["[UNK]"]
        self.cls_id, self.sep_id = index["[CLS]"], index["[SEP]"]
        self.mask_id = index.get("[MASK]", self.unk_id)
        steps = [
            normalizers.BertNormalizer(
                clean_text=True,
                handle_chinese_chars=True,
                strip_accents=lowercase,
                lowercase=lowercase,
            )  # fmt: skip
        ]
        if normalize_punctuation:
            equivalents = punctuation_equivalents(self.vocabulary, self.lowercase)
            steps += [normalizers.Replace(key, value) for key, value in equivalents.items()]
        tokenizer = Tokenizer(
            models.WordPiece(index, unk_token="[UNK]", max_input_chars_per_word=MAX_WORD_CHARACTERS)
        )
        tokenizer.normalizer = normalizers.Sequence(steps)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        self._tokenizer = tokenizer
        self._continues = np.array([token.startswith("##") for token in self.vocabulary])

    @classmethod
    def load(cls, directory) -> PieceTokenizer:
        """The tokenizer of a folder holding `vocab.txt` and bertkit's `tokenizer.json`."""
        directory = Path(directory)
        try:
            settings = json.loads((directory / SETTINGS_FILE).read_text(encoding="utf-8"))
            text = (directory / VOCABULARY_FILE).read_text(encoding="utf-8")
        except (OSError, ValueError) as error:
            reason = getattr(error, "strerror", None) or str(error)
            raise UserError(
                f"cannot read the tokenizer files: {reason}", source=directory
            ) from None
        vocabulary = [line.rstrip("\r") for line in text.rstrip("\n").split("\n")]
        return cls(vocabulary, settings["lowercase"], settings.get("normalize_punctuation", False))

    def pieces(self, texts: list[str]) -> list[Pieces]:
        """Each text's word pieces, with character offsets into the text."""
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [_pieces(encoding.ids, encoding.offsets) for encoding in encodings]

    def words(self, texts: list[str], rule: str = "bert", max_pieces: int | None = None):
        """Per text: (piece ids (flat), pieces per word, (2, words) character offsets), with
        bertkit's words: `bert`, runs of pieces from one that does not start with "##" (or
        the text's first), or `characters`, each character that is not whitespace or a
        control character a word of its own; a word keeps at most `max_pieces` pieces, a
        word without any gets [UNK].

        Example:
            >>> tokenizer = PieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "d", "##2",
            ...                             "2", "比"], lowercase=True)
            >>> [[a.tolist() for a in word] for word in tokenizer.words(["D2 比"])]
            [[[4, 5, 7], [2, 1], [[0, 3], [2, 4]]]]
            >>> [[a.tolist() for a in word] for word in tokenizer.words(["D2 比"], "characters")]
            [[[4, 6, 7], [1, 1, 1], [[0, 1, 3], [1, 2, 4]]]]
        """
        if rule == "characters":
            return [self._character_words(text, max_pieces) for text in texts]
        results = []
        for pieces in self.pieces(texts):
            first = ~self._continues[pieces.ids]
            first[:1] = True
            starts = np.flatnonzero(first)
            ends = np.append(starts[1:], len(pieces.ids))
            words = [pieces.ids[s:e] for s, e in zip(starts, ends, strict=True)]
            chars = np.stack([pieces.starts[starts], pieces.ends[ends - 1]]).reshape(2, -1)
            results.append((*self._clipped(words, max_pieces), chars))
        return results

    def word_list_pieces(self, words: list[str], max_pieces: int | None = None):
        """A list of words, each tokenized on its own: (piece ids (flat), pieces per word)."""
        return self._clipped([p.ids for p in self.pieces(words)], max_pieces)

    def _character_words(self, text: str, max_pieces: int | None):
        kept = [i for i, character in enumerate(text) if not _not_a_word(character)]
        ids, lengths = self.word_list_pieces([text[i] for i in kept], max_pieces)
        chars = np.array([kept, [i + 1 for i in kept]], dtype=np.int64).reshape(2, -1)
        return ids, lengths, chars

    def _clipped(self, words: list, max_pieces: int | None):
        words = [w[:max_pieces] if len(w) else np.array([self.unk_id]) for w in words]
        lengths = np.array([len(w) for w in words], dtype=np.int64)
        ids = np.concatenate([np.zeros(0, np.int32), *words]).astype(np.int32)
        return ids, lengths

    def pack(self, segments: list, sequence_length: int) -> tuple[np.ndarray, np.ndarray]:
        """1 or 2 segments' piece ids, trimmed as tf-text's `RoundRobinTrimmer` trims them
        (one piece of each segment in turn until the budget is spent) and packed as
        `[CLS] a [SEP] (b [SEP])`: token ids and segment ids, int32."""
        budget = sequence_length - 1 - len(segments)
        keep = [min(len(segments[0]), budget)]
        if len(segments) == 2:
            first, second = len(segments[0]), len(segments[1])
            keep = [min(first, max((budget + 1) // 2, budget - second))]
            keep.append(min(second, budget - keep[0]))
        token_ids, segment_ids = [self.cls_id], [0]
        for segment, (ids, count) in enumerate(zip(segments, keep, strict=True)):
            token_ids += [*map(int, ids[:count]), self.sep_id]
            segment_ids += [segment] * (count + 1)
        return np.array(token_ids, np.int32), np.array(segment_ids, np.int32)


def _pieces(ids: list, offsets: list) -> Pieces:
    spans = np.array(offsets, dtype=np.int64).reshape(-1, 2)
    return Pieces(np.array(ids, dtype=np.int32), spans[:, 0], spans[:, 1])


# what `bertkit_tasks.tagging.text_words.character_words` skips: whitespace, Zs, Cc, Cf, U+FFFD
_NOT_A_WORD = re.compile(r"[ \t\n\r\f\v\ufffd]")  # RE2's \s is ASCII only


def _not_a_word(character: str) -> bool:
    return bool(_NOT_A_WORD.fullmatch(character)) or unicodedata.category(character) in (
        "Zs",
        "Cc",
        "Cf",
    )
