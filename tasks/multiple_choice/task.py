"""Multiple choice: a question and N choices, each `[CLS] question [SEP] choice [SEP]` scored
from its [CLS] by one shared dense layer, a softmax over the choices (SWAG, CommonsenseQA)."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from bertkit.errors import UserError
from bertkit.tabular import detect_format, read_records
from bertkit.task import DataFiles, Task, string_inputs
from bertkit_tasks.multiple_choice.reading import Question, parse_question, read_question
from bertkit_tasks.multiple_choice.rows import ChoiceRows, choice_names


@dataclasses.dataclass(frozen=True)
class MultipleChoiceOptions:
    dropout: float = dataclasses.field(
        default=0.1,
        metadata={"min": 0.0, "max": 0.9, "help": "dropout on each choice's pooled [CLS] output"},
    )


@dataclasses.dataclass(frozen=True)
class MultipleChoiceData(DataFiles):
    question: str = dataclasses.field(
        default="question",
        metadata={"help": "key of the question (a dotted path into nested objects)"},
    )
    choices: str = dataclasses.field(
        default="choices",
        metadata={
            "help": "key of the list of choices: texts, or objects with 'text' (and 'label')"
        },
    )
    label: str = dataclasses.field(
        default="label",
        metadata={"help": "key of the answer: the choice's 0-based index, its label or its text"},
    )


class MultipleChoiceTask(Task):
    """Chooses the answer to a question among N choices, as transformers'
    `BertForMultipleChoice` does: each choice's `[CLS] question [SEP] choice [SEP]` pooled,
    one shared `Dense(1)`, a softmax over the N scores, cross-entropy on the right choice.

    The choices of a question share one model row (`bertkit_tasks.multiple_choice.rows`).
    Predictions are `{"choice": index, "answer": text, "score": probability,
    "probabilities": [...]}` (and `"label"` where the choices have labels); the metric is
    accuracy. Every question has the training data's number of choices.

    Example:
        >>> from bertkit.registry import load_task
        >>> load_task("multiple_choice").monitor
        'accuracy'
    """

    name = "multiple_choice"
    description = "Multiple choice: a question and N choices, a softmax over them (accuracy)."
    Options = MultipleChoiceOptions
    Data = MultipleChoiceData
    Example = Question
    monitor = "accuracy"
    int8_max_drop = 0.5  # points of accuracy

    @classmethod
    def cannot_pack(cls, options):
        return "a row already packs a question's choices side by side"

    # ---- data
    def read(self, path):
        fmt = detect_format(path, self.data.format, allowed=("jsonl",))
        return [
            read_question(record, self.data, source=str(path), line=line)
            for line, record in read_records(path, fmt)
        ]

    def fit_state(self, train_examples):
        return {"num_choices": len(train_examples[0].choices)} if train_examples else {}

    @property
    def num_choices(self) -> int:
        return self.state["num_choices"]

    def preprocessor(self) -> ChoiceRows:
        return ChoiceRows(self.tokenizer, self.sequence_length, self.num_choices)

    def featurize(self, examples, training):
        for example in examples:
            self._check_count(example)
        features = self.preprocessor().featurize(examples)
        answers = [0 if e.answer is None else e.answer for e in examples]  # None: predicting
        features.columns["labels"] = np.array(answers, dtype=np.int32)
        return features

    def _check_count(self, example) -> None:
        if len(example.choices) != self.num_choices:
            raise UserError(
                f"{len(example.choices)} choices, where this model chooses among "
                f"{self.num_choices} (the training data's first question has "
                f"{self.num_choices}; bertkit does not pad choices)",
                source=example.source,
                line=example.line,
                key=self.data.choices if example.source else "choices",
            )

    def make_batch(self, batch, training, rng):
        from bertkit_tasks.multiple_choice.model import SEQUENCE_INPUTS

        inputs = {name: batch[name] for name in (*SEQUENCE_INPUTS, "choice_starts")}
        return inputs, batch.get("labels"), None

    # ---- model
    def build_model(self, backbone):
        from bertkit_tasks.multiple_choice.model import choice_model

        return choice_model(backbone, self.options.dropout)

    def loss(self):
        from bertkit.losses import sparse_crossentropy

        return sparse_crossentropy(0.0)

    def metrics(self):
        import keras

        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]

    # ---- outputs
    def decode(self, examples, features, outputs):
        logits = np.stack(outputs["logits"]).astype(np.float64)
        probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
        probabilities /= probabilities.sum(axis=1, keepdims=True)
        predictions = []
        for example, p in zip(examples, probabilities, strict=True):
            best = int(p.argmax())
            prediction = {"choice": best, "answer": example.choices[best], "score": float(p[best])}
            if example.choice_labels:
                prediction["label"] = example.choice_labels[best]
            predictions.append({**prediction, "probabilities": [float(x) for x in p]})
        return predictions

    def evaluate(self, examples, predictions):
        right = [p["choice"] == e.answer for e, p in zip(examples, predictions, strict=True)]
        return {"accuracy": float(np.mean(right))}

    def baseline(self, examples):
        """Accuracy of always answering the most frequent right position (A, B, ...)."""
        counts = collections.Counter(e.answer for e in examples if e.answer is not None)
        return (
            (max(counts.values()) / sum(counts.values()), "majority-position") if counts else None
        )

    def parse_input(self, value):
        question = parse_question(value)
        self._check_count(question)
        return question

    # ---- export
    def serving_inputs(self):
        """`question` and `choice_0` ... `choice_{N-1}`, each a 1-D batch of strings (the
        SavedModel's inputs are 1-D, as every task's; N is the model's number of choices)."""
        return string_inputs("question", *choice_names(self.num_choices))

    def serve(self, model, inputs):
        import tensorflow as tf

        rows = self.preprocessor().serve(inputs)
        ragged = ("token_ids", "segment_ids", "position_ids", "choice_index")
        model_inputs = {name: rows[name].to_tensor() for name in ragged}
        model_inputs["padding_mask"] = tf.ones_like(rows["token_ids"]).to_tensor()
        model_inputs["choice_starts"] = rows["choice_starts"]
        probabilities = tf.nn.softmax(tf.cast(model(model_inputs, training=False), tf.float32))
        best = tf.argmax(probabilities, axis=-1, output_type=tf.int32)
        return {
            "choice": best,
            "answer": tf.gather(rows["choices"], best, batch_dims=1),
            "score": tf.reduce_max(probabilities, axis=-1),
            "probabilities": probabilities,
        }

    def transformers_head(self):
        """`BertForMultipleChoice`: the same pooled [CLS] -> Dense(1) per choice, softmax over
        the choices; transformers has no pipeline for it."""
        from bertkit.serving.transformers_export import TransformersHead

        length = self.preprocessor().choice_length
        return TransformersHead(
            architecture="BertForMultipleChoice",
            layer="chooser",
            module="classifier",
            labels=("score",),
            pipeline="",
            settings={"num_choices": self.num_choices, "choice_length": length},
            not_represented=(
                f"each choice's sequence cut at {length} word pieces (sequence_length // "
                f"{self.num_choices}: transformers cuts each at max_length)",
            ),
            use_note="transformers has no multiple-choice pipeline: tokenize each "
            "(question, choice) pair, stack them as (batch, choices, length) and take the "
            "argmax of `AutoModelForMultipleChoice`'s logits",
        )
