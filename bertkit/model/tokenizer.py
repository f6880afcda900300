"""WordPiece tokenization on tensorflow-text, usable eagerly, in `tf.data` and in SavedModels.

Built on `tensorflow_text.FastBertTokenizer` (the C++ end-to-end BERT
tokenizer with byte offsets) rather than keras-hub's `BertTokenizer`, because
tagging and question answering need each word piece's character offsets in
the original text, which keras-hub's tokenizer does not expose. Packing uses
tf-text's `RoundRobinTrimmer` (longest-first truncation of pairs) and
`combine_segments` ([CLS] A [SEP] B [SEP] with segment ids).

Normalization is bertkit's (`bert_normalizer.BertNormalizer`), not tf-text's:
the checkpoint was pretrained on BERT's normalization (drop control characters,
whitespace to spaces; uncased: per character NFD, drop marks, lowercase), and
tf-text's `lower_case_nfd_strip_accents` is NFKC casefolding, which rewrites
'ﬁ', '½', '²', 'ß', '™', full-width and styled letters into pieces the model
never saw as such (and gives expanded pieces empty spans in the original
text). So FastBertTokenizer only splits words and finds pieces in the
normalized text, and the normalizer maps its offsets back to the original.
This matches Hugging Face's tokenizer on SQuAD and CoNLL-2003 piece for piece.

A loaded model's tokenizer runs its repeated eager calls traced (`trace_repeated_calls`,
`bertkit.model.traced_calls`): one graph call instead of about a hundred eager ops.

Words (`words_with_offsets`) are read back from the pieces, so they are BERT's
basic tokenization; `character_offsets` (NumPy) and `batch_substrings`
(TensorFlow) turn the tokenizer's byte offsets into character offsets;
`bertkit.model.token_rows` turns its ragged outputs into NumPy rows.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

import numpy as np

from bertkit.errors import UserError
from bertkit.model.token_rows import (  # noqa: F401 (tasks import the last two from here)
    in_chunks,
    split_rows,
    split_word_rows,
    tokenize_in_chunks,
)
from bertkit.model.traced_calls import TracedCalls, traced_method
from bertkit.model.vocabulary_checks import vocabulary_is_cased  # noqa: F401 (public here too)

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


class WordPieceTokenizer:
    """A BERT WordPiece tokenizer, normalizing text as BERT does (uncased: lowercased, no accents).

    Args:
        vocabulary: word pieces, one per id; must hold [PAD], [UNK], [CLS], [SEP].
        lowercase: lowercase and strip accents (uncased checkpoints).
        normalize_punctuation: map characters the vocabulary lacks to the equivalents it
            has ('“' -> '"', '…' -> '...', full-width forms; see
            `bertkit.model.vocabulary_checks.punctuation_equivalents`), offsets kept.

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

    def __init__(self, vocabulary: list[str], lowercase: bool, normalize_punctuation: bool = False):
        missing = [t for t in SPECIAL_TOKENS[:4] if t not in vocabulary]
        if missing:
            raise UserError(f"vocabulary lacks the special tokens {', '.join(missing)}")
        duplicates = (
            sorted({t for t in vocabulary if vocabulary.count(t) > 1})
            if len(set(vocabulary)) < len(vocabulary)
            else []
        )
        if duplicates:
            raise UserError(f"vocabulary repeats tokens: {', '.join(duplicates[:5])}")
        self.vocabulary = list(vocabulary)
        self.lowercase = bool(lowercase)
        self.normalize_punctuation = bool(normalize_punctuation)
        index = {token: i for i, token in enumerate(self.vocabulary)}
        self.pad_id, self.unk_id = index["[PAD]"], index["[UNK]"]
        self.cls_id, self.sep_id = index["[CLS]"], index["[SEP]"]
        self.mask_id = index.get("[MASK]", self.unk_id)
        self.traced_calls = TracedCalls()

    def trace_repeated_calls(self) -> None:
        """From now on, an eager call (`tokenize`, `tokenize_with_offsets`, `tokenize_words`,
        `words_with_offsets`, `pack`) and the task's work through `traced_calls` run traced
        from their second time (`bertkit.model.traced_calls`). Outputs do not change."""
        self.traced_calls.enable()

    @property
    def vocabulary_size(self) -> int:
        return len(self.vocabulary)

    @cached_property
    def normalizer(self):
        """BERT's normalization (a `tf.Module`, tracked by SavedModel export)."""
        from bertkit.model.bert_normalizer import BertNormalizer
        from bertkit.model.vocabulary_checks import punctuation_equivalents

        equivalents = None
        if self.normalize_punctuation:
            equivalents = punctuation_equivalents(self.vocabulary, self.lowercase)
        return BertNormalizer(self.lowercase, equivalents)

    def with_settings(self, **settings) -> WordPieceTokenizer:
        """This vocabulary's tokenizer with other `lowercase` / `normalize_punctuation`."""
        current = {"lowercase": self.lowercase, "normalize_punctuation": self.normalize_punctuation}
        return WordPieceTokenizer(self.vocabulary, **{**current, **settings})

    @cached_property
    def fast_tokenizer(self):
        """The tf-text tokenizer of normalized text (a `tf.Module`, tracked by export)."""
        import tensorflow as tf
        import tensorflow_text as tf_text

        # Built eagerly even when first used while tracing: its constants would otherwise
        # belong to that graph, and a second export of the model could not read them.
        with tf.init_scope():
            return tf_text.FastBertTokenizer(
                self.vocabulary,
                token_out_type=tf.int32,
                unknown_token="[UNK]",
                lower_case_nfd_strip_accents=False,
            )

    # ---- TensorFlow ops (graph-safe)
    @traced_method
    def tokenize(self, texts):
        """(batch,) strings -> (batch, (pieces)) int32 ragged ids."""
        return self.fast_tokenizer.tokenize(self.normalizer.normalize(texts))

    @traced_method
    def tokenize_with_offsets(self, texts):
        """(batch,) strings -> ids, start and end BYTE offsets, each (batch, (pieces)).

        The offsets are into the original texts: a piece of a character that
        normalization expanded (Hangul syllables into letters) spans all of it.
        """
        normalized, alignment = self.normalizer.normalize_with_alignment(texts)
        ids, starts, ends = self.fast_tokenizer.tokenize_with_offsets(normalized)
        return (ids, *alignment.source_offsets(starts, ends))

    @traced_method
    def tokenize_words(self, words, max_pieces: int | None = None):
        """(batch, (words)) strings -> (batch, (words), (pieces)) ids.

        With `max_pieces`, every word gets 1 to `max_pieces` pieces: its first
        ones, or [UNK] when it has none (a word of control characters), so
        that no word is lost.

        Example:
            >>> import tensorflow as tf
            >>> tokenizer = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "film",
            ...                                 "##s", "##y"], lowercase=True)
            >>> words = tf.ragged.constant([["films", "\\x07", "filmy"]])
            >>> tokenizer.tokenize_words(words).to_list()
            [[[4, 5], [], [4, 6]]]
            >>> tokenizer.tokenize_words(words, max_pieces=1).to_list()
            [[[4], [1], [4]]]
        """
        pieces = self.tokenize(words)
        return pieces if max_pieces is None else _clip_word_pieces(pieces, self.unk_id, max_pieces)

    @traced_method
    def words_with_offsets(self, texts, max_pieces: int | None = None):
        """(batch,) strings -> their words' pieces and start and end BYTE offsets.

        The words are the tokenizer's, BERT's basic tokenization (split at
        whitespace and around punctuation and CJK characters): runs of pieces
        from a piece that does not start with "##" (or a text's first piece).
        `max_pieces` limits each word's pieces as in `tokenize_words`; the
        offsets stay those of the whole word.

        Returns:
            Pieces (batch, (words), (pieces)); starts and ends, each (batch, (words)).

        Example:
            >>> import tensorflow as tf
            >>> tokenizer = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "good",
            ...                                 "film", "##s", "!"], lowercase=True)
            >>> pieces, starts, ends = tokenizer.words_with_offsets(tf.constant(["Good films!"]))
            >>> pieces.to_list(), starts.to_list(), ends.to_list()
            ([[[4], [5, 6], [7]]], [[0, 5, 10]], [[4, 10, 11]])
        """
        import tensorflow as tf

        ids, starts, ends = self.tokenize_with_offsets(texts)  # each (batch, (pieces))
        continuation = tf.constant([token.startswith("##") for token in self.vocabulary])
        flat_index = tf.range(tf.size(ids.values, out_type=tf.int64))
        first_of_text = tf.gather(ids.row_starts(), ids.value_rowids())
        is_first = ~tf.gather(continuation, ids.values) | (flat_index == first_of_text)
        word_starts = tf.where(is_first)[:, 0]  # (words in batch,) flat index of first piece
        words = tf.RaggedTensor.from_row_starts(ids.values, word_starts)
        per_text = tf.reduce_sum(ids.with_values(tf.cast(is_first, tf.int64)), axis=1)
        by_text = lambda values: tf.RaggedTensor.from_row_lengths(values, per_text)  # noqa: E731
        pieces = by_text(words)
        if max_pieces is not None:
            pieces = _clip_word_pieces(pieces, self.unk_id, max_pieces)
        return (
            pieces,
            by_text(tf.gather(starts.values, word_starts)),
            by_text(tf.gather(ends.values, words.row_limits() - 1)),
        )

    @traced_method
    def pack(self, segments: list, sequence_length: int):
        """Truncates (longest first) and packs 1 or 2 ragged segments with [CLS]/[SEP].

        Returns ragged `token_ids` and `segment_ids`, each (batch, (<= sequence_length)).
        """
        import tensorflow_text as tf_text

        budget = sequence_length - 1 - len(segments)
        trimmed = tf_text.RoundRobinTrimmer(max_seq_length=budget).trim(segments)
        return tf_text.combine_segments(
            trimmed, start_of_sequence_id=self.cls_id, end_of_segment_id=self.sep_id
        )

    def model_inputs(self, texts: list, sequence_length: int) -> dict:
        """1 or 2 string tensors (batch,) -> dense `token_ids`, `segment_ids`, `padding_mask`.

        The serving path of text and text-pair tasks, in TensorFlow ops.
        """
        import tensorflow as tf

        token_ids, segment_ids = self.pack([self.tokenize(t) for t in texts], sequence_length)
        return {
            "token_ids": token_ids.to_tensor(),
            "segment_ids": segment_ids.to_tensor(),
            "padding_mask": tf.ones_like(token_ids).to_tensor(),
        }

    # ---- eager helpers for featurization
    def encode(
        self, texts: list[str], pairs: list[str] | None = None, *, sequence_length: int
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Tokenizes and packs texts (and pairs) into unpadded int32 arrays, in chunks."""
        import tensorflow as tf

        token_ids, segment_ids = [], []
        pair_chunks = in_chunks(pairs) if pairs is not None else None
        for texts_chunk in in_chunks(texts):
            chunk = [self.tokenize(tf.constant(texts_chunk))]
            if pair_chunks is not None:
                chunk.append(self.tokenize(tf.constant(next(pair_chunks))))
            ids, segments = self.pack(chunk, sequence_length)
            token_ids += split_rows(ids)
            segment_ids += split_rows(segments)
        return token_ids, segment_ids

    # ---- persistence
    def save(self, directory) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "vocab.txt").write_text("\n".join(self.vocabulary) + "\n", encoding="utf-8")
        settings = {
            "lowercase": self.lowercase,
            "normalize_punctuation": self.normalize_punctuation,
        }
        (directory / "tokenizer.json").write_text(json.dumps(settings))

    @classmethod
    def load(cls, directory) -> WordPieceTokenizer:
        """The tokenizer `save` wrote; one saved before `normalize_punctuation` existed
        loads with it off, as it was trained."""
        directory = Path(directory)
        settings = json.loads((directory / "tokenizer.json").read_text())
        return cls(
            read_vocabulary(directory / "vocab.txt"),
            settings["lowercase"],
            settings.get("normalize_punctuation", False),
        )


def read_vocabulary(path) -> list[str]:
    """One word piece per line, as in BERT's vocab.txt (trailing newline optional)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError("vocabulary file not found", source=path) from None
    return [line.rstrip("\r") for line in text.rstrip("\n").split("\n")]


# ---- byte offsets (the tokenizer's) -> character offsets (Python's)
def character_offsets(text: str, byte_starts, byte_ends) -> tuple[np.ndarray, np.ndarray]:
    """Byte offsets into `text`'s UTF-8 (from the tokenizer) -> character offsets.

    A byte inside a character maps to that character.

    Example:
        >>> starts, ends = character_offsets("Renée ok", np.array([0, 7]), np.array([6, 9]))
        >>> starts.tolist(), ends.tolist()
        ([0, 6], [5, 8])
    """
    if text.isascii():
        return np.asarray(byte_starts), np.asarray(byte_ends)
    encoded = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    is_char_start = (encoded & 0xC0) != 0x80  # not a UTF-8 continuation byte
    char_of_byte = np.append(np.cumsum(is_char_start) - 1, len(text))
    return char_of_byte[byte_starts], char_of_byte[byte_ends]


def batch_substrings(texts, byte_starts, byte_ends):
    """Cuts texts between byte offsets: the substrings, their character starts and ends.

    TensorFlow ops, for SavedModels; `character_offsets` for offsets at
    character boundaries (as words' and answers' are).

    Args:
        texts: (n,) strings.
        byte_starts, byte_ends: (n,) offsets into the texts' UTF-8.

    Example:
        >>> import tensorflow as tf
        >>> texts, starts, ends = batch_substrings(
        ...     tf.constant(["Renée ok", "Zoë"]), tf.constant([7, 0]), tf.constant([9, 4]))
        >>> [t.decode() for t in texts.numpy()], starts.numpy().tolist(), ends.numpy().tolist()
        (['ok', 'Zoë'], [6, 0], [8, 3])
    """
    import tensorflow as tf

    substrings = tf.strings.substr(texts, byte_starts, byte_ends - byte_starts, unit="BYTE")
    before = tf.strings.substr(texts, tf.zeros_like(byte_starts), byte_starts, unit="BYTE")
    starts = tf.strings.length(before, unit="UTF8_CHAR")
    return substrings, starts, starts + tf.strings.length(substrings, unit="UTF8_CHAR")


def _clip_word_pieces(pieces, unk_id: int, max_pieces: int):
    """Gives each word of (batch, (words), (pieces)) 1 to `max_pieces` pieces: [UNK] if none."""
    import tensorflow as tf

    words = pieces.values  # (words, (pieces))
    unk = tf.fill(tf.stack([words.nrows(), 1]), tf.constant(unk_id, words.dtype))
    padded = tf.concat([words, tf.RaggedTensor.from_tensor(unk)], axis=1)
    keep = tf.clip_by_value(words.row_lengths(), 1, max_pieces)
    position = tf.ragged.range(padded.row_lengths())
    mask = position.with_values(position.values < tf.gather(keep, position.value_rowids()))
    return pieces.with_values(tf.ragged.boolean_mask(padded, mask))
