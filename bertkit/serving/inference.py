"""Running a model over featurized rows and handing the outputs back per example."""

from __future__ import annotations

import weakref

import numpy as np

from bertkit.padding import compiles_each_shape, fill_rows, inference_batches, pad_batch
from bertkit.parallel.distribution import full_batch_rows
from bertkit.parallel.global_batch import predict_global_batch
from bertkit.task import Features


def predict_rows(task, model, features: Features, batch_size: int, buckets, progress=None) -> dict:
    """Model outputs for every row of `features`, in row order.

    Returns name -> list of per-row arrays; outputs listed in
    `task.sequence_outputs` are cut to each row's token count. `progress`, if
    given, is called with the number of rows done after each batch.
    """
    outputs: dict[str, list] = {}
    lengths = features.lengths()
    done = 0
    for rows, batch, inputs in model_inputs(task, features, batch_size, buckets):
        result = _predict_batch(model, inputs)
        if not isinstance(result, dict):
            result = {"logits": result}
        if len(rows) < len(batch["row_index"]):  # drop the filler rows
            batch = {name: value[: len(rows)] for name, value in batch.items()}
            result = {name: value[: len(rows)] for name, value in result.items()}
        result = task.reduce_outputs(batch, {k: np.asarray(v) for k, v in result.items()})
        for name, values in result.items():
            values = np.asarray(values)
            per_row = outputs.setdefault(name, [None] * len(features))
            for j, row in enumerate(rows):
                cut = values[j, : lengths[row]] if name in task.sequence_outputs else values[j]
                per_row[row] = cut
        done += len(rows)
        if progress is not None:
            progress(done)
    return outputs


def model_inputs(task, features: Features, batch_size: int, buckets):
    """`(rows, padded batch, model inputs)` of each inference batch over `features`: rows
    sorted by length, padded to `buckets`, filled to a multiple of the devices (on an
    accelerator, to `batch_size`: see `full_batch_rows`)."""
    multiple = full_batch_rows(batch_size)
    for rows in inference_batches(features.lengths(), batch_size):
        batch = pad_batch(features, fill_rows(rows, multiple), buckets)
        inputs, _, _ = task.make_batch(batch, training=False, rng=None)
        yield rows, batch, inputs


def _predict_batch(model, inputs: dict):
    """`predict_on_batch`, or on TensorFlow's own kernels a call traced once for all shapes.

    Keras' predict function retraces for a batch's second shape and once more for
    a relaxed one: three traces, about a second of every run's first evaluation.
    """
    import keras

    if keras.backend.backend() != "tensorflow" or compiles_each_shape(model):
        return predict_global_batch(model, inputs)
    import tensorflow as tf

    if tf.distribute.has_strategy():  # Keras splits the batch over the replicas
        return predict_global_batch(model, inputs)
    call = _TRACED_CALLS.get(model)
    if call is None:
        signature = {
            name: tf.TensorSpec(
                [None] * np.ndim(value), tf.as_dtype(np.asarray(value).dtype), name=name
            )
            for name, value in inputs.items()
        }
        call = tf.function(
            lambda batch: model(batch, training=False), input_signature=[signature], autograph=False
        )
        _TRACED_CALLS[model] = call
    return tf.nest.map_structure(np.asarray, call(inputs))


_TRACED_CALLS = weakref.WeakKeyDictionary()  # model -> its inference call, traced once


def predict_examples(
    task, model, examples: list, batch_size: int, buckets, progress=None
) -> list[dict]:
    """Featurize, run and decode: user-facing predictions, one per example.

    `progress`, if given, is called with the fraction of model rows done.
    """
    if not examples:
        return []
    features = task.featurize(examples, training=False)
    report = None if progress is None else (lambda done: progress(done / len(features)))
    outputs = predict_rows(task, model, features, batch_size, buckets, report)
    return task.decode(examples, features, outputs)
