"""The validation split of a run: predicted after every epoch, the best epoch's outputs kept."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class ValidationSplit:
    """The validation split, featurized once and predicted after every epoch.

    `finetune` makes one per run; `evaluate` is Keras `fit`'s per-epoch callback
    (through `bertkit.training.callbacks.Evaluate`), timed under `phases`' "evaluation".

    The outputs and predictions of the best epoch so far stay in memory (per-row
    logits: small for classification and tagging, start/end logits per window for
    span QA), so the end of the run calibrates and reports on them without
    predicting the validation split again.
    """

    task: object
    examples: list
    features: object
    batch_size: int
    buckets: tuple
    phases: object
    latest: tuple | None = None  # (outputs, predictions) of the last evaluation
    best: tuple | None = None  # (epoch, outputs, predictions) of the best epoch so far

    def outputs(self, model) -> dict:
        from bertkit.serving.inference import predict_rows

        return predict_rows(self.task, model, self.features, self.batch_size, self.buckets)

    def distinct_inputs(self) -> list[dict]:
        """One batch of model inputs for each input shape the split is predicted in."""
        from bertkit.serving.inference import model_inputs

        shapes = {}
        for _, _, inputs in model_inputs(self.task, self.features, self.batch_size, self.buckets):
            key = tuple(sorted((name, np.shape(value)) for name, value in inputs.items()))
            shapes.setdefault(key, inputs)
        return list(shapes.values())

    def floor(self) -> float | None:
        """The task's monitor for a model that learned nothing (`Task.baseline`), or None."""
        baseline = self.task.baseline(self.examples)
        return baseline[0] if baseline else None

    def decode(self, outputs: dict) -> list[dict]:
        return self.task.decode(self.examples, self.features, outputs)

    def evaluate(self, model) -> dict:
        with self.phases("evaluation"):
            outputs = self.outputs(model)
            predictions = self.decode(outputs)
            self.latest = (outputs, predictions)
            return self.task.evaluate(self.examples, predictions)

    def keep_latest(self, epoch: int) -> None:
        """The last evaluation was epoch `epoch`'s, the best so far: keep its outputs."""
        self.best, self.latest = (epoch, *self.latest), None

    def best_outputs(self, epoch: int | None, model) -> tuple[dict, list[dict]]:
        """Epoch `epoch`'s outputs and predictions: kept, or predicted with `model`."""
        if self.best is not None and self.best[0] == epoch:
            return self.best[1], self.best[2]
        outputs = self.outputs(model)  # a resumed run whose best epoch was not in this process
        return outputs, self.decode(outputs)
