"""Inference on a batch sharded over the devices of several processes: each process feeds its
share (`bertkit.parallel.multi_process.process_share`) and reads the outputs of every row."""

from __future__ import annotations

import weakref

from bertkit.parallel.multi_process import process_count, process_share


def predict_global_batch(model, inputs: dict):
    """`model.predict_on_batch(inputs)`; across processes, each feeds its share of `inputs`
    and receives the outputs of every row.

    Keras's `predict_on_batch` returns NumPy arrays, which a batch sharded over
    other processes' devices cannot become; here the jitted call returns its
    outputs replicated on every device, so each process can read them all.
    """
    if process_count() == 1:
        return model.predict_on_batch(inputs)
    import jax
    import keras
    import numpy as np

    distribution = keras.distribution.distribution()
    share = process_share(len(next(iter(inputs.values()))))
    arrays = {
        name: jax.make_array_from_process_local_data(
            distribution.get_data_layout(np.shape(value)).backend_layout, np.asarray(value)[share]
        )
        for name, value in inputs.items()
    }
    trainable = [variable.value for variable in model.trainable_variables]
    non_trainable = [variable.value for variable in model.non_trainable_variables]
    outputs = _replicated_call(model)(trainable, non_trainable, arrays)
    return jax.tree.map(np.asarray, outputs)


_REPLICATED_CALLS = weakref.WeakKeyDictionary()  # model -> its jitted inference call


def _replicated_call(model):
    """The model's inference call, jitted once per model, its outputs on every device."""
    call = _REPLICATED_CALLS.get(model)
    if call is None:
        import jax
        import keras

        mesh = keras.distribution.distribution().device_mesh.backend_mesh
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

        def infer(trainable, non_trainable, inputs):
            outputs, _ = model.stateless_call(trainable, non_trainable, inputs, training=False)
            return outputs

        call = _REPLICATED_CALLS[model] = jax.jit(infer, out_shardings=replicated)
    return call
