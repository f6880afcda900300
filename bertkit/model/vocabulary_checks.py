"""What a checkpoint's vocabulary says about how its text should be tokenized.

- `checked_lowercase`: a checkpoint whose settings say cased but whose vocabulary has no
  capital letters (the Hub's bert-base-chinese) is lowercased, with a line saying why:
  cased, every capitalised Latin word would be [UNK].
- `punctuation_equivalents`: characters the vocabulary lacks whose common equivalents it has
  (curly quotes, dashes, the ellipsis, full-width ASCII forms, Roman numerals), mapped before
  lookup by `bertkit.model.bert_normalizer.BertNormalizer` (`backbone.normalize_punctuation`).
- `UnknownPieces`: the share of [UNK] pieces in featurized rows, and a warning over 5% that
  names the most frequent unknown characters and the likely cause.
"""

from __future__ import annotations

import collections
import dataclasses
import unicodedata

from bertkit.progress import say

WARN_SHARE = 0.05  # [UNK] share of the training data's pieces over which `finetune` warns


def _equivalents() -> dict[str, str]:
    """Character -> its common ASCII equivalent, before BERT's normalization."""
    table = dict.fromkeys("‘’‚‛′", "'") | dict.fromkeys("“”„‟″", '"')
    table |= dict.fromkeys("–—―‐‑‒−", "-") | {"…": "...", "⋯": "..."}
    table |= {chr(code): chr(code - 0xFEE0) for code in range(0xFF01, 0xFF5F)}  # full width
    # Roman numerals (Ⅶ -> VII), as NFKC writes them; U+2180 on are not letters of A-Z
    table |= {chr(code): unicodedata.normalize("NFKC", chr(code)) for code in range(0x2160, 0x2180)}
    return table


EQUIVALENTS = _equivalents()


def punctuation_equivalents(vocabulary, lowercase: bool) -> dict[str, str]:
    """The mapping `backbone.normalize_punctuation` applies with this vocabulary.

    Keys and values are normalized text (BERT's normalization with `lowercase`): a
    character of `EQUIVALENTS` is mapped only when the vocabulary lacks it as a whole
    piece and has every character of its equivalent.

    Example:
        >>> vocabulary = ["[UNK]", "'", "-", "a", "b", "—"]
        >>> table = punctuation_equivalents(vocabulary, lowercase=True)
        >>> table["’"], table["ａ"], "—" in table, "…" in table  # "—" is a piece; no "."
        ("'", 'a', False, False)
    """
    from bertkit.model.bert_characters import normalize_character

    pieces = set(vocabulary)

    def normalized(text: str) -> str:
        return "".join(normalize_character(char, lowercase) for char in text)

    table = {}
    for char, equivalent in EQUIVALENTS.items():
        key, value = normalized(char), normalized(equivalent)
        if len(key) == 1 and key not in pieces and value and set(value) <= pieces:
            table[key] = value
    return table


def checked_lowercase(said: bool, vocabulary, setting: str, vocabulary_file: str) -> bool:
    """Whether to lowercase a checkpoint's text: what its settings say (`said`), but
    lowercased, with a line saying why, when they say cased and the vocabulary has no
    capital letters. `setting`: "FILE says KEY"; `vocabulary_file`: where the vocabulary is.

    Example:
        >>> checked_lowercase(False, ["[UNK]", "the", "北"],
        ...                   "tokenizer_config.json says do_lower_case", "vocab.txt")
        tokenizer_config.json says do_lower_case: false, but vocab.txt has no capital \
letters: lowercasing (backbone.lowercase: false keeps the text cased)
        True
    """
    if said or vocabulary_is_cased(vocabulary):
        return bool(said)
    say(
        f"{setting}: false, but {vocabulary_file} has no capital letters: lowercasing "
        "(backbone.lowercase: false keeps the text cased)"
    )
    return True


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


@dataclasses.dataclass(frozen=True)
class UnknownPieces:
    """How many of a data set's word pieces are [UNK] ([CLS], [SEP] and padding not counted).

    Example:
        >>> import numpy as np
        >>> rows = [np.array([2, 5, 1, 3]), np.array([2, 1, 1, 3, 6, 3])]
        >>> counted = UnknownPieces.count(rows, unk_id=1, special_ids=(0, 2, 3))
        >>> counted.unknown, counted.pieces, counted.line()
        (3, 5, "[UNK]: 60.0% of the training data's 5 word pieces")
    """

    unknown: int
    pieces: int

    @classmethod
    def count(cls, token_ids, unk_id: int, special_ids) -> UnknownPieces:
        """`token_ids`: 1-D arrays of ids, one per row (`Features.columns["token_ids"]`)."""
        import numpy as np

        if not len(token_ids):
            return cls(0, 0)
        ids = np.concatenate([np.asarray(row).reshape(-1) for row in token_ids])
        special = np.isin(ids, [i for i in special_ids if i != unk_id])
        return cls(int(np.count_nonzero(ids == unk_id)), int(ids.size - special.sum()))

    @property
    def share(self) -> float:
        return self.unknown / self.pieces if self.pieces else 0.0

    def line(self) -> str:
        return f"[UNK]: {self.share:.1%} of the training data's {self.pieces:,} word pieces"

    def record(self) -> dict:
        """What `run.json` keeps under `unknown_pieces`."""
        return {"unknown": self.unknown, "pieces": self.pieces, "share": round(self.share, 6)}


def unknown_warning(counted: UnknownPieces, unknown_words: collections.Counter) -> str | None:
    """The warning over `WARN_SHARE`: the most frequent unknown words (`unknown_words`;
    in Chinese text, characters) and the likely cause; None below it.

    Example:
        >>> words = collections.Counter({"北": 6, "京": 3, "ok": 1})
        >>> print(unknown_warning(UnknownPieces(40, 100), words))
        40.0% of the training data's word pieces are [UNK] (most often: 北 6, 京 3, ok 1): \
the vocabulary lacks most Chinese characters: use a Chinese checkpoint's vocabulary
    """
    if counted.share <= WARN_SHARE:
        return None
    common = ", ".join(f"{word} {n}" for word, n in unknown_words.most_common(8))
    cause = _likely_cause(unknown_words)
    return (
        f"{counted.share:.1%} of the training data's word pieces are [UNK]"
        + (f" (most often: {common})" if common else "")
        + (f": {cause}" if cause else "")
    )


def _likely_cause(unknown_words: collections.Counter) -> str | None:
    """The script most unknown words are written in, as advice; None when unclear."""
    scripts = collections.Counter()
    for word, n in unknown_words.items():
        scripts[_script(word)] += n
    if not scripts:
        return None
    script, n = scripts.most_common(1)[0]
    if n * 2 < sum(scripts.values()) or script is None:
        return None
    if script == "CAPITAL":
        return "the vocabulary has no capital letters: set backbone.lowercase: true"
    if script == "CJK":
        return "the vocabulary lacks most Chinese characters: use a Chinese checkpoint's vocabulary"
    return (
        f"the vocabulary lacks most {script.title()} characters: use a checkpoint whose "
        "vocabulary covers the language (a multilingual one)"
    )


def _script(word: str) -> str | None:
    """CJK, CAPITAL (an uppercase Latin letter) or the first word of the Unicode name of
    `word`'s first letter (LATIN, CYRILLIC, ARABIC...); None for no letter."""
    for char in word:
        if not char.isalpha():
            continue
        name = unicodedata.name(char, "")
        if name.startswith(("CJK ", "CJK")) or 0x3400 <= ord(char) <= 0x9FFF:
            return "CJK"
        if name.startswith("LATIN CAPITAL"):
            return "CAPITAL"
        return name.split(" ")[0] or None
    return None


# Fields of a task's examples that name or label it rather than hold its text.
_NOT_TEXT = {"id", "source", "line", "label", "labels", "tag", "tags", "answers", "answer_starts"}


def example_texts(examples, limit: int = 2000) -> list[str]:
    """The texts of up to `limit` examples: their string fields (a list of words joined by
    spaces), but those that name or label an example (`id`, `label`, `tags`, `answers`...).

    Example:
        >>> @dataclasses.dataclass
        ... class Pair:
        ...     text: str
        ...     words: tuple
        ...     label: str
        >>> example_texts([Pair("a film", ("so", "good"), "positive")])
        ['a film', 'so good']
    """
    texts = []
    for example in list(examples)[:limit]:
        if not dataclasses.is_dataclass(example):
            continue
        for field in dataclasses.fields(example):
            value = getattr(example, field.name)
            if field.name in _NOT_TEXT or not value:
                continue
            if isinstance(value, str):
                texts.append(value)
            elif isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
                texts.append(" ".join(value))
    return texts


def unknown_words(tokenizer, texts: list[str]) -> collections.Counter:
    """How often each piece of `texts` that `tokenizer` makes [UNK] occurs, by its text.

    Example:
        >>> from bertkit.model.tokenizer import WordPieceTokenizer
        >>> tokenizer = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a"], True)
        >>> unknown_words(tokenizer, ["a 北 京 北", "a"]).most_common()
        [('北', 2), ('京', 1)]
    """
    import tensorflow as tf

    from bertkit.model.token_rows import in_chunks

    counts = collections.Counter()
    for chunk in in_chunks(texts):
        ids, starts, ends = tokenizer.tokenize_with_offsets(tf.constant(chunk))
        rows = zip(chunk, ids.to_list(), starts.to_list(), ends.to_list(), strict=True)
        for text, row, row_starts, row_ends in rows:
            encoded = text.encode("utf-8")
            for piece, start, end in zip(row, row_starts, row_ends, strict=True):
                if piece == tokenizer.unk_id:
                    counts[encoded[start:end].decode("utf-8", errors="replace")] += 1
    return counts
