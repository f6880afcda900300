"""Does a task's preprocessor make the same rows in Python and in TensorFlow?

A preprocessor (`bertkit.task.Task.preprocessor`) has two paths over one tokenizer:
`featurize(examples)`, the Python path of training and `predict`, and `serve(inputs)`,
the graph path of the SavedModel. `check_preprocessor` runs both on the same inputs.

Example (a preprocessor of one row per text; both paths pack with one tokenizer):
    >>> import numpy as np
    >>> import tensorflow as tf
    >>> from bertkit.model.tokenizer import WordPieceTokenizer
    >>> from bertkit.task import Features, Task
    >>> from bertkit.testing import check_preprocessor, tiny_vocabulary
    >>> class OneRow:
    ...     tokenizer = WordPieceTokenizer(tiny_vocabulary(), lowercase=True)
    ...     def featurize(self, texts):
    ...         ids, segments = self.tokenizer.encode(texts, sequence_length=8)
    ...         return Features({"token_ids": ids, "segment_ids": segments},
    ...                         np.arange(len(texts)))
    ...     def serve(self, inputs):
    ...         ids, segments = self.tokenizer.pack(
    ...             [self.tokenizer.tokenize(inputs["text"])], 8)
    ...         return {"token_ids": ids, "segment_ids": segments,
    ...                 "example_index": tf.range(ids.nrows())}
    >>> class Texts(Task):
    ...     def preprocessor(self): return OneRow()
    ...     def parse_input(self, value): return value
    ...     def serving_inputs(self): return {"text": None}
    >>> check_preprocessor(Texts(None, None, None, 8), ["a good film", "bad"])
    ['token_ids', 'segment_ids', 'example_index']
"""

from __future__ import annotations

import numpy as np

_REQUIRED = ("token_ids", "segment_ids", "example_index")


def check_preprocessor(task, inputs: list, serving_inputs: dict | None = None) -> list[str]:
    """Checks that a task's preprocessor makes the same rows in Python and in TensorFlow.

    `task.preprocessor()` (None: nothing to check) has `featurize(examples)`, the
    Python path of training and `predict`, and `serve(inputs)`, the graph path of
    the SavedModel (see `bertkit.task.Task.preprocessor`). The raw `inputs` go
    through `task.parse_input` and `featurize`, `serving_inputs` through `serve`
    (eagerly). Every output of `serve` named like a column of the `Features`, one
    of its extras or `example_index` must hold the same values as nested lists;
    `token_ids`, `segment_ids` and `example_index` must be among them. Outputs with
    other names belong to the graph alone (byte offsets, ...). An example is in
    this module's docstring.

    Args:
        task: a task instance (tokenizer and options set).
        inputs: raw inputs, as `FineTunedModel.predict` takes them.
        serving_inputs: name -> list of strings, the same inputs as the SavedModel
            takes them; default: `inputs` under the signature's only name.

    Returns:
        The names compared, in `serve`'s order: a test can require its task's
        bookkeeping among them.
    """
    preprocessor = task.preprocessor()
    if preprocessor is None:
        return []
    if serving_inputs is None:
        serving_inputs = default_serving_inputs(task, inputs)
    features = preprocessor.featurize([task.parse_input(value) for value in inputs])
    served = _serve_eagerly(preprocessor, serving_inputs)
    python = {**features.columns, **features.extras, "example_index": features.example_index}
    compared = _names_to_compare(python, served)
    for name in compared:
        _assert_same_rows(
            name, _plain(python[name]), _plain(served[name]), features.example_index, inputs
        )
    return compared


def default_serving_inputs(task, inputs: list) -> dict:
    """`inputs` under the name of the task's only serving input."""
    (name,) = task.serving_inputs()
    return {name: list(inputs)}


def _serve_eagerly(preprocessor, serving_inputs: dict) -> dict:
    """The outputs of `preprocessor.serve` for `serving_inputs` (name -> list of strings)."""
    import tensorflow as tf

    return preprocessor.serve(
        {name: tf.constant(values, tf.string) for name, values in serving_inputs.items()}
    )


def _names_to_compare(python: dict, served: dict) -> list[str]:
    """The outputs of `serve` that `featurize` makes too, in `serve`'s order; `serve`
    must give `token_ids`, `segment_ids` and `example_index`."""
    missing = [name for name in _REQUIRED if name not in served]
    assert not missing, f"the preprocessor's serve gives no {', '.join(missing)}"
    return [name for name in served if name in python]


def _assert_same_rows(name: str, python, graph, example_index, inputs: list) -> None:
    """Equal values, or an error naming the first item that differs and its input."""
    if python == graph:
        return
    where = ""
    if isinstance(python, list) and isinstance(graph, list):
        pairs = enumerate(zip(python, graph, strict=False))
        i = next((i for i, (a, b) in pairs if a != b), min(len(python), len(graph)))
        per_row = len(python) == len(example_index) and i < len(python)  # else per input
        source = example_index[i] if per_row else i
        where = f" at item {i} (of {len(python)} from featurize, {len(graph)} from serve)" + (
            f", from input {inputs[source]!r:.80}" if source < len(inputs) else ""
        )
        python, graph = python[i : i + 1], graph[i : i + 1]
    raise AssertionError(
        f"the preprocessor's Python and TensorFlow paths disagree on '{name}'"
        f"{where}: featurize gives {python!r:.300}, serve {graph!r:.300}"
    )


def _plain(value):
    """Tensors, ragged tensors, arrays and tuples as nested lists of Python values."""
    if hasattr(value, "to_list"):  # tf.RaggedTensor
        return value.to_list()
    if hasattr(value, "numpy"):
        value = value.numpy()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value.item() if isinstance(value, np.generic) else value
