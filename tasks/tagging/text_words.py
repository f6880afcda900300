"""How a raw text becomes words (`task.text_words`), and span entities become word chunks.

A tagger tags words. A list of words keeps its words; a raw text is split by one rule,
the same at training (span-annotated data), evaluation, `predict`, `serve` and in the
SavedModel, because every path calls `text_word_pieces`:

- `bert`: BERT's basic tokenization (the tokenizer's `words_with_offsets`): split at
  whitespace and punctuation, one word a CJK character, a run of Latin letters or
  digits one word ("DOTA2").
- `characters`: every character (code point) is a word, except whitespace and the
  characters BERT's cleaning deletes (controls, format characters, U+FFFD).

`auto` picks `characters` for character-level training data (every training word one
character, as in Weibo NER's CoNLL files, where "DOTA2" is five lines), else `bert`;
span-annotated texts have no words of their own, so `auto` reads them with `bert`.
The rule chosen is part of the task's state, saved with the model.

An entity of span data whose start or end falls inside a word is widened to whole words
for training (`word_chunks`); evaluation keeps the gold character spans as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bertkit_tasks.tagging.schemes import chunks_to_tags, convert_tags
from bertkit_tasks.tagging.spans import SpanSentence

TEXT_WORDS = ("bert", "characters")
# RE2: whitespace (\s is ASCII only), and what BERT's `_clean_text` deletes
_NOT_A_WORD = r"[\s\p{Zs}\p{Cc}\p{Cf}\x{FFFD}]"


def text_word_pieces(tokenizer, texts, rule: str, max_pieces: int | None = None):
    """(batch,) strings -> their words' pieces and byte offsets, by `rule`, in TF ops.

    Returns:
        Pieces (batch, (words), (pieces)); byte starts and ends, each (batch, (words)).

    Example:
        >>> import tensorflow as tf
        >>> from bertkit.model.tokenizer import WordPieceTokenizer
        >>> tokenizer = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "d", "##2", "2",
        ...                                 "比"], lowercase=True)
        >>> texts = tf.constant(["D2 比"])
        >>> [t.to_list() for t in text_word_pieces(tokenizer, texts, "bert")]
        [[[[4, 5], [7]]], [[0, 3]], [[2, 6]]]
        >>> [t.to_list() for t in text_word_pieces(tokenizer, texts, "characters")]
        [[[[4], [6], [7]]], [[0, 1, 3]], [[1, 2, 6]]]
    """
    if rule == "bert":
        return tokenizer.words_with_offsets(texts, max_pieces=max_pieces)
    words, starts, ends = character_words(texts)
    return tokenizer.tokenize_words(words, max_pieces=max_pieces), starts, ends


def character_words(texts):
    """(batch,) strings -> each text's characters that are words, with byte starts and ends,
    each (batch, (words)).

    Example:
        >>> import tensorflow as tf
        >>> words, starts, ends = character_words(tf.constant(["Zoë 01:29\\u200b"]))
        >>> [w.decode() for w in words[0].numpy()], starts.to_list(), ends.to_list()
        (['Z', 'o', 'ë', '0', '1', ':', '2', '9'], [[0, 1, 2, 5, 6, 7, 8, 9]], \
[[1, 2, 4, 6, 7, 8, 9, 10]])
    """
    import tensorflow as tf

    characters, starts = tf.strings.unicode_split_with_offsets(
        texts, "UTF-8", errors="replace"
    )  # each (batch, (characters))
    lengths = tf.strings.length(characters.values, unit="BYTE")
    ends = starts + characters.with_values(tf.cast(lengths, starts.dtype))
    keep = characters.with_values(~tf.strings.regex_full_match(characters.values, _NOT_A_WORD))
    return tuple(tf.ragged.boolean_mask(values, keep) for values in (characters, starts, ends))


def choose_text_words(option: str, examples: list) -> tuple[str, str]:
    """(rule, why) for `task.text_words: option` and the training examples.

    Example:
        >>> from types import SimpleNamespace
        >>> choose_text_words("auto", [SimpleNamespace(words=("D", "2"), tags=("O", "O"))])
        ('characters', 'auto: every training word is one character')
        >>> choose_text_words("auto", [SimpleNamespace(words=("D2",), tags=("O",))])[0]
        'bert'
    """
    if option != "auto":
        return option, "task.text_words"
    if any(getattr(example, "text", None) is not None for example in examples):
        return "bert", "auto: the training data is raw text"
    if all(len(word) == 1 for example in examples for word in example.words):
        return "characters", "auto: every training word is one character"
    return "bert", "auto: training words are longer than one character"


def text_words_line(rule: str, why: str) -> str:
    """The line a run says about the rule."""
    how = {
        "bert": "BERT's basic tokenization",
        "characters": "one word a character (whitespace excluded)",
    }[rule]
    return f"raw texts are split into words by {how} (task.text_words: {rule}; {why})"


def scheme_tags(types, scheme: str) -> list[str]:
    """Every tag `scheme` writes for entities of `types`: what a model of span data can
    predict, whatever words its entities turn out to cover.

    Example:
        >>> scheme_tags({"PER"}, "iob2"), scheme_tags({"PER"}, "bioes")
        (['O', 'B-PER', 'I-PER'], ['O', 'B-PER', 'I-PER', 'E-PER', 'S-PER'])
    """
    prefixes = ("B", "I", "E", "S") if scheme == "bioes" else ("B", "I")
    return ["O"] + [f"{prefix}-{type_}" for type_ in sorted(types) for prefix in prefixes]


def character_tags(sentence, scheme: str) -> list[str]:
    """A span sentence's tags with one word a non-whitespace character: its tags under
    `characters`, and how fit_state counts span data's tags for class weights.

    Example:
        >>> from bertkit_tasks.tagging.spans import SpanEntity, SpanSentence
        >>> character_tags(SpanSentence("Ann 2", (SpanEntity("PER", 0, 3),), "x", 1), "iob2")
        ['B-PER', 'I-PER', 'I-PER', 'O']
    """
    positions = np.array([i for i, char in enumerate(sentence.text) if not char.isspace()])
    chunks = word_chunks(sentence, positions, positions + 1, SpanAlignment())
    return chunks_to_tags(chunks, len(positions), scheme)


# ---------------------------------------------------------------- span entities -> word chunks
@dataclass
class SpanAlignment:
    """What `word_chunks` did to the entities of many texts, for the one line a run says."""

    entities: int = 0
    widened: list = field(default_factory=list)  # (sentence, entity)
    dropped: list = field(default_factory=list)  # (sentence, entity)

    def line(self, rule: str = "bert") -> str | None:
        """The line on widened and dropped entities, or None when every entity fits words;
        under `bert` it says what keeps them as written.

        Example:
            >>> from bertkit_tasks.tagging.spans import SpanEntity, SpanSentence
            >>> sentence = SpanSentence("DOTA2 ok", (SpanEntity("GAME", 0, 4),), "train.json", 17)
            >>> alignment = SpanAlignment(23971, [(sentence, sentence.entities[0])] * 3)
            >>> print(alignment.line())
            3 of 23,971 entities do not start and end at word boundaries; trained on whole \
words; first: train.json:17 'DOTA'; task.text_words: characters trains them as written
        """
        parts = []
        if self.widened:
            parts.append(
                f"{len(self.widened):,} of {self.entities:,} entities do not start and end at "
                f"word boundaries; trained on whole words; first: {_where(*self.widened[0])}"
                + ("; task.text_words: characters trains them as written" if rule == "bert" else "")
            )
        if self.dropped:
            parts.append(
                f"{len(self.dropped):,} of {self.entities:,} entities cover no word or share "
                f"a word with a longer entity; not trained on; first: {_where(*self.dropped[0])}"
            )
        return "; ".join(parts) or None


def _where(sentence, entity) -> str:
    return f"{sentence.source}:{sentence.line} {sentence.text[entity.start : entity.end]!r}"


def word_chunks(sentence, word_starts, word_ends, alignment: SpanAlignment) -> list[tuple]:
    """A span sentence's entities as word chunks `(type, first word, end word)`, in order.

    An entity covers the words it shares a character with; longer entities are placed
    first, and one that covers no word, or a word already taken, is dropped. Widened and
    dropped entities are added to `alignment`.

    Args:
        sentence: a `SpanSentence`.
        word_starts, word_ends: (words,) character offsets of the text's words.
        alignment: counts for the run's line.

    Example:
        >>> from bertkit_tasks.tagging.spans import SpanEntity, SpanSentence
        >>> entities = (SpanEntity("GAME", 0, 4), SpanEntity("EVENT", 0, 8))
        >>> sentence = SpanSentence("DOTA2 ok", entities, "train.json", 1)
        >>> word_chunks(sentence, np.array([0, 6]), np.array([5, 8]), SpanAlignment())
        [('EVENT', 0, 2)]
    """
    taken = np.zeros(len(word_starts), dtype=bool)
    chunks = []
    for entity in sorted(sentence.entities, key=lambda e: (e.start - e.end, e.start)):
        alignment.entities += 1
        first = int(np.searchsorted(word_ends, entity.start, side="right"))
        end = int(np.searchsorted(word_starts, entity.end, side="left"))
        if first >= end or taken[first:end].any():
            alignment.dropped.append((sentence, entity))
            continue
        taken[first:end] = True
        chunks.append((entity.type, first, end))
        if word_starts[first] != entity.start or word_ends[end - 1] != entity.end:
            alignment.widened.append((sentence, entity))
    return sorted(chunks, key=lambda chunk: chunk[1])


def word_tags(example, chars, data_scheme: str, model_scheme: str, alignment: SpanAlignment):
    """An example's words' tags in the model's scheme, or None for an untagged input.

    A span sentence's words are its text's (`chars`: their (2, words) character
    offsets, as `predict` makes them); a tagged word list's are its own.
    """
    if isinstance(example, SpanSentence):
        chunks = word_chunks(example, chars[0], chars[1], alignment)
        return chunks_to_tags(chunks, chars.shape[1], model_scheme)
    if getattr(example, "tags", None):
        return convert_tags(example.tags, data_scheme, model_scheme)
    return None


def training_tags(sentence, data_scheme: str, model_scheme: str) -> list[str]:
    """A training sentence's tags, as `fit_state` counts them: a span sentence's with one
    word a character (exact under `characters`; under `bert` an estimate for class
    weights, the label set holding every tag of the scheme anyway)."""
    if isinstance(sentence, SpanSentence):
        return character_tags(sentence, model_scheme)
    return convert_tags(sentence.tags, data_scheme, model_scheme)
