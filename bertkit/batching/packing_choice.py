"""Whether a run packs its training batches: `training.packing: auto | true | false`.

Packing is exact (`bertkit.batching.packing`: with dropout off the packed model computes every
row's outputs as the padded model does), so `auto`, the default, packs wherever bertkit can:
tagging and classification on one device, or on several devices of one JAX process. It does
not where packing is not supported, and says why: the task or its options (span QA's loss
spans the window, a CRF would read a packed row as one sentence), a feature-based backbone
(packed training reads the last layer only), TensorFlow over several devices, or several
processes. `true` asks for packing and makes each of those an error; `false` never packs.

Example:
    >>> from types import SimpleNamespace
    >>> tagging = SimpleNamespace(packs=True, cannot_pack=lambda options: None)
    >>> choose_packing("auto", tagging, None, backend="tensorflow", devices=1)
    PackingChoice(packs=True, why_not=None)
    >>> choose_packing("auto", tagging, None, backend="tensorflow", devices=2).why_not
    'packed batches train over several devices on JAX in one process, not with tensorflow'
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class PackingChoice:
    """`packs`: the run's training batches are packed; `why_not`: why not, when `auto`
    chose so (None when it packs, or when the recipe said `packing: false`)."""

    packs: bool
    why_not: str | None = None


def choose_packing(
    setting,
    task_class,
    options,
    *,
    backend: str,
    devices: int,
    processes: int = 1,
    feature_based: bool = False,
) -> PackingChoice:
    """The run's `PackingChoice` for `training.packing` = `setting` (True, False or "auto");
    a True setting where packing cannot be is caught earlier, with the recipe's line
    (`BatchPlan.check_recipe`, `check_devices`), so here it packs."""
    if setting is False:
        return PackingChoice(False)
    if setting is True:
        return PackingChoice(True)
    why_not = task_cannot_pack(task_class, options, feature_based) or devices_cannot_pack(
        backend, devices, processes
    )
    return PackingChoice(why_not is None, why_not)


def task_cannot_pack(task_class, options, feature_based: bool = False) -> str | None:
    """Why this task, with these options and backbone, trains unpacked (None: it can pack)."""
    why = task_class.cannot_pack(options)
    if why:
        return f"the {task_class.name} task cannot pack rows: {why}"
    if feature_based:
        return "packed training reads the last layer only, and backbone.features reads others"
    return None


def devices_cannot_pack(backend: str, devices: int, processes: int = 1) -> str | None:
    """Why training over `devices` devices in `processes` processes on `backend` trains
    unpacked (None: it can pack): several devices pack on JAX in one process only."""
    if processes > 1:
        return f"packed batches train in one process, not {processes}"
    if backend != "jax" and devices > 1:
        return (
            f"packed batches train over several devices on JAX in one process, not with {backend}"
        )
    return None


def run_packing(recipe) -> PackingChoice:
    """The `PackingChoice` of `recipe`'s run on this backend, in the distribution in force
    (`bertkit.training.run_steps.batch_plan` asks inside the run's device scope)."""
    import keras

    from bertkit.parallel.distribution import devices_sharing_a_batch
    from bertkit.parallel.multi_process import process_count

    backend = keras.backend.backend()
    devices = devices_sharing_a_batch() if backend == "jax" else _tensorflow_replicas()
    return choose_packing(
        recipe.training.packing,
        recipe.task_class(),
        recipe.task_options,
        backend=backend,
        devices=devices,
        processes=process_count(),
        feature_based=recipe.backbone.features is not None,
    )


def _tensorflow_replicas() -> int:
    import tensorflow as tf

    return tf.distribute.get_strategy().num_replicas_in_sync if tf.distribute.has_strategy() else 1
