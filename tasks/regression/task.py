"""Regression: [CLS] -> dropout -> one linear output, for single texts and pairs (STS-B).

The head learns the training targets standardized by their mean and standard deviation
(`task.normalize_targets`), which travel in the model's state: predictions, the SavedModel
and the transformers export are in the targets' own units.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bertkit.tabular import detect_format, read_rows, text_and_pair
from bertkit.task import DataFiles, Features, Task, head_initializer, string_inputs
from bertkit_tasks.regression.targets import parse_target, target_statistics


@dataclasses.dataclass(frozen=True)
class RegressionOptions:
    dropout: float = dataclasses.field(
        default=0.1,
        metadata={"min": 0.0, "max": 0.9, "help": "dropout on the pooled [CLS] output"},
    )
    normalize_targets: bool = dataclasses.field(
        default=True,
        metadata={
            "help": "learn (target - mean) / std of the training targets; predictions are "
            "scaled back to the targets' units"
        },
    )


@dataclasses.dataclass(frozen=True)
class RegressionData(DataFiles):
    text: str = dataclasses.field(default="text", metadata={"help": "column of the text"})
    text_pair: str | None = dataclasses.field(
        default=None, metadata={"help": "column of the second text, for sentence pairs"}
    )
    label: str = dataclasses.field(
        default="label", metadata={"help": "column of the numeric target"}
    )


@dataclasses.dataclass(frozen=True)
class ScoredText:
    text: str
    text_pair: str | None = None
    target: float | None = None
    source: str | None = None
    line: int | None = None


class RegressionTask(Task):
    """Predicts a number for a text or a text pair from BERT's pooled [CLS] output, as
    transformers' `BertForSequenceClassification` with `problem_type="regression"` does:
    mean squared error on one linear output.

    Predictions are `{"score": float}`; metrics are Spearman's and Pearson's correlation
    with the gold targets, and the mean squared and absolute errors in their units.

    Example:
        >>> from bertkit.registry import load_task
        >>> load_task("regression").monitor
        'spearman'
    """

    name = "regression"
    description = "Text and text-pair regression from the [CLS] token (Spearman, Pearson)."
    Options = RegressionOptions
    Data = RegressionData
    Example = ScoredText
    monitor = "spearman"
    int8_max_drop = 0.5  # points of Spearman x 100
    packs = True  # the head reads pooled_output, which packing gathers per row

    # ---- data
    def read(self, path):
        columns = [self.data.text, self.data.label]
        if self.data.text_pair:
            columns.insert(1, self.data.text_pair)
        return [
            ScoredText(
                str(row[self.data.text]),
                str(row[self.data.text_pair]) if self.data.text_pair else None,
                parse_target(row[self.data.label], source=path, line=line, key=self.data.label),
                str(path),
                line,
            )
            for line, row in read_rows(path, detect_format(path, self.data.format), columns)
        ]

    def fit_state(self, train_examples):
        source = train_examples[0].source if train_examples else None
        targets = [e.target for e in train_examples]
        normalize = self.options.normalize_targets
        return target_statistics(targets, normalize, source=source, key=self.data.label)

    @property
    def scale(self) -> tuple[float, float]:
        """(std, mean): a model output times std plus mean is a prediction."""
        return self.state["target_std"], self.state["target_mean"]

    def featurize(self, examples, training):
        pairs = [e.text_pair or "" for e in examples] if self.data.text_pair else None
        token_ids, segment_ids = self.tokenizer.encode(
            [e.text for e in examples], pairs, sequence_length=self.sequence_length
        )
        std, mean = self.scale
        targets = [0.0 if e.target is None else (e.target - mean) / std for e in examples]
        return Features(
            {
                "token_ids": token_ids,
                "segment_ids": segment_ids,
                # not `labels`: a features file checks those as ids into the state's labels
                "targets": np.array(targets, dtype=np.float32),
            },
            example_index=np.arange(len(examples)),
        )

    def make_batch(self, batch, training, rng):
        inputs, _, _ = super().make_batch(batch, training, rng)
        return inputs, batch.get("targets"), None

    # ---- model
    def build_model(self, backbone):
        import keras

        pooled = backbone.output["pooled_output"]  # (batch, hidden)
        x = keras.layers.Dropout(self.options.dropout, name="regressor_dropout")(pooled)
        output = keras.layers.Dense(1, name="regressor", kernel_initializer=head_initializer())(x)
        return keras.Model(backbone.input, output, name="bert_regressor")

    def loss(self):
        import keras

        return keras.losses.MeanSquaredError(name="mse")

    # ---- outputs
    def decode(self, examples, features, outputs):
        std, mean = self.scale
        values = np.stack(outputs["logits"]).astype(np.float64).reshape(-1)
        return [{"score": float(value * std + mean)} for value in values]

    def evaluate(self, examples, predictions):
        from bertkit.metrics.correlation import pearson, spearman

        gold = np.array([e.target for e in examples], dtype=np.float64)
        predicted = np.array([p["score"] for p in predictions], dtype=np.float64)
        errors = predicted - gold
        return {
            "spearman": spearman(predicted, gold),
            "pearson": pearson(predicted, gold),
            "mse": float(np.mean(errors**2)),
            "mae": float(np.mean(np.abs(errors))),
        }

    def baseline(self, examples):
        """A constant prediction (the training mean) correlates 0 with any gold targets."""
        return (0.0, "constant prediction") if examples else None

    def report(self, examples, predictions, directory):
        from bertkit_tasks.regression.report import regression_report

        return regression_report(examples, predictions, directory)

    def parse_input(self, value):
        text, pair = text_and_pair(value, self.data.text, self.data.text_pair)
        return ScoredText(text, pair)

    # ---- export
    def serving_inputs(self):
        return string_inputs("text", "text_pair") if self.data.text_pair else string_inputs("text")

    def serve(self, model, inputs):
        import tensorflow as tf

        texts = [inputs[name] for name in sorted(inputs)]  # text (, text_pair)
        model_inputs = self.tokenizer.model_inputs(texts, self.sequence_length)
        std, mean = self.scale
        output = tf.cast(model(model_inputs, training=False), tf.float32)[:, 0]
        return {"score": output * std + mean}

    def transformers_head(self):
        """`BertForSequenceClassification` with `problem_type="regression"`: the same pooled
        [CLS] -> Dense(1); the target statistics are folded into its weights."""
        from bertkit.serving.transformers_export import TransformersHead

        std, mean = self.scale
        return TransformersHead(
            architecture="BertForSequenceClassification",
            layer="regressor",
            module="classifier",
            labels=("score",),
            pipeline="text-classification",
            call_options={"function_to_apply": "none", "truncation": True},
            settings={
                "text_pairs": bool(self.data.text_pair),
                "target_mean": mean,
                "target_std": std,
            },
            problem_type="regression",
            output_affine=(std, mean),
            use_note="the pipeline's `score` is the predicted target, in the training "
            "targets' units: their mean and spread are folded into the head's weights",
        )
