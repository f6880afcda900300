"""Tagging (named-entity recognition): one tag per word, entities with character offsets.

Preprocessing, `bertkit_tasks.tagging.preprocessor.TaggingPreprocessor`, in Python
for training and `predict` and in TensorFlow ops for the SavedModel: each word is
tokenized on its own and its tag goes on its first word piece (the others get
the label -100, which the loss ignores, unless `label_all_subtokens`); a long
sentence is read in windows of the words that fit whole in `sequence_length - 2`
pieces, every `window_stride` pieces, each word in the window where it has the
most context; a raw text's words are made by `task.text_words`
(`bertkit_tasks.tagging.text_words`): BERT's basic tokenization, or one word a
character, the rule saved with the model.

Span data (`data.format: spans`: raw texts with character spans,
`bertkit_tasks.tagging.spans`) is featurized from its text as `predict` featurizes
a text, its entities widened to whole words for training, and scored on gold
character spans (`bertkit_tasks.tagging.span_eval`).

With `head: crf` (`bertkit_tasks.tagging.crf`) a linear-chain CRF learns transition
scores between neighbouring words' tags: the loss is the sentence's negative
log-likelihood over its first pieces, and decoding adds the scores to Viterbi's.

Decoding, shared by evaluation, `predict` and the SavedModel
(`bertkit_tasks.tagging.decoding`): with `decoding: constrained` (the default) a
sentence's tags are its most probable tag sequence that is well-formed in the
model's scheme (Viterbi: no `I-PER` after `O` in iob2); with `argmax`, each
word's most probable tag, as transformers does. Entities are read from the tags
by `decode_chunks`, with conlleval's rules; an entity's score is the mean, over
its words, of the probability of the tag chosen for each word.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Literal

import numpy as np

from bertkit.errors import UserError
from bertkit.progress import say
from bertkit.task import DataFiles, Task, head_initializer, string_inputs
from bertkit_tasks.tagging import evaluation
from bertkit_tasks.tagging.class_weights import balanced_class_weights
from bertkit_tasks.tagging.conlleval import split_tag
from bertkit_tasks.tagging.preprocessor import IGNORED, TaggingPreprocessor
from bertkit_tasks.tagging.reading import (
    UntaggedInput,  # noqa: F401 (predict's examples, public here as before)
    parse_tagging_input,
    read_tagging_file,
)
from bertkit_tasks.tagging.schemes import allowed_transitions
from bertkit_tasks.tagging.spans import SpanSentence
from bertkit_tasks.tagging.text_words import (
    SpanAlignment,
    choose_text_words,
    scheme_tags,
    text_words_line,
    training_tags,
    word_tags,
)

Scheme = Literal["iob1", "iob2", "bioes"]


@dataclasses.dataclass(frozen=True)
class TaggingOptions:
    scheme: Scheme = dataclasses.field(
        default="iob2",
        metadata={"help": "the tag scheme the model predicts in; the data is converted to it"},
    )
    label_all_subtokens: bool = dataclasses.field(
        default=False,
        metadata={"help": "train every word piece on its word's tag, not only the first piece"},
    )
    window_stride: int | None = dataclasses.field(
        default=None,
        metadata={
            "min": 1,
            "help": "pieces between the starts of windows over long sentences; "
            "null: half of sequence_length - 2",
        },
    )
    dropout: float = dataclasses.field(
        default=0.1,
        metadata={
            "min": 0.0,
            "max": 0.9,
            "help": "dropout on the backbone's sequence output, before the head",
        },
    )
    decoding: Literal["constrained", "argmax"] = dataclasses.field(
        default="constrained",
        metadata={
            "help": "constrained: each sentence's most probable well-formed tag sequence "
            "(Viterbi); argmax: each word's most probable tag"
        },
    )
    class_weights: Literal["none", "balanced"] = dataclasses.field(
        default="none",
        metadata={
            "help": "balanced: weigh each word's loss by its tag's training frequency^-0.5, "
            "mean 1 (README: Small data)"
        },
    )
    label_smoothing: float = dataclasses.field(
        default=0.0,
        metadata={"min": 0.0, "max_exclusive": 1.0, "help": "target: (1 - s) one-hot + s / labels"},
    )
    head: Literal["softmax", "crf"] = dataclasses.field(
        default="softmax",
        metadata={
            "help": "softmax: each piece's tag from its own logits; crf: a linear-chain CRF, "
            "learned transition scores in the loss and in decoding (docs: CRF head)"
        },
    )
    crf_learning_rate: float | None = dataclasses.field(
        default=None,
        metadata={
            "min_exclusive": 0.0,
            "help": "head: crf: peak learning rate of the transition scores, on the same "
            "schedule; null: the head's (training.head_learning_rate or learning_rate)",
        },
    )
    text_words: Literal["auto", "bert", "characters"] = dataclasses.field(
        default="auto",
        metadata={
            "help": "how a raw text (predict, serve, span data) becomes words: bert: BERT's "
            "basic tokenization ('DOTA2' one word); characters: every non-whitespace "
            "character; auto: characters when every training word is one character, else bert"
        },
    )


@dataclasses.dataclass(frozen=True)
class TaggingData(DataFiles):
    format: Literal["auto", "conll", "jsonl", "spans"] = dataclasses.field(
        default="auto",
        metadata={
            "help": "conll (a word a line), jsonl ({'tokens', 'tags'}) or spans ({'text', "
            "'entities' or 'label'}: character spans, bertkit's, doccano's or CLUENER's form); "
            "auto: .jsonl/.json files by their first record, others conll"
        },
    )
    tag_column: int = dataclasses.field(
        default=-1,
        metadata={"help": "CoNLL column of the tag, 0-based; negative counts from the end"},
    )
    scheme: Scheme = dataclasses.field(
        default="iob2",
        metadata={"help": "the tag scheme of the files; evaluation reads tags with its semantics"},
    )
    overlapping_entities: Literal["longest", "error"] = dataclasses.field(
        default="longest",
        metadata={
            "help": "span data: error refuses overlapping (nested) entities, naming file and "
            "line; longest says how many, trains on the longest of each nest and scores all"
        },
    )


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
    int8_max_drop = 0.5  # points of entity F1
    sequence_outputs = ("logits",)
    packs = True  # a loss per labelled piece

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._preprocessor = TaggingPreprocessor(  # checks window_stride now, not mid-run
            self.tokenizer,
            self.sequence_length,
            self.options.window_stride,
            self.options.label_all_subtokens,
            self.text_words,
        )
        if self.options.head == "crf" and self.options.label_all_subtokens:
            raise UserError(
                "crf links each word's tag to the next word's (first pieces); "
                "label_all_subtokens would link a word's pieces: use one of them",
                key="task.head",
            )
        if self.options.head != "crf" and self.options.crf_learning_rate is not None:
            message = "only head: crf has transition scores; set head: crf or remove it"
            raise UserError(message, key="task.crf_learning_rate")

    @property
    def text_words(self) -> str:
        """The rule that makes a raw text's words: the one trained with (runs from before
        the option read texts with `bert`)."""
        if "text_words" in self.state or self.options.text_words == "auto":
            return self.state.get("text_words", "bert")
        return self.options.text_words

    @classmethod
    def cannot_pack(cls, options):
        if options is not None and options.head == "crf":
            return "with head: crf a packed row's sentences would be one CRF sequence"
        return super().cannot_pack(options)

    def preprocessor(self) -> TaggingPreprocessor:
        return self._preprocessor

    # ---- data
    def read(self, path):
        return read_tagging_file(path, self.data, self.options.scheme)

    def fit_state(self, train_examples):
        rule, why = choose_text_words(self.options.text_words, train_examples)
        say(text_words_line(rule, why))
        counts = Counter(tag for sentence in train_examples for tag in self._model_tags(sentence))
        types = {e.type for s in train_examples if isinstance(s, SpanSentence) for e in s.entities}
        counts.update({tag: 0 for tag in scheme_tags(types, self.options.scheme)})
        labels = sorted(counts, key=lambda tag: (tag != "O", split_tag(tag)[1], tag))
        state = {"labels": labels, "text_words": rule}
        if self.options.class_weights == "balanced":  # kept with the model: a resumed run's
            state["class_weights"] = balanced_class_weights(counts, labels)
        return state

    @property
    def labels(self) -> list[str]:
        return self.state["labels"]

    @property
    def allowed_transitions(self):
        """The label transitions decoding keeps to: None for argmax (see `choose_tags`)."""
        if self.options.decoding == "argmax":
            return None
        return allowed_transitions(self.labels, self.options.scheme)

    def _model_tags(self, sentence) -> list[str]:
        return training_tags(sentence, self.data.scheme, self.options.scheme)

    def featurize(self, examples, training):
        word_pieces = self._preprocessor.word_pieces(examples)
        label_ids = {label: i for i, label in enumerate(self.state.get("labels", []))}
        alignment, labels = SpanAlignment(), []
        for example, (_, _, chars) in zip(examples, word_pieces, strict=True):
            tags = word_tags(example, chars, self.data.scheme, self.options.scheme, alignment)
            # a tag unseen in training (evaluation data) is IGNORED; untagged inputs have none
            labels.append(None if tags is None else [label_ids.get(t, IGNORED) for t in tags])
        if training and alignment.line():
            say(alignment.line(self.text_words))
        return self._preprocessor.rows(word_pieces, labels)

    def make_batch(self, batch, training, rng):
        inputs = {key: batch[key] for key in ("token_ids", "segment_ids", "padding_mask")}
        # Weight 0 on ignored pieces; training normalizes the weights so that
        # the loss is the mean over labelled pieces, whatever the padding.
        labelled = (batch["labels"] != IGNORED).astype(np.float32)  # (batch, seq)
        targets = np.maximum(batch["labels"], 0)  # (batch, seq)
        if "class_weights" in self.state:  # `class_weights: balanced`, from the training tags
            labelled *= np.asarray(self.state["class_weights"], np.float32)[targets]
        if self.options.head == "crf":  # the CRF's sequence: the labelled pieces (`CrfLoss`)
            targets = batch["labels"]
        return inputs, targets, labelled

    # ---- model
    def build_model(self, backbone):
        import keras

        sequence = backbone.output["sequence_output"]  # (batch, seq, hidden)
        x = keras.layers.Dropout(self.options.dropout, name="tagger_dropout")(sequence)
        logits = keras.layers.Dense(  # (batch, seq, num_labels)
            len(self.labels), name="tagger", kernel_initializer=head_initializer()
        )(x)
        if self.options.head == "crf":  # holds the transition scores, passes logits through
            from bertkit_tasks.tagging.crf import TransitionScores

            self._crf = TransitionScores(len(self.labels), name="crf")
            logits = self._crf(logits)
        return keras.Model(backbone.input, logits, name="bert_tagger")

    def loss(self):
        from bertkit.losses import sparse_crossentropy
        from bertkit_tasks.tagging.crf import CrfLoss

        if self.options.head == "crf":
            return CrfLoss(self._crf)  # the transitions of the model `build_model` made
        return sparse_crossentropy(self.options.label_smoothing)

    def learning_rates(self, model):
        if self.options.head == "crf" and self.options.crf_learning_rate is not None:
            return [([model.get_layer("crf").transitions], self.options.crf_learning_rate)]
        return []

    def transitions(self, model=None):
        """The CRF head's learned transition scores, `[L + 1, L + 1]` numpy (those of
        `model`, else of the model `build_model` made last); None with head softmax."""
        if self.options.head != "crf":
            return None
        import keras
        import tensorflow as tf

        layer = self._crf if model is None else model.get_layer("crf")
        with tf.init_scope():  # eager, also while a SavedModel's graph is traced
            return keras.ops.convert_to_numpy(layer.transitions)

    def metrics(self):
        from bertkit.metrics.token_accuracy import LabelledTokenAccuracy

        return [LabelledTokenAccuracy()]

    # ---- outputs
    def decode(self, examples, features, outputs):
        import tensorflow as tf

        from bertkit_tasks.tagging import decoding as tag_decoding

        probabilities = tag_decoding.word_probabilities(
            outputs["logits"], features.extras["read_at"], len(self.labels)
        )
        batch = tag_decoding.sentence_batch(probabilities, len(self.labels))
        if self.options.head == "crf":  # an input of the traced call: training changes them
            batch = (batch, tf.constant(self.transitions(), tf.float32))
        chosen, chunks = self.tokenizer.traced_calls(  # named by all its graph depends on
            f"decode_tags({self.labels}, {self.options.decoding}, {self.options.scheme}, "
            f"{self.options.head})",
            self._decode_tags,
            batch,
        )
        tag_ids = [np.array(row, dtype=np.int64) for row in chosen.to_list()]
        return [
            self._prediction(*row)
            for row in zip(
                examples,
                features.extras["char_offsets"],
                tag_ids,
                probabilities,
                *(chunks[key].to_list() for key in ("types", "start_word", "end_word")),
                strict=True,
            )
        ]

    def _decode_tags(self, inputs):
        """`[batch, (words), labels]` probabilities (and with head crf the transitions)
        -> each word's label id and the chunks."""
        from bertkit_tasks.tagging import decoding as tag_decoding

        probabilities, transitions = inputs if isinstance(inputs, tuple) else (inputs, None)
        chosen = tag_decoding.choose_tags(probabilities, self.allowed_transitions, transitions)
        return chosen, tag_decoding.decode_chunks(chosen, *tag_decoding.chunk_tables(self.labels))

    def _prediction(self, example, chars, tag_ids, probabilities, types, starts, ends) -> dict:
        chosen = probabilities[np.arange(len(tag_ids)), tag_ids]  # (words,)
        entities = []
        for type_, start, end in zip(types, starts, ends, strict=True):
            entity = {
                "text": "",
                "type": type_.decode(),
                "start": start,
                "end": end,
                "score": float(chosen[start:end].mean()),
            }
            if chars is None:
                entity["text"] = " ".join(example.words[start:end])
            else:
                entity["start"], entity["end"] = int(chars[0][start]), int(chars[1][end - 1])
                entity["text"] = example.text[entity["start"] : entity["end"]]
            entities.append(entity)
        if chars is not None:
            return {"entities": entities}
        return {"tags": [self.labels[i] for i in tag_ids], "entities": entities}

    def evaluate(self, examples, predictions):
        return evaluation.tagging_metrics(examples, predictions, self.data.scheme)

    def baseline(self, examples):
        """Tagging every word O finds no entity: entity F1 0."""
        return 0.0, "all-O"

    def format_metrics(self, metrics):
        return evaluation.format_tagging_metrics(metrics)

    def report(self, examples, predictions, directory):
        return evaluation.tagging_report_section(examples, predictions, directory, self.data.scheme)

    def parse_input(self, value):
        return parse_tagging_input(value)

    # ---- export
    def serving_inputs(self):
        return string_inputs("text")

    def serve(self, model, inputs):
        """Raw texts -> entities, windowed and decoded in the graph as `featurize`/`decode` do."""
        import tensorflow as tf

        from bertkit_tasks.tagging.decoding import graph_entities

        rows = self._preprocessor.serve(inputs)
        token_ids = rows["token_ids"]  # (rows, (pieces))
        logits = model(
            {
                "token_ids": token_ids.to_tensor(self.tokenizer.pad_id),
                "segment_ids": rows["segment_ids"].to_tensor(),
                "padding_mask": tf.ones_like(token_ids).to_tensor(),
            },
            training=False,
        )
        word_logits = tf.gather_nd(logits, rows["read_at"].flat_values)  # (words, labels)
        return graph_entities(
            inputs["text"],
            rows["byte_starts"],
            rows["byte_ends"],
            word_logits,
            self.labels,
            self.allowed_transitions,
            self.transitions(model),  # a constant of the graph
        )

    def transformers_head(self):
        """`BertForTokenClassification`: the same Dense over each word piece; transformers'
        pipeline reads a word's tag at its first piece with `aggregation_strategy="first"`."""
        from bertkit.serving.transformers_export import TransformersHead

        window = self._preprocessor.window_size
        lost = [
            f"windows over sentences longer than {window} word pieces (stride "
            f"{self._preprocessor.stride}; transformers truncates them)"
        ]
        if self.options.decoding == "constrained":
            lost.insert(
                0,
                f"constrained {self.options.scheme} decoding (bertkit's most probable well-formed "
                "tag sequence; transformers takes each word's most probable tag)",
            )
        if self.options.head == "crf":
            lost.insert(
                0,
                "the CRF head's learned transition scores (transformers has no CRF head; "
                "its pipeline decodes the tagger's logits alone)",
            )
        if self.text_words == "characters":
            lost.append("one word a character in raw texts (transformers' pipeline reads words)")
        return TransformersHead(
            architecture="BertForTokenClassification",
            layer="tagger",
            module="classifier",
            labels=tuple(self.labels),
            pipeline="token-classification",
            call_options={"aggregation_strategy": "first"},
            settings={
                "scheme": self.options.scheme,
                "decoding": self.options.decoding,
                "window_stride": self._preprocessor.stride,
                "label_all_subtokens": self.options.label_all_subtokens,
                "head": self.options.head,
                "text_words": self.text_words,
            },
            not_represented=tuple(lost),
        )
