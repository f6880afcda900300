"""A run's task object from its `model/task.json` description, without Keras: shared by
`FineTunedModel`, the transformers export and the ONNX runtime (which must not import it)."""

from __future__ import annotations

from bertkit.recipes import schema
from bertkit.registry import load_task


def build_task(description: dict, tokenizer, source):
    """The task of `description` (`task`, `options`, `data`, `sequence_length`, `state`);
    `source` names the file in the errors of its options."""
    task_class = load_task(description["task"], source=source)
    origin = schema.Origin(str(source))
    options = schema.build(task_class.Options, description["options"], origin, ("options",))
    data = schema.build(task_class.Data, description["data"], origin, ("data",))
    return task_class(
        options, data, tokenizer, description["sequence_length"], description["state"]
    )
