"""WordPiece tokenization on tensorflow-text, usable eagerly, in `tf.data` and in SavedModels.

Built on `tensorflow_text.FastBertTokenizer` (the C++ end-to-end BERT
tokenizer with byte offsets) rather than keras-hub's `BertTokenizer`, because
tagging and question answering need each word piece's character offsets in
the original text, which keras-hub's tokenizer does not expose. Packing uses
tf-text's `RoundRobinTrimmer` (longest-first truncation of pairs) and
`combine_segments` ([CLS] A [SEP] B [SEP] with segment ids).
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

import numpy as np

from bertkit.errors import UserError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_ENCODE_CHUNK = 2048  # strings per eager tokenizer call: large enough to amortize op dispatch


def vocabulary_is_cased(vocabulary: list[str]) -> bool:
    """True when a vocabulary has uppercase word pieces (a cased checkpoint).

    Example:
        >>> vocabulary_is_cased(["[CLS]", "the", "The", "Paris"])
        True
        >>> vocabulary_is_cased(["[CLS]", "[UNK]", "the", "paris"])
        False
    """
    words = [t for t in vocabulary if not (t.startswith("[") and t.endswith("]"))]
    uppercase = sum(any(c.isupper() for c in t) for t in words)
    return uppercase > max(1, len(words) // 1000)


class WordPieceTokenizer:
    """A BERT WordPiece tokenizer with lowercasing/accent stripping as the checkpoint needs.

    Args:
        vocabulary: word pieces, one per id; must hold [PAD], [UNK], [CLS], [SEP].
        lowercase: lowercase and strip accents (uncased checkpoints).

    Example:
        >>> tokenizer = WordPieceTokenizer(
        ...     ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "film", "##s", "!"],
        ...     lowercase=True)
        >>> token_ids, segment_ids = tokenizer.encode(["Good films!"], sequence_length=16)
        >>> token_ids[0].tolist(), segment_ids[0].tolist()
        ([2, 5, 6, 7, 8, 3], [0, 0, 0, 0, 0, 0])
        >>> pieces = tokenizer.encode(["good"], ["film"], sequence_length=16)[0][0]
        >>> [tokenizer.vocabulary[i] for i in pieces]
        ['[CLS]', 'good', '[SEP]', 'film', '[SEP]']
    """

    def __init__(self, vocabulary: list[str], lowercase: bool):
        missing = [t for t in SPECIAL_TOKENS[:4] if t not in vocabulary]
        if missing:
            raise UserError(f"vocabulary lacks the special tokens {', '.join(missing)}")
        duplicates = sorted({t for t in vocabulary if vocabulary.count(t) > 1}) if len(
            set(vocabulary)) < len(vocabulary) else []
        if duplicates:
            raise UserError(f"vocabulary repeats tokens: {', '.join(duplicates[:5])}")
        self.vocabulary = list(vocabulary)
        self.lowercase = bool(lowercase)
        index = {token: i for i, token in enumerate(self.vocabulary)}
        self.pad_id, self.unk_id = index["[PAD]"], index["[UNK]"]
        self.cls_id, self.sep_id = index["[CLS]"], index["[SEP]"]
        self.mask_id = index.get("[MASK]", self.unk_id)

    @property
    def vocabulary_size(self) -> int:
        return len(self.vocabulary)

    @cached_property
    def fast_tokenizer(self):
        """The tf-text tokenizer (a `tf.Module`, tracked by SavedModel export)."""
        import tensorflow as tf
        import tensorflow_text as tf_text

        return tf_text.FastBertTokenizer(
            self.vocabulary, token_out_type=tf.int32, unknown_token="[UNK]",
            lower_case_nfd_strip_accents=self.lowercase)

    # ---- TensorFlow ops (graph-safe)
    def tokenize(self, texts):
        """(batch,) strings -> (batch, (pieces)) int32 ragged ids."""
        return self.fast_tokenizer.tokenize(texts)

    def tokenize_with_offsets(self, texts):
        """(batch,) strings -> ids, start and end BYTE offsets, each (batch, (pieces))."""
        return self.fast_tokenizer.tokenize_with_offsets(texts)

    def tokenize_words(self, words):
        """(batch, (words)) strings -> (batch, (words), (pieces)) ids."""
        return self.fast_tokenizer.tokenize(words)

    def pack(self, segments: list, sequence_length: int):
        """Truncates (longest first) and packs 1 or 2 ragged segments with [CLS]/[SEP].

        Returns ragged `token_ids` and `segment_ids`, each (batch, (<= sequence_length)).
        """
        import tensorflow_text as tf_text

        budget = sequence_length - 1 - len(segments)
        trimmed = tf_text.RoundRobinTrimmer(max_seq_length=budget).trim(segments)
        return tf_text.combine_segments(
            trimmed, start_of_sequence_id=self.cls_id, end_of_segment_id=self.sep_id)

    # ---- eager helpers for featurization
    def encode(self, texts: list[str], pairs: list[str] | None = None, *,
               sequence_length: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Tokenizes and packs texts (and pairs) into unpadded int32 arrays, in chunks."""
        import tensorflow as tf

        token_ids, segment_ids = [], []
        for start in range(0, len(texts), _ENCODE_CHUNK):
            chunk = [self.tokenize(tf.constant(texts[start:start + _ENCODE_CHUNK]))]
            if pairs is not None:
                chunk.append(self.tokenize(tf.constant(pairs[start:start + _ENCODE_CHUNK])))
            ids, segments = self.pack(chunk, sequence_length)
            token_ids += _split_rows(ids)
            segment_ids += _split_rows(segments)
        return token_ids, segment_ids

    # ---- persistence
    def save(self, directory) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "vocab.txt").write_text("\n".join(self.vocabulary) + "\n", encoding="utf-8")
        (directory / "tokenizer.json").write_text(json.dumps({"lowercase": self.lowercase}))

    @classmethod
    def load(cls, directory) -> WordPieceTokenizer:
        directory = Path(directory)
        settings = json.loads((directory / "tokenizer.json").read_text())
        return cls(read_vocabulary(directory / "vocab.txt"), settings["lowercase"])


def read_vocabulary(path) -> list[str]:
    """One word piece per line, as in BERT's vocab.txt (trailing newline optional)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError("vocabulary file not found", source=path) from None
    return [line.rstrip("\r") for line in text.rstrip("\n").split("\n")]


def _split_rows(ragged) -> list[np.ndarray]:
    values = ragged.flat_values.numpy().astype(np.int32)
    splits = ragged.row_splits.numpy()
    return [values[a:b] for a, b in zip(splits[:-1], splits[1:])]
