"""A fine-tuned model loaded from its run directory: predict, evaluate, export."""

from __future__ import annotations

from pathlib import Path

from bertkit import schema
from bertkit.backbone import load_architecture
from bertkit.errors import UserError
from bertkit.inference import predict_examples
from bertkit.registry import load_task
from bertkit.run_dir import RunDirectory, read_json


def task_description(task, sequence_length: int, batch_size: int, buckets) -> dict:
    """What `model/task.json` holds: enough to rebuild the task without the recipe."""
    return {"task": task.name, "options": schema.to_plain(task.options),
            "data": schema.to_plain(task.data), "state": task.state,
            "sequence_length": sequence_length, "batch_size": batch_size,
            "bucket_lengths": list(buckets)}


def build_task(description: dict, tokenizer, source):
    task_class = load_task(description["task"], source=source)
    origin = schema.Origin(str(source))
    options = schema.build(task_class.Options, description["options"], origin, ("options",))
    data = schema.build(task_class.Data, description["data"], origin, ("data",))
    return task_class(options, data, tokenizer, description["sequence_length"],
                      description["state"])


class FineTunedModel:
    """A trained task model; get one with `bertkit.load(run_dir)` or from `bertkit.finetune`.

    Example:
        >>> model = bertkit.load("runs/quickstart")           # doctest: +SKIP
        >>> model.predict(["a warm, funny film"])[0]["label"]  # doctest: +SKIP
        'positive'
    """

    def __init__(self, run: RunDirectory, task, model, description: dict):
        self.run, self.task, self.model, self.description = run, task, model, description

    @classmethod
    def load(cls, run_dir) -> FineTunedModel:
        run = RunDirectory.open(run_dir)
        description = read_json(run.task_file, "task description")
        pretrained = load_architecture(run.model_dir)
        task = build_task(description, pretrained.tokenizer, run.task_file)
        model = task.build_model(pretrained.backbone)
        model.load_weights(run.weights_file)
        return cls(run, task, model, description)

    @property
    def buckets(self) -> tuple:
        return tuple(self.description["bucket_lengths"])

    def predict(self, inputs: list, batch_size: int | None = None) -> list[dict]:
        """Predictions for raw inputs: texts, text pairs or dicts, as the task takes them."""
        examples = [self.task.parse_input(value) for value in inputs]
        return predict_examples(self.task, self.model, examples,
                                batch_size or 2 * self.description["batch_size"], self.buckets)

    def evaluate(self, path=None, batch_size: int | None = None,
                 predictions_dir=None) -> dict:
        """The task's metrics on a labelled file (default: the recipe's validation file).

        With `predictions_dir`, the task also writes its predictions there in its
        field's format where it has one (e.g. SQuAD's `{id: answer}` JSON).
        """
        path = path or self.task.data.validation or self.task.data.test
        if path is None:
            raise UserError("no evaluation file: pass --data FILE")
        examples = self.task.read(str(path))
        predictions = predict_examples(self.task, self.model, examples,
                                       batch_size or 2 * self.description["batch_size"],
                                       self.buckets)
        if predictions_dir is not None:
            self.task.write_predictions(examples, predictions, Path(predictions_dir))
        return self.task.evaluate(examples, predictions)

    def export(self, directory) -> Path:
        """Writes a raw-text SavedModel (see `bertkit.export`)."""
        from bertkit.export import export_saved_model

        return export_saved_model(self.task, self.model, directory, self.description)
