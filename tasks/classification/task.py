"""Sequence classification: [CLS] -> dropout -> dense softmax, for single texts and pairs."""

from __future__ import annotations

import collections
import dataclasses
from typing import Literal

import numpy as np

from bertkit.errors import UserError
from bertkit.tabular import detect_format, read_rows, text_and_pair
from bertkit.task import DataFiles, Features, PredictOption, Task, head_initializer, string_inputs
from bertkit_tasks.classification.metrics import confusion_matrix, macro_f1, matthews_corrcoef
from bertkit_tasks.classification.windows import (
    DocumentWindows,
    document_logits,
    document_logits_tf,
)


@dataclasses.dataclass(frozen=True)
class ClassificationOptions:
    labels: tuple[str, ...] | None = dataclasses.field(
        default=None,
        metadata={
            "help": "the label set, in output order; default: the labels of the training data"
        },
    )
    dropout: float = dataclasses.field(
        default=0.1,
        metadata={
            "min": 0.0,
            "max": 0.9,
            "help": "dropout on the pooled [CLS] output, before the head",
        },
    )
    label_smoothing: float = dataclasses.field(
        default=0.0,
        metadata={"min": 0.0, "max_exclusive": 1.0, "help": "target: (1 - s) one-hot + s / labels"},
    )
    long_text: Literal["truncate", "windows"] = dataclasses.field(
        default="truncate",
        metadata={
            "help": "a text longer than sequence_length: cut there (truncate), or classified "
            "as overlapping windows whose logits are combined (windows; single texts)"
        },
    )
    window_stride: int | None = dataclasses.field(
        default=None,
        metadata={
            "min": 1,
            "help": "windows: word pieces between the starts of windows; null: half of "
            "sequence_length - 2",
        },
    )
    window_aggregation: Literal["mean", "max"] = dataclasses.field(
        default="mean",
        metadata={"help": "windows: a document's logits, the mean or the maximum of its windows'"},
    )
    max_windows: int | None = dataclasses.field(
        default=None,
        metadata={
            "min": 1,
            "help": "windows: refuse a text that needs more windows (null: no limit)",
        },
    )


@dataclasses.dataclass(frozen=True)
class ClassificationData(DataFiles):
    text: str = dataclasses.field(default="text", metadata={"help": "column of the text"})
    text_pair: str | None = dataclasses.field(
        default=None, metadata={"help": "column of the second text, for sentence-pair tasks"}
    )
    label: str = dataclasses.field(default="label", metadata={"help": "column of the label"})


@dataclasses.dataclass(frozen=True)
class TextExample:
    text: str
    text_pair: str | None = None
    label: str | None = None
    source: str | None = None
    line: int | None = None


class ClassificationTask(Task):
    """Classifies texts or text pairs from BERT's pooled [CLS] output.

    Predictions are `{"label": str, "score": float, "probabilities": {label: float}}`;
    metrics are accuracy, macro-F1 and, for two classes, Matthews correlation. With
    `long_text: windows` a long text is read as overlapping windows, each a row trained on the
    text's label, and its prediction comes from the mean (or maximum) of their logits
    (`bertkit_tasks.classification.windows`).
    """

    name = "classification"
    description = "Text and text-pair classification from the [CLS] token (accuracy, F1, MCC)."
    Options = ClassificationOptions
    Data = ClassificationData
    Example = TextExample
    monitor = "accuracy"
    int8_max_drop = 0.5  # points of accuracy
    packs = True  # the head reads pooled_output, which packing gathers per row
    predict_options = (PredictOption("--top-k", "add the K most probable labels as 'top_k'", "K"),)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._windows = None
        if self.options is not None and self.options.long_text != "windows":
            for key in ("window_stride", "max_windows"):
                if getattr(self.options, key) is not None:
                    raise UserError("applies to long_text: windows only", key=f"task.{key}")
        if self.options is not None and self.options.long_text == "windows":
            if self.data.text_pair:
                raise UserError(
                    "windows read single texts; this recipe reads text pairs "
                    f"(data.text_pair: {self.data.text_pair})",
                    key="task.long_text",
                )
            self._windows = DocumentWindows(  # checks window_stride now, not mid-run
                self.tokenizer,
                self.sequence_length,
                self.options.window_stride,
                self.options.max_windows,
                text_key=self.data.text,
            )

    # ---- data
    def read(self, path):
        columns = [self.data.text, self.data.label]
        if self.data.text_pair:
            columns.insert(1, self.data.text_pair)
        fmt = detect_format(path, self.data.format)
        return [
            TextExample(
                str(row[self.data.text]),
                str(row[self.data.text_pair]) if self.data.text_pair else None,
                str(row[self.data.label]),
                str(path),
                line,
            )
            for line, row in read_rows(path, fmt, columns)
        ]

    def fit_state(self, train_examples):
        labels = self.options.labels or _sorted_labels({e.label for e in train_examples})
        return {"labels": list(labels)}

    @property
    def labels(self) -> list[str]:
        return self.state["labels"]

    def featurize(self, examples, training):
        label_ids = np.array([self._label_id(e) for e in examples], dtype=np.int32)
        if self._windows is not None:
            features = self._windows.featurize(examples)
            features.columns["labels"] = label_ids[features.example_index]  # a window: its text's
            return features
        pairs = [e.text_pair for e in examples] if self.data.text_pair else None
        if pairs is None and any(e.text_pair is not None for e in examples):
            pairs = [e.text_pair or "" for e in examples]
        token_ids, segment_ids = self.tokenizer.encode(
            [e.text for e in examples], pairs, sequence_length=self.sequence_length
        )
        return Features(
            {"token_ids": token_ids, "segment_ids": segment_ids, "labels": label_ids},
            example_index=np.arange(len(examples)),
        )

    def preprocessor(self):
        """The windows' rows in Python and TensorFlow with `long_text: windows`, else None."""
        return self._windows

    def _label_id(self, example) -> int:
        if example.label is None:
            return 0  # prediction: no target
        try:
            return self.labels.index(example.label)
        except ValueError:
            raise UserError(
                f"unknown label '{example.label}'; the model knows: {', '.join(self.labels)}",
                source=example.source,
                line=example.line,
                key=self.data.label,
            ) from None

    # ---- model
    def build_model(self, backbone):
        import keras

        pooled = backbone.output["pooled_output"]  # (batch, hidden)
        x = keras.layers.Dropout(self.options.dropout, name="classifier_dropout")(pooled)
        logits = keras.layers.Dense(
            len(self.labels), name="classifier", kernel_initializer=head_initializer()
        )(x)
        return keras.Model(backbone.input, logits, name="bert_classifier")

    def loss(self):
        from bertkit.losses import sparse_crossentropy

        return sparse_crossentropy(self.options.label_smoothing)

    def metrics(self):
        import keras

        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]

    # ---- outputs
    def decode(self, examples, features, outputs):
        logits = document_logits(
            np.stack(outputs["logits"]).astype(np.float64),
            features.example_index,
            len(examples),
            self.options.window_aggregation,
        )
        probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
        probabilities /= probabilities.sum(axis=1, keepdims=True)
        return [
            {
                "label": self.labels[int(p.argmax())],
                "score": float(p.max()),
                "probabilities": dict(zip(self.labels, map(float, p), strict=True)),
            }
            for p in probabilities
        ]

    def evaluate(self, examples, predictions):
        gold = np.array([self._label_id(e) for e in examples])
        predicted = np.array([self.labels.index(p["label"]) for p in predictions])
        matrix = confusion_matrix(gold, predicted, len(self.labels))
        metrics = {"accuracy": float((gold == predicted).mean()), "macro_f1": macro_f1(matrix)}
        if len(self.labels) == 2:
            metrics["mcc"] = matthews_corrcoef(matrix)
        return metrics

    def baseline(self, examples):
        """Accuracy of always answering the most frequent gold label: no constant answer
        does better."""
        counts = collections.Counter(e.label for e in examples if e.label is not None)
        return (max(counts.values()) / sum(counts.values()), "majority-class") if counts else None

    def report(self, examples, predictions, directory):
        from bertkit_tasks.classification.report import classification_report

        return classification_report(examples, predictions, self.labels, directory)

    def apply_predict_options(self, prediction, top_k=None):
        """With `top_k`, adds `"top_k": [{"label", "score"}, ...]`, the K most probable labels.

        Example:
            >>> prediction = {"label": "b", "probabilities": {"a": 0.2, "b": 0.7, "c": 0.1}}
            >>> task = ClassificationTask(None, None, None, sequence_length=8)
            >>> task.apply_predict_options(prediction, top_k=2)["top_k"]
            [{'label': 'b', 'score': 0.7}, {'label': 'a', 'score': 0.2}]
        """
        if top_k is None:
            return prediction
        ranked = sorted(prediction["probabilities"].items(), key=lambda item: -item[1])[:top_k]
        return {
            **prediction,
            "top_k": [{"label": label, "score": score} for label, score in ranked],
        }

    def parse_input(self, value):
        text, pair = text_and_pair(value, self.data.text, self.data.text_pair)
        if self._windows is not None:
            self._windows.check_input(TextExample(text))
        return TextExample(text, pair)

    # ---- export
    def serving_inputs(self):
        return string_inputs("text", "text_pair") if self.data.text_pair else string_inputs("text")

    def serve(self, model, inputs):
        import tensorflow as tf

        if self._windows is None:
            texts = [inputs[name] for name in sorted(inputs)]  # text (, text_pair)
            model_inputs = self.tokenizer.model_inputs(texts, self.sequence_length)
            logits = tf.cast(model(model_inputs, training=False), tf.float32)
        else:
            logits = self._window_logits(model, inputs)
        probabilities = tf.nn.softmax(logits)
        best = tf.argmax(probabilities, axis=-1, output_type=tf.int32)
        return {
            "label": tf.gather(tf.constant(self.labels), best),
            "score": tf.reduce_max(probabilities, axis=-1),
            "probabilities": probabilities,
            "label_names": tf.broadcast_to(tf.constant(self.labels), tf.shape(probabilities)),
        }

    def _window_logits(self, model, inputs):
        """(batch, labels): each text's logits combined from its windows', in the graph."""
        import tensorflow as tf

        rows = self._windows.serve(inputs)
        token_ids = rows["token_ids"]
        model_inputs = {
            "token_ids": token_ids.to_tensor(),
            "segment_ids": rows["segment_ids"].to_tensor(),
            "padding_mask": tf.ones_like(token_ids).to_tensor(),
        }
        logits = tf.cast(model(model_inputs, training=False), tf.float32)
        count = tf.size(inputs["text"])
        how = self.options.window_aggregation
        return document_logits_tf(logits, rows["example_index"], count, how)

    def transformers_head(self):
        """`BertForSequenceClassification`: the same pooled [CLS] -> Dense, and softmax."""
        from bertkit.serving.transformers_export import TransformersHead

        pairs = {"text": self.data.text, "text_pair": self.data.text_pair}
        lost = ()
        if self._windows is not None:
            lost = (
                f"windows over texts longer than {self._windows.window_size} word pieces "
                f"(stride {self._windows.stride}, the {self.options.window_aggregation} of "
                "their logits; transformers' pipeline truncates them)",
            )
        return TransformersHead(
            architecture="BertForSequenceClassification",
            layer="classifier",
            module="classifier",
            labels=tuple(self.labels),
            pipeline="text-classification",
            call_options={"truncation": True},
            settings={"text_pairs": bool(self.data.text_pair), "columns": pairs},
            not_represented=lost,
        )


def _sorted_labels(labels: set) -> list[str]:
    """Numeric labels in numeric order ("2" before "10"), others alphabetically."""
    if all(label.lstrip("-").isdigit() for label in labels):
        return sorted(labels, key=int)
    return sorted(labels)
