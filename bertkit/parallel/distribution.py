"""Data-parallel training, on the engine the Keras backend provides.

`training.distribution` picks it: `auto` spreads each batch over the
devices when there are several (the accelerators, else the CPU devices:
normally one a process; on JAX those of all the processes of a multi-process
job, see `bertkit.parallel.multi_process`), `data_parallel` (`mirrored` is its
TensorFlow name) always,
even over one device, `one_device` never. On JAX that is
`keras.distribution.DataParallel` (variables replicated, each batch sharded on
its first axis, gradients reduced by XLA), on TensorFlow
`tf.distribute.MirroredStrategy`. No collective is written here.

`batch_size` stays the global batch: each of N devices gets `batch_size / N`
rows. A batch whose row count does not divide by N (the last one of an epoch,
a micro-batch, an inference batch) gets filler rows of weight 0, see
`bertkit.batching.steps`.
"""

from __future__ import annotations

import contextlib
import math

from bertkit.errors import UserError


def devices_sharing_a_batch() -> int:
    """How many devices the current Keras distribution splits a batch over (1: none)."""
    import keras

    if keras.backend.backend() != "jax":
        return 1  # tf.distribute splits uneven batches itself
    distribution = keras.distribution.distribution()
    if distribution is None:
        return 1
    mesh = distribution.device_mesh
    return int(mesh.shape[mesh.axis_names.index(distribution.batch_dim_name)])


def on_accelerator() -> bool:
    """Whether Keras computes on GPUs or TPUs (JAX's default backend; TensorFlow's GPUs)."""
    import keras

    if keras.backend.backend() == "jax":
        import jax

        return jax.default_backend() != "cpu"
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return bool(tf.config.list_logical_devices("GPU"))
    return False


def full_batch_rows(batch_rows: int) -> int:
    """The multiple a batch's row count is filled to (with filler rows of weight 0; their
    outputs are dropped): the devices sharing it, and on an accelerator all `batch_rows`.

    Why on an accelerator: each new input shape compiles a program there (20-35 s for
    BERT-base on a GPU), and the short last batch of an epoch or of an evaluation is
    such a shape; computing its filler rows once costs a few milliseconds. On a CPU,
    computing them costs more than compiling a small program, so short batches stay.
    """
    devices = devices_sharing_a_batch()
    return math.lcm(devices, batch_rows) if on_accelerator() else devices


def data_parallel_devices(training, source: str | None = None) -> list[str] | None:
    """The devices `training.distribution` spreads each batch over, or None for one device.

    Raises a `UserError` naming the key when a multi-process job is asked to train on one
    device. The batch options are checked against the devices by the caller
    (`bertkit.batching.plan.BatchPlan.check_devices`).
    """
    import keras

    from bertkit.parallel.multi_process import check_tensorflow_config, process_count

    if keras.backend.backend() == "tensorflow":
        check_tensorflow_config()  # before tf.distribute reads it
    devices = batch_devices(keras.backend.backend())
    kind = training.distribution
    if kind == "one_device" and process_count() > 1:
        raise UserError(
            f"cannot train on one device in a job of {process_count()} processes; "
            "use auto or data_parallel",
            source=source,
            key="training.distribution",
        )
    if kind == "one_device" or (kind == "auto" and len(devices) < 2):
        return None
    return devices


def data_parallel_scope(devices: list[str] | None):
    """The context to build and train a run's model in: data parallel over `devices`
    (from `data_parallel_devices`), or nothing for one device."""
    import keras

    if not devices:
        return contextlib.nullcontext()
    if keras.backend.backend() == "jax":
        # Each process feeds its own share of every batch (bertkit.batching), already
        # split: Keras's sharding of a tf.data input across processes is not wanted.
        return keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False).scope()
    import tensorflow as tf

    return tf.distribute.MirroredStrategy(devices=devices).scope()


def batch_devices(backend: str) -> list[str]:
    """The devices a batch can be spread over: the accelerators, else the CPU devices (one
    a process, unless XLA or TensorFlow was told to show the CPU as several). On JAX, those
    of every process of a multi-process job (see `bertkit.parallel.multi_process`)."""
    if backend == "jax":
        import jax

        return [f"{device.platform}:{device.id}" for device in jax.devices()]
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    return [device.name for device in gpus or tf.config.list_logical_devices("CPU")]
