"""A minimal text regression plugin: pooled [CLS] -> dense(1), mean squared error (the
built-in `regression` task is the full one: normalized targets, Spearman, pairs, export)."""

import dataclasses

import numpy as np

from bertkit import DataFiles, Features, Task, UserError, string_inputs
from bertkit.tabular import detect_format, read_rows


@dataclasses.dataclass(frozen=True)
class RegressionData(DataFiles):
    text: str = "text"
    text_pair: str | None = None
    target: str = "score"


class RegressionTask(Task):
    """Predicts `{"score": float}` per text; metrics: mse and Pearson correlation."""

    name = "text_score"
    description = "One number per text or text pair from the [CLS] token (MSE, Pearson r)."
    Data = RegressionData
    monitor, mode = "mse", "min"

    def read(self, path):
        columns = [c for c in (self.data.text, self.data.text_pair, self.data.target) if c]
        examples = []
        for line, row in read_rows(path, detect_format(path, self.data.format), columns):
            try:
                target = float(row[self.data.target])
            except ValueError:
                raise UserError(
                    f"expected a number, got {row[self.data.target]!r}",
                    source=path,
                    line=line,
                    key=self.data.target,
                ) from None
            examples.append((row[self.data.text], row.get(self.data.text_pair), target))
        return examples

    def featurize(self, examples, training):
        pairs = [e[1] for e in examples] if self.data.text_pair else None
        token_ids, segment_ids = self.tokenizer.encode(
            [e[0] for e in examples], pairs, sequence_length=self.sequence_length
        )
        targets = np.array([e[2] for e in examples], dtype=np.float32)
        return Features(
            {"token_ids": token_ids, "segment_ids": segment_ids, "labels": targets},
            example_index=np.arange(len(examples)),
        )

    def build_model(self, backbone):
        import keras

        score = keras.layers.Dense(1, name="regression_head")(backbone.output["pooled_output"])
        return keras.Model(backbone.input, keras.ops.squeeze(score, -1))

    def loss(self):
        import keras

        return keras.losses.MeanSquaredError()

    def decode(self, examples, features, outputs):
        return [{"score": float(value)} for value in outputs["logits"]]

    def evaluate(self, examples, predictions):
        gold = np.array([e[2] for e in examples])
        predicted = np.array([p["score"] for p in predictions])
        pearson = np.corrcoef(gold, predicted)[0, 1] if len(gold) > 1 else 0.0
        return {
            "mse": float(np.mean((gold - predicted) ** 2)),
            "pearson": float(np.nan_to_num(pearson)),
        }

    def parse_input(self, value):
        if isinstance(value, str):
            return (value, None, 0.0)
        if (
            isinstance(value, (list, tuple))
            and len(value) == 2
            and all(isinstance(text, str) for text in value)
        ):
            return (value[0], value[1], 0.0)
        raise UserError(f"expected a text or a [text, text_pair] pair, got {value!r:.80}")

    def serving_inputs(self):
        return string_inputs("text", "text_pair") if self.data.text_pair else string_inputs("text")

    def serve(self, model, inputs):
        texts = [inputs[name] for name in sorted(inputs)]  # text (, text_pair)
        model_inputs = self.tokenizer.model_inputs(texts, self.sequence_length)
        return {"score": model(model_inputs, training=False)}
