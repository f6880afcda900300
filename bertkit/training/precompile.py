"""Every program a JAX run needs, compiled before its first step.

On JAX each new input shape compiles an XLA program the first time `fit` or an
evaluation meets it: 20-35 s for BERT-base on a GPU, so an epoch stalls whenever a new
bucket width or a short last batch comes up. Before `fit`, bertkit lists the distinct
shapes of every training step of the run (from the rows' token counts alone: the
plan's widths and row counts) and of the validation batches, lowers Keras' own training
and prediction steps for one batch of each shape, and compiles them side by side
(XLA compiles without holding Python's GIL). The programs go to JAX's persistent
compilation cache (`bertkit.training.compilation`), where `fit` and the evaluations
then find them, so no step after the first waits for a compiler.

This reaches into Keras' JAX trainer: `train_step(state, data)` and `predict_step` are
the pure functions Keras jits in `make_train_function`/`make_predict_function`, and
`_symbolic_build` creates the metric variables `fit` would create first. A program is
only reused when its lowered module is identical, so a Keras upgrade that changes how
it jits these steps shows as `from_cache` falling short of the programs precompiled
(tested in tests/test_compilation.py).
"""

from __future__ import annotations

import concurrent.futures
import os
import time

import numpy as np

from bertkit.padding import fill_rows


def compile_programs(built, epochs: range, phases) -> dict | None:
    """Every training and validation program of `epochs` of `built` (a
    `bertkit.training.run_steps.BuiltRun`), compiled into the compilation cache before
    the first step (`precompile`), timed as the `precompile` phase.

    Only where it pays and is exact: on JAX with XLA, with the compilation cache on
    (`fit` reads the programs from it), on one device in one process. Returns what
    was compiled, or None.
    """
    import keras

    from bertkit.parallel.distribution import devices_sharing_a_batch
    from bertkit.parallel.multi_process import process_count

    if (
        keras.backend.backend() != "jax"
        or not built.trained.jit_compile
        or not epochs
        or devices_sharing_a_batch() > 1
        or process_count() > 1
    ):
        return None
    import jax

    if not jax.config.jax_compilation_cache_dir:
        return None
    with phases("precompile"):
        return precompile(built, epochs)


def step_shapes(batches, epochs: range) -> dict[tuple, tuple[int, int]]:
    """Shape key -> the first (epoch, step) of that shape, over `epochs` of `batches`
    (a `bertkit.batching.steps.TrainingBatches`)."""
    first: dict[tuple, tuple[int, int]] = {}
    for epoch in epochs:
        for step, rows in enumerate(batches.step_rows(epoch)):
            filled = fill_rows(rows, batches.row_multiple)  # as the step is made
            key = batches.layout.step_shape(batches.lengths[filled], len(rows))
            first.setdefault(key, (epoch, step))
    return first


def precompile(built, epochs: range, threads: int | None = None) -> dict:
    """Compiles the training step of every shape of `epochs` and the prediction step of
    every validation batch shape of `built` (a `bertkit.training.run_steps.BuiltRun`).

    Returns `{"programs": compiled, "seconds": wall seconds}` for `run.json`.
    """
    import jax

    started = time.perf_counter()
    batches, trained = built.batches, built.trained
    samples = [batches.batch(step, epoch) for epoch, step in step_shapes(batches, epochs).values()]
    batches.set_epoch(epochs.start)
    trained._symbolic_build(data_batch=samples[0])  # the metric variables `fit` reads
    lowered = [_lower_train_step(jax, trained, batch) for batch in samples]
    if built.validation is not None:
        lowered += [
            _lower_predict_step(jax, built.model, inputs)
            for inputs in built.validation.distinct_inputs()
        ]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = threads or min(len(lowered), cores or 1)  # a seed side by side has a share
    with concurrent.futures.ThreadPoolExecutor(max(threads, 1)) as pool:
        list(pool.map(lambda program: program.compile(), lowered))
    return {"programs": len(lowered), "seconds": round(time.perf_counter() - started, 3)}


def _lower_train_step(jax, model, batch):
    """Keras' training step lowered as `make_train_function` jits it (no distribution)."""
    state = (
        _values(model.trainable_variables),
        _values(model.non_trainable_variables),
        _values(model.optimizer.variables),
        _values(model.metrics_variables),
    )
    return jax.jit(model.train_step, donate_argnums=0).lower(state, _arrays(batch))


def _lower_predict_step(jax, model, inputs):
    """Keras' prediction step lowered as `make_predict_function` jits it."""

    def predict_step(state, data):  # the name Keras' own wrapper has: same module
        outputs, non_trainable_variables = model.predict_step(state, data)
        return outputs, (state[0], non_trainable_variables)

    state = (_values(model.trainable_variables), _values(model.non_trainable_variables))
    return jax.jit(predict_step, donate_argnums=0).lower(state, (_arrays(inputs),))


def _values(variables) -> list:
    return [variable.value for variable in variables]


def _arrays(tree):
    """NumPy leaves as the JAX arrays Keras' data adapter makes of them."""
    import jax

    return jax.tree_util.tree_map(lambda value: jax.numpy.asarray(np.asarray(value)), tree)
