"""Multi-label classification: [CLS] -> dropout -> one sigmoid per label, binary
cross-entropy; every label over its threshold is predicted (GoEmotions' emotions).

The thresholds start at `task.threshold` and, by default, are tuned on the validation split
once training ends (`task.tune_threshold`: one for all labels by micro F1, or one per label);
they travel in the model's state, so `predict`, the SavedModel and `serve` decide alike.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Literal

import numpy as np

from bertkit.errors import UserError
from bertkit.tabular import detect_format, read_rows, text_and_pair
from bertkit.task import DataFiles, Features, Task, head_initializer, string_inputs
from bertkit_tasks.multi_label.label_sets import f1_scores, tuned_thresholds


@dataclasses.dataclass(frozen=True)
class MultiLabelOptions:
    labels: tuple[str, ...] | None = dataclasses.field(
        default=None,
        metadata={"help": "the label set, in output order; default: the training data's"},
    )
    dropout: float = dataclasses.field(
        default=0.1, metadata={"min": 0.0, "max": 0.9, "help": "dropout on the pooled [CLS]"}
    )
    threshold: float = dataclasses.field(
        default=0.5,
        metadata={"min": 0.0, "max": 1.0, "help": "a label's probability that predicts it"},
    )
    tune_threshold: Literal["global", "per_label", "none"] = dataclasses.field(
        default="global",
        metadata={
            "help": "after training, the threshold of the best validation F1: one for all "
            "labels (micro F1), one per label (each label's F1), or none (keep `threshold`)"
        },
    )
    allow_no_labels: bool = dataclasses.field(
        default=False,
        metadata={"help": "accept examples whose label list is empty (none applies)"},
    )


@dataclasses.dataclass(frozen=True)
class MultiLabelData(DataFiles):
    text: str = dataclasses.field(default="text", metadata={"help": "column of the text"})
    text_pair: str | None = dataclasses.field(
        default=None, metadata={"help": "column of the second text, for sentence pairs"}
    )
    label: str = dataclasses.field(
        default="labels",
        metadata={"help": "column of the labels: a JSON list, or labels joined by separator"},
    )
    separator: str = dataclasses.field(
        default=",", metadata={"help": "what joins a cell's labels (a cell not a JSON list)"}
    )


@dataclasses.dataclass(frozen=True)
class LabelledText:
    text: str
    text_pair: str | None = None
    labels: tuple[str, ...] | None = None
    source: str | None = None
    line: int | None = None


class MultiLabelTask(Task):
    """Predicts every label whose sigmoid is over its threshold, as transformers'
    `BertForSequenceClassification` with `problem_type="multi_label_classification"`.

    Predictions are `{"labels": [...], "probabilities": {label: float}}`; metrics are micro
    and macro F1, the share of examples whose label set is exactly right (`exact_match`)
    and each label's F1 (`per_label_f1`).

    Example:
        >>> from bertkit.registry import load_task
        >>> load_task("multi_label").monitor
        'micro_f1'
    """

    name = "multi_label"
    description = "Several labels per text or pair: a sigmoid per label (micro/macro F1)."
    Options = MultiLabelOptions
    Data = MultiLabelData
    Example = LabelledText
    monitor = "micro_f1"
    int8_max_drop = 1.0  # points of micro F1
    packs = True  # the head reads pooled_output, which packing gathers per row

    # ---- data
    def read(self, path):
        columns = [self.data.text, self.data.label]
        if self.data.text_pair:
            columns.insert(1, self.data.text_pair)
        return [
            LabelledText(
                str(row[self.data.text]),
                str(row[self.data.text_pair]) if self.data.text_pair else None,
                self._cell_labels(row[self.data.label], path, line),
                str(path),
                line,
            )
            for line, row in read_rows(path, detect_format(path, self.data.format), columns)
        ]

    def _cell_labels(self, cell, path, line) -> tuple[str, ...]:
        """A cell's labels: a list (JSON lines), a JSON list in a string, or `separator`-
        joined names; an empty list is refused unless `allow_no_labels`."""
        if isinstance(cell, str) and cell.strip().startswith("["):
            try:
                cell = json.loads(cell)
            except json.JSONDecodeError:
                raise UserError(
                    f"not a JSON list of labels: {cell!r:.60}",
                    source=path, line=line, key=self.data.label,
                ) from None  # fmt: skip
        if isinstance(cell, list):
            labels = [str(label).strip() for label in cell]
        else:
            labels = [label.strip() for label in str(cell).split(self.data.separator)]
        labels = tuple(dict.fromkeys(label for label in labels if label))
        if not labels and not self.options.allow_no_labels:
            raise UserError(
                "the label list is empty (set task.allow_no_labels: true where no label "
                "applies to some examples)",
                source=path, line=line, key=self.data.label,
            )  # fmt: skip
        return labels

    def fit_state(self, train_examples):
        found = {label for example in train_examples for label in example.labels}
        labels = list(self.options.labels or sorted(found, key=_label_key))
        if len(labels) < 2:
            source = train_examples[0].source if train_examples else None
            raise UserError(
                f"the training data has {len(labels)} label(s); multi-label needs at least 2",
                source=source, key=self.data.label,
            )  # fmt: skip
        return {"labels": labels, "thresholds": [self.options.threshold] * len(labels)}

    @property
    def labels(self) -> list[str]:
        return self.state["labels"]

    def featurize(self, examples, training):
        pairs = [e.text_pair or "" for e in examples] if self.data.text_pair else None
        token_ids, segment_ids = self.tokenizer.encode(
            [e.text for e in examples], pairs, sequence_length=self.sequence_length
        )
        return Features(  # 0/1 per label, not `labels`: a features file checks those as ids
            {
                "token_ids": token_ids,
                "segment_ids": segment_ids,
                "targets": self._targets(examples),
            },
            example_index=np.arange(len(examples)),
        )

    def make_batch(self, batch, training, rng):
        inputs, _, _ = super().make_batch(batch, training, rng)
        return inputs, batch.get("targets"), None

    def _targets(self, examples) -> np.ndarray:
        """(examples, labels) 0/1: an unknown label is the user's error, by file and line."""
        index = {label: i for i, label in enumerate(self.labels)}
        targets = np.zeros((len(examples), len(self.labels)), np.float32)
        for row, example in enumerate(examples):
            for label in example.labels or ():
                if label not in index:
                    raise UserError(
                        f"unknown label '{label}'; the model knows: {', '.join(self.labels)}",
                        source=example.source, line=example.line, key=self.data.label,
                    )  # fmt: skip
                targets[row, index[label]] = 1.0
        return targets

    # ---- model
    def build_model(self, backbone):
        import keras

        pooled = backbone.output["pooled_output"]  # (batch, hidden)
        x = keras.layers.Dropout(self.options.dropout, name="classifier_dropout")(pooled)
        logits = keras.layers.Dense(
            len(self.labels), name="classifier", kernel_initializer=head_initializer()
        )(x)
        return keras.Model(backbone.input, logits, name="bert_multi_label")

    def loss(self):
        import keras

        return keras.losses.BinaryCrossentropy(from_logits=True)

    # ---- outputs
    def decode(self, examples, features, outputs):
        logits = np.stack(outputs["logits"]).astype(np.float64)
        probabilities = 1.0 / (1.0 + np.exp(-logits))
        over = probabilities >= np.asarray(self.state["thresholds"])
        return [
            {
                "labels": [label for label, on in zip(self.labels, chosen, strict=True) if on],
                "probabilities": dict(zip(self.labels, map(float, row), strict=True)),
            }
            for row, chosen in zip(probabilities, over, strict=True)
        ]

    def evaluate(self, examples, predictions):
        gold = self._targets(examples)
        predicted = np.array([[label in p["labels"] for label in self.labels] for p in predictions])
        scores = f1_scores(gold, predicted)
        per_label = dict(zip(self.labels, map(float, scores.pop("per_label")), strict=True))
        exact = float((gold.astype(bool) == predicted).all(axis=1).mean())
        return {**scores, "exact_match": exact, "per_label_f1": per_label}

    def calibrate(self, examples, predictions):
        """The thresholds of the best validation F1 (`task.tune_threshold`), or None."""
        if self.options.tune_threshold == "none":
            return None
        probabilities = np.array([list(p["probabilities"].values()) for p in predictions])
        per_label = self.options.tune_threshold == "per_label"
        return {"thresholds": tuned_thresholds(self._targets(examples), probabilities, per_label)}

    def parse_input(self, value):
        text, pair = text_and_pair(value, self.data.text, self.data.text_pair)
        return LabelledText(text, pair)

    # ---- export
    def serving_inputs(self):
        return string_inputs("text", "text_pair") if self.data.text_pair else string_inputs("text")

    def serve(self, model, inputs):
        import tensorflow as tf

        texts = [inputs[name] for name in sorted(inputs)]  # text (, text_pair)
        model_inputs = self.tokenizer.model_inputs(texts, self.sequence_length)
        probabilities = tf.sigmoid(tf.cast(model(model_inputs, training=False), tf.float32))
        thresholds = tf.constant(self.state["thresholds"], tf.float32)
        return {
            "probabilities": probabilities,
            "predicted": probabilities >= thresholds,
            "label_names": tf.broadcast_to(tf.constant(self.labels), tf.shape(probabilities)),
        }

    def transformers_head(self):
        """`BertForSequenceClassification`, `problem_type="multi_label_classification"`."""
        from bertkit.serving.transformers_export import TransformersHead

        return TransformersHead(
            architecture="BertForSequenceClassification",
            layer="classifier",
            module="classifier",
            labels=tuple(self.labels),
            pipeline="text-classification",
            call_options={"top_k": None, "function_to_apply": "sigmoid", "truncation": True},
            settings={
                "text_pairs": bool(self.data.text_pair),
                "thresholds": dict(zip(self.labels, self.state["thresholds"], strict=True)),
            },
            problem_type="multi_label_classification",
            not_represented=(
                "the tuned thresholds (in config.json's bertkit settings: the pipeline "
                "returns every label's score)",
            ),
        )


def _label_key(label: str):
    """Numeric labels in numeric order ("2" before "10"), others alphabetically."""
    return (0, int(label), "") if label.lstrip("-").isdigit() else (1, 0, label)
