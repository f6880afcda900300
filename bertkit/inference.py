"""Running a model over featurized rows and handing the outputs back per example."""

from __future__ import annotations

import numpy as np

from bertkit.batching import fill_rows, inference_batches, pad_batch
from bertkit.distribution import devices_sharing_a_batch
from bertkit.multi_process import predict_global_batch
from bertkit.task import Features


def predict_rows(task, model, features: Features, batch_size: int, buckets,
                 progress=None) -> dict:
    """Model outputs for every row of `features`, in row order.

    Returns name -> list of per-row arrays; outputs listed in
    `task.sequence_outputs` are cut to each row's token count. `progress`, if
    given, is called with the number of rows done after each batch.
    """
    outputs: dict[str, list] = {}
    lengths = features.lengths()
    done = 0
    devices = devices_sharing_a_batch()
    for rows in inference_batches(lengths, batch_size):
        batch = pad_batch(features, fill_rows(rows, devices), buckets)
        inputs, _, _ = task.make_batch(batch, training=False, rng=None)
        result = predict_global_batch(model, inputs)
        if not isinstance(result, dict):
            result = {"logits": result}
        if len(rows) < len(batch["row_index"]):  # drop the filler rows
            batch = {name: value[:len(rows)] for name, value in batch.items()}
            result = {name: value[:len(rows)] for name, value in result.items()}
        result = task.reduce_outputs(batch, {k: np.asarray(v) for k, v in result.items()})
        for name, values in result.items():
            values = np.asarray(values)
            per_row = outputs.setdefault(name, [None] * len(features))
            for j, row in enumerate(rows):
                cut = values[j, :lengths[row]] if name in task.sequence_outputs else values[j]
                per_row[row] = cut
        done += len(rows)
        if progress is not None:
            progress(done)
    return outputs


def predict_examples(task, model, examples: list, batch_size: int, buckets,
                     progress=None) -> list[dict]:
    """Featurize, run and decode: user-facing predictions, one per example.

    `progress`, if given, is called with the fraction of model rows done.
    """
    if not examples:
        return []
    features = task.featurize(examples, training=False)
    report = None if progress is None else (lambda done: progress(done / len(features)))
    outputs = predict_rows(task, model, features, batch_size, buckets, report)
    return task.decode(examples, features, outputs)
