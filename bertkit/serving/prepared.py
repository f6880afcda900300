"""A server's prediction in three stages, so that the model thread only runs the model.

`prepare` featurizes one request's examples when it arrives (any thread), `run_prepared`
runs the rows of several prepared requests in one model call (the model thread: while it
runs, the next requests are being prepared), and `finish` decodes one request's outputs
(any thread). Together they give what `predict_examples` gives for each request's examples:
every task's rows and decoding depend on the example alone, and only the rows' columns
are merged; each request keeps its own `Features` for decoding.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bertkit.features import Features
from bertkit.serving.inference import predict_rows


@dataclasses.dataclass
class PreparedRequest:
    """One request's examples and their model rows."""

    examples: list
    features: Features | None  # None: not featurized here (no examples, or an encoder's texts)

    @property
    def rows(self) -> int:
        return len(self.examples) if self.features is None else len(self.features)

    @property
    def longest(self) -> int:
        """The longest row's tokens (0 if unknown): with `rows`, the padded batch's size,
        what the token budget bounds."""
        return 0 if self.features is None else int(self.features.lengths().max())


def prepare(task, examples: list) -> PreparedRequest:
    """Featurizes a request's examples (from `parse_inputs`)."""
    return PreparedRequest(examples, task.featurize(examples, training=False) if examples else None)


def run_prepared(task, model, requests: list, batch_size: int, buckets) -> list[dict]:
    """Each request's model outputs (name -> per-row arrays) from model calls over all their
    rows together; requests whose rows have other columns (e.g. MLM's fill-mask and scoring
    inputs) run in calls of their own."""
    outputs: list = [{} for _ in requests]
    groups: dict = {}
    for index, request in enumerate(requests):
        if request.features is not None:
            groups.setdefault(tuple(request.features.columns), []).append(index)
    for indices in groups.values():
        merged = merge_rows([requests[i].features for i in indices])
        per_row = predict_rows(task, model, merged, batch_size, buckets)
        start = 0
        for i in indices:
            end = start + requests[i].rows
            outputs[i] = {name: values[start:end] for name, values in per_row.items()}
            start = end
    return outputs


def finish(task, request: PreparedRequest, outputs: dict) -> list[dict]:
    """The request's predictions, as `predict_examples` gives them."""
    if request.features is None:
        return []
    return task.decode(request.examples, request.features, outputs)


def merge_rows(parts: list[Features]) -> Features:
    """The rows of `parts`, in order, as one `Features` to run the model on (its columns
    only: decoding reads each part's own `example_index` and extras)."""
    if len(parts) == 1:
        return parts[0]
    columns = {}
    for name, first in parts[0].columns.items():
        if isinstance(first, list):
            columns[name] = [row for part in parts for row in part.columns[name]]
        else:
            columns[name] = np.concatenate([np.asarray(part.columns[name]) for part in parts])
    rows = sum(len(part) for part in parts)
    return Features(columns, np.arange(rows, dtype=np.int64), pad_values=parts[0].pad_values)
