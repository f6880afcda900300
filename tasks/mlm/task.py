"""Masked-LM (+ next-sentence prediction) continued pretraining, and fill-mask prediction.

Adapts a backbone to a domain's text as BERT was pretrained: segment pairs
`[CLS] A [SEP] B [SEP]` cut from a corpus once (seeded, `create_instances`),
tokens masked anew in every training batch (`mask_tokens`, 80/10/10), a
masked-LM head tied to the token embeddings plus a next-sentence head. The
adapted backbone is saved as a keras-hub preset that any recipe can use.
"""

from __future__ import annotations

import dataclasses
from functools import cached_property
from pathlib import Path
from typing import Literal

import numpy as np

from bertkit.errors import UserError
from bertkit.files import input_text
from bertkit.model.token_rows import split_rows, tokenize_in_chunks
from bertkit.progress import say
from bertkit.task import DataFiles, Features, Task, head_initializer, string_inputs
from bertkit_tasks.mlm.fill_mask import encode_queries, mask_positions
from bertkit_tasks.mlm.masking import (
    default_max_predictions,
    mask_tokens,
    masked_lm_scores,
    top_predictions,
)
from bertkit_tasks.mlm.pretraining_corpus import (
    corpus_format,
    create_instances,
    pack_instance,
    read_corpus,
)
from bertkit_tasks.mlm.pretraining_heads import pretraining_head_weights
from bertkit_tasks.mlm.word_segments import number_tokens, split_instance
from bertkit_tasks.mlm.word_units import WordUnits, document_references, word_reference_path

_field = dataclasses.field


@dataclasses.dataclass(frozen=True)
class MaskedLMOptions:
    next_sentence_prediction: bool = _field(
        default=True, metadata={"help": "train on A/B pairs with a next-sentence head as well"}
    )
    short_seq_prob: float = _field(
        default=0.1,
        metadata={"min": 0.0, "max": 1.0, "help": "share of documents cut into shorter instances"},
    )
    mask_rate: float = _field(
        default=0.15,
        metadata={
            "min_exclusive": 0.0,
            "max": 1.0,
            "help": "share of each row's tokens chosen to predict (most replaced by [MASK])",
        },
    )
    whole_word_masking: bool | Literal["jieba", "reference"] = _field(
        default=False,
        metadata={
            "help": "what a masked unit is: false, a piece; true, a word: a piece with its "
            "## continuations; jieba, also a Chinese word segmented by jieba (pip install "
            "'bertkit[zh]'); reference, also a Chinese word of data.train_word_reference"
        },
    )
    max_predictions: int | None = _field(
        default=None,
        metadata={
            "min": 1,
            "help": "masked tokens per row at most; null: sequence_length x mask_rate",
        },
    )
    validation_fraction: float = _field(
        default=0.05,
        metadata={
            "min": 0.0,
            "max": 0.5,
            "help": "share of training documents held out as validation "
            "data when data.validation is not given",
        },
    )
    seed: int = _field(
        default=0,
        metadata={
            "min": 0,
            "max": 2**32 - 1,  # as training.seed: what NumPy's seeds take
            "help": "seeds instances, the validation split and evaluation masks",
        },
    )
    top_k: int = _field(default=5, metadata={"min": 1, "help": "predictions per [MASK]"})


@dataclasses.dataclass(frozen=True)
class CorpusData(DataFiles):
    format: Literal["auto", "text", "jsonl"] = _field(
        default="auto",
        metadata={
            "help": "text: a sentence per line, blank line between documents; jsonl: "
            '{"text": ...} per line; auto: jsonl for .jsonl/.json files'
        },
    )
    train_word_reference: str | None = _field(
        default=None,
        metadata={
            "path": True,
            "help": "for task.whole_word_masking: reference: per sentence of data.train, a "
            "JSON list of the positions of tokens that continue a word, [CLS] at 0 "
            "(transformers' run_mlm_wwm.py --train_ref_file)",
        },
    )
    validation_word_reference: str | None = _field(
        default=None,
        metadata={
            "path": True,
            "help": "the same for data.validation; without it, its words are pieces with "
            "their ## continuations",
        },
    )


@dataclasses.dataclass(frozen=True)
class Document:
    sentences: tuple[str, ...]
    source: str | None = None
    # whole_word_masking: reference: per sentence, (its reference line, continuing positions)
    word_reference: tuple[tuple[int, tuple[int, ...]], ...] | None = None
    reference_source: str | None = None


@dataclasses.dataclass(frozen=True)
class FillMaskQuery:
    text: str  # with [MASK] markers; "first [SEP] second" for a pair


class MaskedLMTask(Task):
    """Masked-LM and next-sentence pretraining on a corpus; fill-mask prediction.

    Predictions (for texts with `[MASK]`, or `[text, text_pair]` pairs) are
    `{"masks": [[{"token": str, "score": float}, ...top_k], ...one list per [MASK]]}`.
    The exported signature takes `text` (a pair written `first [SEP] second`)
    and returns `tokens` and `scores` `(batch, masks, top_k)`, padded with ""
    and 0, and `num_masks` `(batch,)`. A `[MASK]` cut off by truncation to
    `sequence_length` gets no prediction.

    Evaluation (a corpus file, masked once with a fixed seed so epochs compare)
    reports perplexity (exp of the mean loss per masked token), `mlm_loss`,
    `masked_accuracy` and `nsp_accuracy`; for it `decode` returns one record per
    instance, `{"masked_tokens", "correct", "loss", "next_sentence_correct"}`,
    since an instance may join two documents. Without `data.validation`, a
    seeded `validation_fraction` of the training documents is the validation
    data, evaluated every epoch. The adapted backbone is saved in
    `<run>/backbone`, a preset for any recipe.
    """

    name = "mlm"
    description = "Masked-LM (+ next sentence) continued pretraining; fill-mask predictions."
    Options = MaskedLMOptions
    Data = CorpusData
    Example = Document
    monitor = "perplexity"
    mode = "min"
    # No `int8_max_drop`: an MLM run's product is a backbone to fine-tune further, which
    # int8 weights cannot be, so `bertkit export --quantize int8` refuses it.

    # ---- data
    def read(self, path):
        reference = word_reference_path(self.options.whole_word_masking, self.data, path)
        documents = read_corpus(path, corpus_format(path, self.data.format))
        references = document_references(reference, documents, path)
        return [
            Document(tuple(sentences), str(path), lines, reference)
            for sentences, lines in zip(documents, references, strict=True)
        ]

    def split_validation(self, documents):
        """(training, validation) documents: a seeded `validation_fraction` of them, if >= 2."""
        count = round(len(documents) * self.options.validation_fraction)
        if count < 2 or len(documents) - count < 2:  # next-sentence pairs need 2 documents
            return documents, None
        held = set(
            np.random.default_rng([self.options.seed, 2])
            .choice(len(documents), count, replace=False)
            .tolist()
        )
        return (
            [d for i, d in enumerate(documents) if i not in held],
            [d for i, d in enumerate(documents) if i in held],
        )

    def featurize(self, examples, training):
        if "[MASK]" not in self.tokenizer.vocabulary:
            raise UserError("the backbone's vocabulary has no [MASK] token")
        if examples and isinstance(examples[0], FillMaskQuery):
            return self._featurize_queries(examples)
        rng = np.random.default_rng([self.options.seed, int(training)])
        instances, starts = self._instances(examples, rng)
        packed = [pack_instance(i, self.tokenizer.cls_id, self.tokenizer.sep_id) for i in instances]
        columns = {
            "token_ids": [ids for ids, _ in packed],
            "segment_ids": [segments for _, segments in packed],
            "next_sentence": np.array([i.is_random_next for i in instances], np.int32),
        }
        if starts is not None:  # segmented words: (row,) int8, 1 where a word starts
            columns["word_starts"] = [pack_instance(s, 1, 1)[0].astype(np.int8) for s in starts]
        if training and self.options.whole_word_masking:
            self._say_masked_units(columns)
        if not training:  # masked once, with a fixed seed: every evaluation sees the same
            columns.update(self._evaluation_masks(columns, rng))
            columns.pop("word_starts", None)
        # An instance may join two documents, so rows belong to no single example.
        return Features(columns, example_index=np.full(len(instances), -1))

    def _instances(self, documents, rng):
        """The instances, and with segmented words their word starts as instances too."""
        sentences = [sentence for document in documents for sentence in document.sentences]
        rows = [ids for (ids,) in tokenize_in_chunks(self.tokenizer.tokenize, sentences)]
        pieces = iter(ids.tolist() for ids in rows)
        tokenized = [[next(pieces) for _ in document.sentences] for document in documents]
        source, options = documents[0].source if documents else None, self.options
        if options.next_sentence_prediction and len(documents) < 2:
            raise UserError(
                "next-sentence prediction needs at least 2 documents (a blank line "
                "ends one); or set next_sentence_prediction: false",
                source=source,
            )
        segmented = self._units.segmented
        # create_instances only counts and slices: on token numbers, it cuts any column alike
        instances = create_instances(
            number_tokens(tokenized) if segmented else tokenized,
            self.sequence_length,
            options.short_seq_prob,
            options.next_sentence_prediction,
            rng=rng,
        )
        if not instances:
            raise UserError("the corpus holds no text", source=source)
        if not segmented:
            return instances, None
        columns = [
            np.concatenate(rows),
            np.concatenate(self._units.sentence_word_starts(documents, rows)),
        ]
        return tuple(map(list, zip(*(split_instance(i, columns) for i in instances), strict=True)))

    def _mask(self, token_ids, padding_mask, rng, word_starts=None) -> dict:
        """`mask_tokens` on a padded batch; unused prediction slots get the target -1.
        `word_starts`: the featurized column of segmented words, else read off the pieces."""
        special = (
            (padding_mask == 0)
            | (token_ids == self.tokenizer.cls_id)
            | (token_ids == self.tokenizer.sep_id)
        )
        starts = self._units.starts(token_ids, word_starts)
        masked = mask_tokens(
            token_ids,
            special,
            self.tokenizer.mask_id,
            self.tokenizer.vocabulary_size,
            rng,
            mask_rate=self.options.mask_rate,
            word_starts=starts,
            max_predictions=self.options.max_predictions
            or default_max_predictions(self.sequence_length, self.options.mask_rate),
        )
        used = masked["mask_weights"] > 0
        masked["mask_ids"] = np.where(used, masked["mask_ids"], -1).astype(np.int32)
        return masked

    @cached_property
    def _units(self) -> WordUnits:
        return WordUnits(self.options.whole_word_masking, self.tokenizer.vocabulary)

    def _padded(self, columns: dict, rows: int | None = None):
        """`(token_ids, padding_mask, word_starts or None)` of the first `rows` rows, padded
        to `sequence_length`."""
        token_ids = columns["token_ids"][:rows]
        lengths = np.array([len(ids) for ids in token_ids])
        padding_mask = np.arange(self.sequence_length)[None, :] < lengths[:, None]
        padded = [np.zeros(padding_mask.shape, np.int32), None]
        padded[0][padding_mask] = np.concatenate(token_ids)
        if "word_starts" in columns:
            padded[1] = np.zeros(padding_mask.shape, bool)
            padded[1][padding_mask] = np.concatenate(columns["word_starts"][:rows])
        return padded[0], padding_mask, padded[1]

    def _say_masked_units(self, columns, rows: int = 2000) -> None:
        """The measure of whole-word masking in one line, on one seeded masking of the first
        `rows` training rows (a line of the run's output, not a metric: masks change)."""
        token_ids, padding_mask, word_starts = self._padded(columns, rows)
        rng = np.random.default_rng([self.options.seed, 3])
        masked = self._mask(token_ids, padding_mask, rng, word_starts)
        summary = self._units.summary(token_ids, masked, word_starts)
        say(f"{summary} (one masking of {len(token_ids)} training rows)")

    def _evaluation_masks(self, columns: dict, rng) -> dict:
        padded, padding_mask, word_starts = self._padded(columns)
        lengths = padding_mask.sum(axis=1)
        masked = self._mask(padded, padding_mask, rng, word_starts)
        return {
            "token_ids": [row[:n] for row, n in zip(masked["token_ids"], lengths, strict=True)],
            "mask_positions": masked["mask_positions"],
            "mask_ids": masked["mask_ids"],
        }

    def _featurize_queries(self, queries):
        import tensorflow as tf

        token_ids, segment_ids = encode_queries(
            self.tokenizer, tf.constant([q.text for q in queries]), self.sequence_length
        )
        positions = mask_positions(token_ids, self.tokenizer.mask_id)  # (batch, (masks))
        width = max(1, int(tf.reduce_max(positions.row_lengths())))  # the model needs a slot
        return Features(
            {
                "token_ids": split_rows(token_ids),
                "segment_ids": split_rows(segment_ids),
                "mask_positions": positions.to_tensor(shape=[None, width]).numpy(),
                "num_masks": positions.row_lengths().numpy(),
            },
            example_index=np.arange(len(queries)),
        )

    def make_batch(self, batch, training, rng):
        if is_fill_mask(batch):  # queries: their own masks, nothing to learn
            return (
                {
                    key: batch[key]
                    for key in ("token_ids", "segment_ids", "padding_mask", "mask_positions")
                },
                None,
                None,
            )
        masked = (
            self._mask(batch["token_ids"], batch["padding_mask"], rng, batch.get("word_starts"))
            if training
            else batch
        )
        inputs = {
            "token_ids": masked["token_ids"],
            "segment_ids": batch["segment_ids"],
            "padding_mask": batch["padding_mask"],
            "mask_positions": masked["mask_positions"],
        }
        # Weight 0 on unused prediction slots (target -1): training normalizes the
        # weights, so the loss is the mean over masked tokens however a batch is split.
        targets = {"mlm": np.maximum(masked["mask_ids"], 0)}
        weights = {"mlm": (masked["mask_ids"] >= 0).astype(np.float32)}
        if self.options.next_sentence_prediction:
            targets["nsp"] = batch["next_sentence"]
            weights["nsp"] = np.ones(len(batch["next_sentence"]), np.float32)
        return inputs, targets, weights

    # ---- model
    def build_model(self, backbone):
        import keras
        import keras_hub

        mask_positions = keras.Input(shape=(None,), dtype="int32", name="mask_positions")
        initializer = head_initializer()
        mlm_head = keras_hub.layers.MaskedLMHead(
            token_embedding=backbone.token_embedding,  # tied output projection
            intermediate_activation=backbone.transformer_layers[0].activation,  # its GELU
            layer_norm_epsilon=1e-12,
            kernel_initializer=initializer,
            dtype=backbone.dtype_policy,
            name="mlm_head",
        )
        # (batch, predictions, vocabulary)
        outputs = {"mlm": mlm_head(backbone.output["sequence_output"], mask_positions)}
        if self.options.next_sentence_prediction:  # (batch, 2); class 1: B is random
            outputs["nsp"] = keras.layers.Dense(2, kernel_initializer=initializer, name="nsp_head")(
                backbone.output["pooled_output"]
            )
        return keras.Model(
            {**backbone.input, "mask_positions": mask_positions}, outputs, name="bert_pretraining"
        )

    def initialize_head(self, model, checkpoint_tensors):
        variables = {variable.path: variable for variable in model.weights}
        for path, value in pretraining_head_weights(checkpoint_tensors).items():
            variable = variables.get(path)  # no nsp_head without next-sentence prediction
            if variable is not None and tuple(variable.shape) != value.shape:
                raise UserError(
                    f"the checkpoint's pretraining head has shape {value.shape} "
                    f"for {path}, the model needs {tuple(variable.shape)}"
                )
            if variable is not None:
                variable.assign(value)

    def loss(self):
        import keras

        losses = {"mlm": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}
        if self.options.next_sentence_prediction:
            losses["nsp"] = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        return losses

    def metrics(self):
        import keras

        from bertkit.metrics.token_accuracy import LabelledTokenAccuracy

        # shown as mlm_accuracy, nsp_accuracy; unused mask slots have the weight 0
        metrics = {"mlm": [LabelledTokenAccuracy(name="accuracy")]}
        if self.options.next_sentence_prediction:
            metrics["nsp"] = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
        return metrics

    # ---- outputs
    def reduce_outputs(self, batch, outputs):
        """Per-row scores or top-k tokens: (rows, slots, vocabulary) logits are never kept."""
        if is_fill_mask(batch):  # slots past num_masks are cut in decode
            ids, probabilities = top_predictions(outputs["mlm"], self.options.top_k)
            return {"top_ids": ids, "top_probabilities": probabilities}  # (batch, masks, top_k)
        reduced = masked_lm_scores(outputs["mlm"], batch["mask_ids"])  # (batch,) each
        if "nsp" in outputs:
            reduced["next_sentence_correct"] = outputs["nsp"].argmax(-1) == batch["next_sentence"]
        return reduced

    def decode(self, examples, features, outputs):
        if is_fill_mask(features.columns):
            return [
                self._fill_mask(ids[:count], probabilities[:count])
                for ids, probabilities, count in zip(
                    outputs["top_ids"],
                    outputs["top_probabilities"],
                    features.columns["num_masks"],
                    strict=True,
                )
            ]
        return [
            {name: values[row].item() for name, values in outputs.items()}
            for row in range(len(features))
        ]

    def _fill_mask(self, ids, probabilities) -> dict:
        return {
            "masks": [
                [
                    {"token": self.tokenizer.vocabulary[i], "score": float(p)}
                    for i, p in zip(top, scores, strict=True)
                ]
                for top, scores in zip(ids, probabilities, strict=True)
            ]
        }

    def evaluate(self, examples, predictions):
        count = max(1, sum(p["masked_tokens"] for p in predictions))
        loss = sum(p["loss"] for p in predictions) / count
        metrics = {
            "perplexity": float(np.exp(loss)),
            "mlm_loss": loss,
            "masked_accuracy": sum(p["correct"] for p in predictions) / count,
        }
        if self.options.next_sentence_prediction:
            metrics["nsp_accuracy"] = float(
                np.mean([p["next_sentence_correct"] for p in predictions])
            )
        return metrics

    def parse_input(self, value):
        if isinstance(value, dict) and isinstance(value.get("text"), str):
            pair = value.get("text_pair")
            value = value["text"] if pair is None else [value["text"], pair]
        if isinstance(value, (list, tuple)) and len(value) == 2:
            value = f"{input_text(value[0], 'text')} [SEP] {input_text(value[1], 'text_pair')}"
        if isinstance(value, str) and "[MASK]" in value:
            return FillMaskQuery(value)
        raise UserError(
            f"expected a text with [MASK], a [text, text_pair] pair or an object "
            f"with 'text' (and 'text_pair'), got {value!r:.80}"
        )

    def write_artifacts(self, backbone, directory):
        """Saves the adapted backbone as a keras-hub preset, `<run>/backbone`."""
        from bertkit.model.backbone import gelu_exact, save_preset

        exact = backbone.transformer_layers[0].activation is gelu_exact
        directory = save_preset(
            backbone, self.tokenizer, "gelu" if exact else "gelu_tanh", Path(directory) / "backbone"
        )
        print(f"adapted backbone: {directory} (use it as backbone.preset)")

    # ---- export
    def serving_inputs(self):
        return string_inputs("text")

    def serve(self, model, inputs):
        import tensorflow as tf

        token_ids, segment_ids = encode_queries(
            self.tokenizer, inputs["text"], self.sequence_length
        )
        positions = mask_positions(token_ids, self.tokenizer.mask_id)  # (batch, (masks))
        outputs = model(
            {
                "token_ids": token_ids.to_tensor(),
                "segment_ids": segment_ids.to_tensor(),
                "padding_mask": tf.ones_like(token_ids).to_tensor(),
                "mask_positions": positions.to_tensor(),
            },
            training=False,
        )
        probabilities = tf.nn.softmax(tf.cast(outputs["mlm"], tf.float32))
        scores, ids = tf.math.top_k(probabilities, k=self.options.top_k)  # (batch, masks, k)
        used = tf.sequence_mask(positions.row_lengths(), tf.shape(ids)[1])[:, :, None]
        tokens = tf.gather(tf.constant(self.tokenizer.vocabulary), ids)
        return {
            "tokens": tf.where(used, tokens, ""),
            "scores": tf.where(used, scores, 0.0),
            "num_masks": tf.cast(positions.row_lengths(), tf.int32),
        }


def is_fill_mask(columns) -> bool:
    """The one rule for the task's two modes: rows of fill-mask queries (featurized from
    `FillMaskQuery` inputs) carry `num_masks`; corpus instances never do."""
    return "num_masks" in columns
