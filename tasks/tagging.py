"""Tagging (named-entity recognition): one tag per word, entities with character offsets.

Words and word pieces. Each word is tokenized on its own (`tokenize_words`);
its tag goes on its first word piece and its other pieces get the label -100,
which the loss ignores (with `label_all_subtokens`, every piece gets the
word's tag). The tag of a word is always read from its first piece. A word
without pieces (control characters) becomes `[UNK]`, so no word is lost.

Long sentences. With `W = sequence_length - 2` pieces per model input, windows
of W pieces start every `window_stride` pieces (default `W // 2`), as
`bertkit.windows.sliding_windows` cuts them; each window holds the words that
fit in it whole. A word is predicted by the window where it has the most
context, counted in words (`bertkit.windows.max_context_windows`). So that
every word fits whole in some window, a word keeps at most `W - stride + 1`
pieces (64 at sequence length 128): only its first piece carries its tag.

Raw text. Its words are the tokenizer's words, BERT's basic tokenization
(split at whitespace and around punctuation and CJK characters): runs of word
pieces that begin with a piece not starting with `##`. Their character offsets
come from the tokenizer's byte offsets. A list of words keeps its words.

Decoding, shared by evaluation, `predict` and the SavedModel: a word's tag is
the most probable label; entities are read from the tags by `decode_chunks`,
with conlleval's rules; an entity's score is the mean, over its words, of the
probability of the tag chosen for each word.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

import numpy as np

from bertkit.conll import read_conll, read_tagged_jsonl
from bertkit.conlleval import evaluate as conll_evaluate
from bertkit.conlleval import format_report, split_tag
from bertkit.errors import UserError
from bertkit.tag_schemes import chunks_to_tags, convert_tags
from bertkit.task import DataFiles, Features, Task
from bertkit.windows import max_context_windows, sliding_windows

IGNORED = -100  # label of the pieces the loss skips
Scheme = Literal["iob1", "iob2", "bioes"]
_CHUNK = 2048  # sentences per eager tokenizer call


@dataclasses.dataclass(frozen=True)
class TaggingOptions:
    scheme: Scheme = dataclasses.field(default="iob2", metadata={
        "help": "the tag scheme the model predicts in; the data is converted to it"})
    label_all_subtokens: bool = dataclasses.field(default=False, metadata={
        "help": "train every word piece on its word's tag, not only the first piece"})
    window_stride: int | None = dataclasses.field(default=None, metadata={
        "min": 1, "help": "pieces between the starts of windows over long sentences; "
                          "null: half of sequence_length - 2"})
    dropout: float = dataclasses.field(default=0.1, metadata={"min": 0.0, "max": 0.9})


@dataclasses.dataclass(frozen=True)
class TaggingData(DataFiles):
    format: Literal["auto", "conll", "jsonl"] = dataclasses.field(default="auto", metadata={
        "help": "conll (a word a line) or jsonl ({'tokens', 'tags'}); auto: .jsonl/.json "
                "files are jsonl, others conll"})
    tag_column: int = dataclasses.field(default=-1, metadata={
        "help": "CoNLL column of the tag, 0-based; negative counts from the end"})
    scheme: Scheme = dataclasses.field(default="iob2", metadata={
        "help": "the tag scheme of the files; evaluation reads tags with its semantics"})


@dataclasses.dataclass(frozen=True)
class UntaggedInput:
    """A prediction input: a raw text, or a list of words."""

    text: str | None = None
    words: tuple[str, ...] | None = None


class TaggingTask(Task):
    """Tags each word of a sentence (NER) from BERT's sequence output and finds the entities.

    A raw text gives `{"entities": [{"text", "type", "start", "end", "score"}]}`
    with character offsets, `text == input[start:end]`. A list of words gives
    `{"tags": [one tag per word], "entities": [...]}` with word indices (end
    exclusive) and `text` the entity's words joined by spaces. Metrics are
    conlleval's entity precision, recall and F1, overall and `per_type`.

    The SavedModel takes `text`, (batch,) strings, and returns `entity_text`,
    `entity_type`, `entity_start`, `entity_end` (characters) and `entity_score`,
    each (batch, most entities) padded with "", "", -1, -1 and 0, and
    `entity_count` (batch,): the entities `predict` gives for the same texts.
    """

    name = "tagging"
    description = "Word tagging and named-entity recognition (conlleval entity F1)."
    Options = TaggingOptions
    Data = TaggingData
    monitor = "f1"
    sequence_outputs = ("logits",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.window_size = self.sequence_length - 2  # pieces between [CLS] and [SEP]
        self.stride = self.options.window_stride or max(1, self.window_size // 2)
        if self.stride > self.window_size:
            raise UserError(f"must be at most sequence_length - 2 = {self.window_size}, "
                            f"got {self.stride}", key="task.window_stride")
        self.max_word_pieces = self.window_size - self.stride + 1

    # ---- data
    def read(self, path):
        jsonl = self.data.format == "jsonl" or (
            self.data.format == "auto" and str(path).endswith((".jsonl", ".json")))
        sentences = read_tagged_jsonl(path) if jsonl else read_conll(path, self.data.tag_column)
        for sentence in sentences:  # a tag outside the data's scheme fails here, not mid-run
            try:
                convert_tags(sentence.tags, self.data.scheme, self.options.scheme)
            except ValueError as error:  # "word 3: 'E-PER' does not belong to scheme iob2..."
                word = re.match(r"word (\d+):", str(error))
                line = sentence.line + (int(word[1]) - 1 if word and not jsonl else 0)
                raise UserError(f"{error} (data.scheme: {self.data.scheme})",
                                source=sentence.source, line=line) from None
        return sentences

    def fit_state(self, train_examples):
        tags = {tag for sentence in train_examples for tag in self._model_tags(sentence)}
        return {"labels": sorted(tags, key=lambda tag: (tag != "O", split_tag(tag)[1], tag))}

    @property
    def labels(self) -> list[str]:
        return self.state["labels"]

    def _model_tags(self, sentence) -> list[str]:
        return convert_tags(sentence.tags, self.data.scheme, self.options.scheme)

    def featurize(self, examples, training):
        label_ids = {label: i for i, label in enumerate(self.state.get("labels", []))}
        token_ids, labels, example_index, read_at, char_offsets = [], [], [], [], []
        for index, (example, (pieces, lengths, chars)) in enumerate(
                zip(examples, self._word_pieces(examples), strict=True)):
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # (words + 1,)
            windows = word_windows(offsets, self.window_size, self.stride)
            piece_labels = self._piece_labels(example, lengths, label_ids)
            first_row = len(token_ids)
            for first, end in windows:
                span = slice(offsets[first], offsets[end])
                token_ids.append(np.concatenate([[self.tokenizer.cls_id], pieces[span],
                                                 [self.tokenizer.sep_id]]).astype(np.int32))
                labels.append(np.concatenate([[IGNORED], piece_labels[span], [IGNORED]]))
                example_index.append(index)
            owner = np.array(max_context_windows(windows, len(lengths)), dtype=np.int64)
            window_start = offsets[np.array([windows[w][0] for w in owner], dtype=np.int64)]
            # where each word is read: the row of its owner window, the position of its 1st piece
            read_at.append((first_row + owner, 1 + offsets[:-1] - window_start))
            char_offsets.append(chars)
        columns = {"token_ids": token_ids, "segment_ids": [np.zeros_like(t) for t in token_ids],
                   "labels": labels}
        return Features(columns, np.array(example_index), pad_values={"labels": IGNORED},
                        extras={"read_at": read_at, "char_offsets": char_offsets})

    def _word_pieces(self, examples) -> list:
        """Per example: its pieces (flat), pieces per word, and words' character offsets."""
        import tensorflow as tf

        results = [None] * len(examples)
        texts = [i for i, e in enumerate(examples) if getattr(e, "text", None) is not None]
        worded = [i for i, e in enumerate(examples) if getattr(e, "text", None) is None]
        for start in range(0, len(worded), _CHUNK):
            chunk = worded[start:start + _CHUNK]
            words = tf.RaggedTensor.from_row_lengths(
                tf.constant([w for i in chunk for w in examples[i].words], tf.string),
                [len(examples[i].words) for i in chunk])
            pieces = fix_word_pieces(self.tokenizer.tokenize_words(words),
                                     self.tokenizer.unk_id, self.max_word_pieces)
            for i, (ids, lengths) in zip(chunk, _split_sentences(pieces), strict=True):
                results[i] = (ids, lengths, None)
        for start in range(0, len(texts), _CHUNK):
            chunk = texts[start:start + _CHUNK]
            pieces, byte_starts, byte_ends = text_words(
                self.tokenizer, tf.constant([examples[i].text for i in chunk]))
            pieces = fix_word_pieces(pieces, self.tokenizer.unk_id, self.max_word_pieces)
            for i, (ids, lengths), starts, ends in zip(
                    chunk, _split_sentences(pieces), byte_starts.to_list(), byte_ends.to_list(),
                    strict=True):
                char_start = np.cumsum([0] + [len(c.encode()) for c in examples[i].text])
                chars = np.searchsorted(char_start, [starts, ends]).reshape(2, -1)
                results[i] = (ids, lengths, chars)
        return results

    def _piece_labels(self, example, lengths, label_ids: dict) -> np.ndarray:
        """(pieces,) label ids: the word's tag on its first piece (or all), else IGNORED."""
        if not getattr(example, "tags", None):
            return np.full(int(lengths.sum()), IGNORED, dtype=np.int32)
        labels = []
        for tag, count in zip(self._model_tags(example), lengths, strict=True):
            label = label_ids.get(tag, IGNORED)  # a tag unseen in training (evaluation data)
            rest = label if self.options.label_all_subtokens else IGNORED
            labels += [label] + [rest] * (int(count) - 1)
        return np.array(labels, dtype=np.int32)

    def make_batch(self, batch, training, rng):
        inputs = {key: batch[key] for key in ("token_ids", "segment_ids", "padding_mask")}
        labelled = (batch["labels"] != IGNORED).astype(np.float32)  # (batch, seq)
        # Weights 0 on ignored pieces, scaled so that Keras' mean over all
        # positions is the mean over labelled pieces, whatever the padding.
        weights = labelled * (labelled.size / max(labelled.sum(), 1.0))
        return inputs, np.maximum(batch["labels"], 0), weights

    # ---- model
    def build_model(self, backbone):
        import keras

        sequence = backbone.output["sequence_output"]  # (batch, seq, hidden)
        x = keras.layers.Dropout(self.options.dropout, name="tagger_dropout")(sequence)
        logits = keras.layers.Dense(  # (batch, seq, num_labels)
            len(self.labels), name="tagger",
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=0.02))(x)
        return keras.Model(backbone.input, logits, name="bert_tagger")

    def loss(self):
        import keras

        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def metrics(self):
        import keras

        return [keras.metrics.SparseCategoricalAccuracy(name="token_accuracy")]

    # ---- outputs
    def decode(self, examples, features, outputs):
        import tensorflow as tf

        from bertkit.tag_decoding import decode_chunks

        rows, probabilities = outputs["logits"], []
        for word_rows, positions in features.extras["read_at"]:
            logits = np.array([rows[r][p] for r, p in zip(word_rows, positions, strict=True)],
                              dtype=np.float64).reshape(-1, len(self.labels))  # (words, labels)
            exp = np.exp(logits - logits.max(axis=1, keepdims=True))
            probabilities.append(exp / exp.sum(axis=1, keepdims=True))
        tag_ids = [p.argmax(axis=1) for p in probabilities]
        flat = np.concatenate([np.zeros(0, np.int32), *tag_ids]).astype(np.int32)
        chunks = decode_chunks(tf.RaggedTensor.from_row_lengths(flat, [len(t) for t in tag_ids]),
                               *self._chunk_tables)
        return [self._prediction(*row) for row in zip(
            examples, features.extras["char_offsets"], tag_ids, probabilities,
            *(chunks[key].to_list() for key in ("types", "start_word", "end_word")), strict=True)]

    def _prediction(self, example, chars, tag_ids, probabilities, types, starts, ends) -> dict:
        chosen = probabilities[np.arange(len(tag_ids)), tag_ids]  # (words,)
        entities = []
        for type_, start, end in zip(types, starts, ends, strict=True):
            entity = {"text": "", "type": type_.decode(), "start": start, "end": end,
                      "score": float(chosen[start:end].mean())}
            if chars is None:
                entity["text"] = " ".join(example.words[start:end])
            else:
                entity["start"], entity["end"] = int(chars[0][start]), int(chars[1][end - 1])
                entity["text"] = example.text[entity["start"]:entity["end"]]
            entities.append(entity)
        if chars is not None:
            return {"entities": entities}
        return {"tags": [self.labels[i] for i in tag_ids], "entities": entities}

    @property
    def _chunk_tables(self):
        from bertkit.tag_decoding import chunk_boundary_tables, chunk_type_table

        return (*chunk_boundary_tables(self.labels), chunk_type_table(self.labels))

    def evaluate(self, examples, predictions):
        predicted = [chunks_to_tags([(e["type"], e["start"], e["end"]) for e in p["entities"]],
                                    len(sentence.tags), self.data.scheme)
                     for sentence, p in zip(examples, predictions, strict=True)]
        result = conll_evaluate([list(sentence.tags) for sentence in examples], predicted)
        counts = {key: result.pop(key) for key in ("tokens", "found_gold", "found_predicted",
                                                    "correct")}
        return {**result, "counts": counts}

    def format_metrics(self, metrics):
        return format_report({**metrics, **metrics["counts"]})

    def parse_input(self, value):
        if isinstance(value, dict):
            value = value.get("text", value.get("words", value.get("tokens")))
        if isinstance(value, str):
            return UntaggedInput(text=value)
        if isinstance(value, (list, tuple)) and all(isinstance(w, str) and w for w in value):
            return UntaggedInput(words=tuple(value))
        raise UserError(f"expected a text, a list of words or an object with 'text' or "
                        f"'words', got {value!r:.80}")

    # ---- export
    def serving_inputs(self):
        import tensorflow as tf

        return {"text": tf.TensorSpec([None], tf.string, name="text")}

    def serve(self, model, inputs):
        """Raw texts -> entities, windowed and decoded in the graph as `featurize`/`decode` do."""
        import tensorflow as tf

        from bertkit.tag_decoding import decode_chunks

        texts = inputs["text"]
        pieces, byte_starts, byte_ends = text_words(self.tokenizer, texts)
        pieces = fix_word_pieces(pieces, self.tokenizer.unk_id, self.max_word_pieces)
        rows, row, position = windowed_rows(pieces, self.window_size, self.stride,
                                            self.tokenizer.cls_id, self.tokenizer.sep_id)
        token_ids = rows.to_tensor(self.tokenizer.pad_id)  # (rows, longest row)
        logits = model({"token_ids": token_ids, "segment_ids": tf.zeros_like(token_ids),
                        "padding_mask": tf.ones_like(rows).to_tensor()}, training=False)
        word_logits = tf.gather_nd(tf.cast(logits, tf.float32), tf.stack([row, position], 1))
        probabilities = tf.nn.softmax(word_logits)  # (words in batch, num_labels)
        tag_ids = byte_starts.with_values(tf.argmax(probabilities, -1, output_type=tf.int32))
        chunks = decode_chunks(tag_ids, *self._chunk_tables)  # each (batch, (entities))
        # flat word index of each entity's first and last word
        base = tf.gather(tag_ids.row_starts(), chunks["start_word"].value_rowids())
        first = base + tf.cast(chunks["start_word"].values, tf.int64)
        last = base + tf.cast(chunks["end_word"].values, tf.int64) - 1
        chosen = tf.reduce_max(probabilities, axis=-1)
        scores = tf.reduce_mean(tf.gather(chosen, tf.ragged.range(first, last + 1)), axis=1)
        starts = _char_offsets(texts, byte_starts).values
        ends = _char_offsets(texts, byte_ends).values
        start, end = tf.gather(starts, first), tf.gather(ends, last)
        entity_texts = tf.strings.substr(tf.gather(texts, chunks["start_word"].value_rowids()),
                                         start, end - start, unit="UTF8_CHAR")

        def dense(values, default):  # (entities in batch,) -> (batch, max entities)
            return chunks["types"].with_values(values).to_tensor(default)

        return {"entity_text": dense(entity_texts, ""),
                "entity_type": chunks["types"].to_tensor(""),
                "entity_start": dense(tf.cast(start, tf.int32), -1),
                "entity_end": dense(tf.cast(end, tf.int32), -1),
                "entity_score": dense(scores, 0.0),
                "entity_count": tf.cast(chunks["types"].row_lengths(), tf.int32)}


def word_windows(offsets: np.ndarray, window_size: int, stride: int) -> list[tuple[int, int]]:
    """`(first_word, end_word)` windows: the words that fit whole in each window of pieces.

    Args:
        offsets: (words + 1,) piece offset of each word, then the piece count.

    Example (piece windows (0, 4), (2, 6), (4, 7); the 3-piece word 2 fits only the second):
        >>> word_windows(np.array([0, 2, 3, 6, 7]), window_size=4, stride=2)
        [(0, 2), (1, 3), (3, 4)]
    """
    windows = sliding_windows(int(offsets[-1]), window_size, stride)
    return [(int(np.searchsorted(offsets[:-1], start, "left")),
             int(np.searchsorted(offsets[1:], end, "right"))) for start, end in windows]


def _split_sentences(pieces) -> list[tuple[np.ndarray, np.ndarray]]:
    """(batch, (words), (pieces)) ragged -> per sentence: flat piece ids, pieces per word."""
    ids = pieces.flat_values.numpy().astype(np.int32)
    lengths = pieces.values.row_lengths().numpy()
    word_splits, piece_splits = pieces.row_splits.numpy(), pieces.values.row_splits.numpy()
    return [(ids[piece_splits[a]:piece_splits[b]], lengths[a:b])
            for a, b in zip(word_splits[:-1], word_splits[1:], strict=True)]


# ---- TensorFlow ops shared by featurization and the SavedModel
def text_words(tokenizer, texts):
    """(batch,) strings -> word pieces (batch, (words), (pieces)), words' byte starts and ends."""
    import tensorflow as tf

    ids, starts, ends = tokenizer.tokenize_with_offsets(texts)  # each (batch, (pieces))
    continuation = tf.constant([token.startswith("##") for token in tokenizer.vocabulary])
    flat_index = tf.range(tf.size(ids.values, out_type=tf.int64))
    first_of_text = tf.gather(ids.row_starts(), ids.value_rowids())
    is_first = ~tf.gather(continuation, ids.values) | (flat_index == first_of_text)
    word_starts = tf.where(is_first)[:, 0]  # (words in batch,) flat index of first piece
    words = tf.RaggedTensor.from_row_starts(ids.values, word_starts)
    per_text = tf.reduce_sum(ids.with_values(tf.cast(is_first, tf.int64)), axis=1)
    by_text = lambda values: tf.RaggedTensor.from_row_lengths(values, per_text)  # noqa: E731
    return (by_text(words), by_text(tf.gather(starts.values, word_starts)),
            by_text(tf.gather(ends.values, words.row_limits() - 1)))


def fix_word_pieces(pieces, unk_id: int, max_pieces: int):
    """Gives each word of (batch, (words), (pieces)) 1 to `max_pieces` pieces: [UNK] if none."""
    import tensorflow as tf

    words = pieces.values  # (words, (pieces))
    unk = tf.fill(tf.stack([words.nrows(), 1]), tf.constant(unk_id, words.dtype))
    padded = tf.concat([words, tf.RaggedTensor.from_tensor(unk)], axis=1)
    keep = tf.clip_by_value(words.row_lengths(), 1, max_pieces)
    position = tf.ragged.range(padded.row_lengths())
    mask = position.with_values(position.values < tf.gather(keep, position.value_rowids()))
    return pieces.with_values(tf.ragged.boolean_mask(padded, mask))


def windowed_rows(pieces, window_size: int, stride: int, cls_id: int, sep_id: int):
    """The model rows of `word_windows` windows, in the graph, and where each word is read.

    Returns the rows `[CLS] pieces [SEP]`, (rows, (pieces)), and for each word in the batch
    (flat) the row and position of its first piece in its max-context window.
    """
    import tensorflow as tf

    lengths = tf.cast(pieces.row_lengths(axis=2), tf.int32).to_tensor()  # (batch, words)
    word_end = tf.cumsum(lengths, axis=1)
    word_start = word_end - lengths
    total = tf.reduce_sum(lengths, axis=1)  # (batch,)
    is_word = tf.sequence_mask(pieces.row_lengths(), tf.shape(lengths)[1])
    largest = tf.int32.max  # padding words: sorted last, in no window
    # piece windows as sliding_windows cuts them, then the words inside each
    count = tf.where(total > window_size, (total - window_size + stride - 1) // stride + 1, 1)
    window = tf.range(tf.reduce_max(count))[None, :]  # (1, windows)
    is_window = window < count[:, None]  # (batch, windows)
    piece_start = tf.broadcast_to(window * stride, tf.shape(is_window))
    piece_end = tf.minimum(piece_start + window_size, total[:, None])
    first = tf.searchsorted(tf.where(is_word, word_start, largest), piece_start, "left")
    end = tf.searchsorted(tf.where(is_word, word_end, largest), piece_end, "right")
    first, end = tf.where(is_window, first, 0), tf.where(is_window, end, 0)
    # max_context_windows: float64, as Python computes context_score; lowest index on ties
    word = tf.range(tf.shape(lengths)[1])[None, :, None]  # (1, words, 1)
    f, e = first[:, None, :], end[:, None, :]  # (batch, 1, windows)
    inside = (f <= word) & (word < e)
    score = (tf.cast(tf.minimum(word - f, e - 1 - word), tf.float64)
             + 0.01 * tf.cast(e - f, tf.float64))
    score = tf.where(inside, score, -np.inf)
    best = inside & (score == tf.reduce_max(score, axis=2, keepdims=True))
    owner = tf.reduce_min(tf.where(best, window[:, None, :], tf.int32.max), axis=2)
    owner = tf.where(is_word, owner, 0)  # (batch, words); padding words: any valid index
    # rows: [CLS] + the pieces of a window's words + [SEP]
    offsets = tf.concat([word_start, total[:, None]], axis=1)  # (batch, words + 1)
    sentence = pieces.merge_dims(1, 2)  # (batch, (pieces))
    base = tf.cast(sentence.row_starts(), tf.int32)[:, None]
    ranges = tf.ragged.range(tf.boolean_mask(base + tf.gather(offsets, first, batch_dims=1),
                                             is_window),
                             tf.boolean_mask(base + tf.gather(offsets, end, batch_dims=1),
                                             is_window))
    rows = tf.gather(sentence.values, ranges)  # (rows, (pieces))
    edge = tf.ones([rows.nrows(), 1], rows.dtype)
    rows = tf.concat([tf.RaggedTensor.from_tensor(edge * cls_id), rows,
                      tf.RaggedTensor.from_tensor(edge * sep_id)], axis=1)
    # each word's row and position in its owner window
    row_offset = tf.cumsum(count, exclusive=True)[:, None]
    window_start = tf.gather(offsets, tf.gather(first, owner, batch_dims=1), batch_dims=1)
    row = tf.boolean_mask(row_offset + owner, is_word)
    position = tf.boolean_mask(1 + word_start - window_start, is_word)
    return rows, row, position


def _char_offsets(texts, byte_offsets):
    """Byte offsets (batch, (n)) into `texts` -> character offsets."""
    import tensorflow as tf

    _, char_bytes = tf.strings.unicode_decode_with_offsets(texts, "UTF-8")  # (batch, (chars))
    dense = char_bytes.to_tensor(tf.int64.max)
    found = tf.searchsorted(dense, tf.cast(byte_offsets.to_tensor(), tf.int64), "left")
    return tf.RaggedTensor.from_tensor(found, lengths=byte_offsets.row_lengths())
