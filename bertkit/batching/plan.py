"""The batch plan: every option that shapes a training batch, and the rules that tie them.

A run's batches follow from `training.batch_size`, `batch_order`, `micro_batches`,
`packing` and `bucket_lengths`, from the backend (does each new input shape compile a
program?) and from the devices that share a batch. `BatchPlan` holds them together and
is the one place that checks them against each other: `check_recipe` at recipe time
(line numbers, no TensorFlow), `from_recipe` once the backend and devices are known.
The plan then hands out what a run trains on: `training_batches` (the steps of every
epoch) and `model_to_fit` (the task's model, or the same layers taking packed rows).

Each way of making batches is a small strategy class (as spaCy's batchers are): an
order decides which rows form each step (`bertkit.batching.orders`: `LengthBuckets`,
`RandomMicroBatches`), a layout turns a step's rows into arrays
(`bertkit.batching.layouts`: `PaddedSteps`, `PackedSteps`), and
`bertkit.batching.steps.TrainingBatches` makes the steps. The training loop never learns
how batches are made.

Example:
    >>> plan = BatchPlan(batch_size=32, buckets=(16, 32, 64), order="random",
    ...                  micro_batches=4)
    >>> plan.pad_lengths, type(plan.order_strategy(np.array([5, 40]))).__name__
    ((16, 32, 64), 'RandomMicroBatches')
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bertkit.batching.packing import packed_row_counts
from bertkit.errors import UserError
from bertkit.padding import accelerator_buckets, bucket_lengths, padding_lengths
from bertkit.parallel.multi_process import process_count


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """How a run's training batches are made.

    Attributes:
        batch_size: rows per update (the global batch, over all devices).
        buckets: the lengths that group rows in `length_buckets` order.
        pad_lengths: the widths a step is padded to (default: `buckets`; see
            `bertkit.padding.padding_lengths`).
        order: `length_buckets` or `random`.
        micro_batches: steps each batch is split into (gradients accumulated).
        packing: steps packed into long rows (`bertkit.batching.packing`).
        unpacked_because: why `training.packing: auto` did not pack (None: it packs, or
            the recipe said false; `bertkit.batching.packing_choice`).
        packed_row_counts: numbers of packed rows a step may have (None: any).
        fixed_packing_epochs: on an accelerator, the run's epochs: packed steps then all
            have one shape (`PackedSteps.fixed_over` those epochs); 0: not fixed.
        row_multiple: each step's rows are filled to a multiple of it (filler rows weigh
            nothing): the devices sharing it, or on an accelerator the whole batch.
        seed: the data order's seed.
        devices: the devices sharing each step (packed steps have a multiple of packed rows).
    """

    batch_size: int
    buckets: tuple[int, ...]
    pad_lengths: tuple[int, ...] = ()
    order: str = "length_buckets"
    micro_batches: int = 1
    packing: bool = False
    unpacked_because: str | None = None
    packed_row_counts: tuple[int, ...] | None = None
    fixed_packing_epochs: int = 0
    row_multiple: int = 1
    seed: int = 0
    devices: int = 1

    def __post_init__(self):
        if self.order not in ("length_buckets", "random"):
            raise ValueError(f"unknown batch order {self.order!r}")
        object.__setattr__(self, "buckets", tuple(self.buckets))
        object.__setattr__(self, "pad_lengths", tuple(self.pad_lengths or self.buckets))

    # ---- the rules
    @staticmethod
    def check_recipe(training, task_class, error, spans_batch: bool = False, options=None) -> None:
        """The rules between a recipe's batch options; `error(message, key)` makes the
        `UserError` (with the recipe's line) for `training.<key>`. `spans_batch`: the
        task's loss reads the whole batch (`Task.loss_spans_batch`); `options`: the task's,
        for `Task.cannot_pack`."""
        if spans_batch and training.micro_batches > 1:
            raise error(
                f"the {task_class.name} task's loss reads the whole batch (in-batch "
                "negatives), and each micro-batch would see only its own rows; set "
                "micro_batches to 1 (gradient_accumulation_steps keeps batch_size rows a step)",
                "micro_batches",
            )
        if training.micro_batches > 1 and training.batch_order == "length_buckets":
            raise error(
                "micro_batches needs batch_order: random (length-bucketed batches "
                "are padded alike already)",
                "micro_batches",
            )
        if training.micro_batches > training.batch_size:
            raise error(
                f"cannot split batches of {training.batch_size} rows into "
                f"{training.micro_batches} micro-batches",
                "micro_batches",
            )
        why = training.packing is True and task_class.cannot_pack(options)
        if why:
            raise error(
                f"the {task_class.name} task cannot pack rows (packing: true): {why}", "packing"
            )

    @staticmethod
    def check_devices(
        training, devices: int, backend: str, source=None, spans_batch: bool = False
    ) -> None:
        """The rules once a distribution spreads a batch over `devices` devices (one too);
        `spans_batch`: the loss reads its batch (JAX's: all of it; a TF replica's: a share)."""
        if spans_batch and backend == "tensorflow" and devices > 1:
            raise _replicas_split_the_batch(devices, source)
        for key in ("batch_size", "eval_batch_size"):
            size = getattr(training, key)
            if size is not None and size % devices:
                raise UserError(
                    f"{size} rows do not split evenly over {devices} devices; use "
                    f"a multiple of {devices}",
                    source=source,
                    key=f"training.{key}",
                )
        processes = process_count()
        if training.packing is True and (backend != "jax" or processes > 1):
            # a multi-process job cannot train on one device (data_parallel_devices)
            where, or_else = (
                (f"{processes} processes", "")
                if backend == "jax"
                else (backend, " or distribution: one_device")
            )
            raise UserError(
                f"packed batches train over several devices on JAX in one process, not "
                f"with {where}; set training.packing to false{or_else}",
                source=source,
                key="training.packing",
            )
        if backend == "tensorflow" and (
            training.gradient_accumulation_steps * training.micro_batches > 1
        ):
            raise UserError(
                "Keras cannot accumulate gradients under tf.distribute; set "
                "training.gradient_accumulation_steps and training.micro_batches "
                "to 1, use distribution: one_device, or the JAX backend",
                source=source,
                key="training.gradient_accumulation_steps",
            )

    @classmethod
    def from_recipe(
        cls,
        recipe,
        *,
        compiles_each_shape: bool,
        row_multiple: int = 1,
        devices: int = 1,
        buckets=None,
        accelerator: bool = False,
        packing=None,
    ) -> BatchPlan:
        """The plan of `recipe`'s run.

        Args:
            recipe: a `bertkit.recipes.recipe.Recipe` (its rules were checked when it loaded).
            compiles_each_shape: each new input shape compiles a program (JAX, XLA).
            row_multiple, devices: as the attributes. buckets: a features file's.
            accelerator: on a GPU or TPU (`accelerator_buckets`, one packed shape).
            packing: the run's `bertkit.batching.packing_choice.PackingChoice` (None: packed
                only where the recipe says `packing: true`).
        """
        training = recipe.training
        buckets = _run_buckets(recipe, buckets, accelerator and compiles_each_shape)
        packs = training.packing is True if packing is None else packing.packs
        packed = compiles_each_shape and packs  # into few shapes
        return cls(
            batch_size=training.batch_size,
            buckets=buckets,
            pad_lengths=padding_lengths(buckets, compiles_each_shape),
            order=batch_order(training.batch_order),
            micro_batches=training.micro_batches,
            packing=packs,
            unpacked_because=packing and packing.why_not,
            packed_row_counts=packed_row_counts(training.batch_size, devices) if packed else None,
            fixed_packing_epochs=training.epochs if packed and accelerator else 0,
            row_multiple=row_multiple,
            seed=training.seed,
            devices=devices,
        )

    # ---- what a run trains on
    def order_strategy(self, lengths: np.ndarray):
        """Which rows form each step of an epoch, for rows of these token counts."""
        from bertkit.batching.orders import LengthBuckets, RandomMicroBatches

        if self.order == "random":
            return RandomMicroBatches(
                lengths, self.batch_size, self.seed, self.micro_batches, self.pad_lengths
            )
        return LengthBuckets(lengths, self.batch_size, self.buckets, self.seed)

    def layout(self):
        """How a step's rows become arrays: padded, or packed."""
        from bertkit.batching.layouts import PackedSteps, PaddedSteps

        if self.packing:
            return PackedSteps(self.pad_lengths, self.packed_row_counts)
        return PaddedSteps(self.pad_lengths)

    def training_batches(self, task, features):
        """The steps of every epoch over `features`, made by `task` (`TrainingBatches`)."""
        from bertkit.batching.steps import TrainingBatches

        return TrainingBatches(task, features, self)

    def model_to_fit(self, model, backbone):
        """What `fit` trains: `model`, or with packing the same layers taking packed rows."""
        return self.layout().model_to_fit(model, backbone)


def batch_order(setting: str) -> str:
    """The order of a run's batches for `training.batch_order` = `setting`: `auto` is
    random, as transformers' Trainer draws rows, for every task. Length buckets pad least
    where a batch is not packed, but scored 4.8 CoNLL-2003 F1 less at 1,000 sentences and
    5.5 SQuAD F1 less at 4,000 questions (docs/benchmarks/accuracy.md): the few updates of
    a small budget learn worse from batches of rows of one length. `length_buckets` stays a
    choice for speed.

    Example:
        >>> batch_order("auto"), batch_order("length_buckets")
        ('random', 'length_buckets')
    """
    return "random" if setting == "auto" else setting


def _run_buckets(recipe, buckets, compiling_accelerator: bool) -> tuple[int, ...]:
    """The bucket lengths of the run (`buckets`: a features file's), or of an accelerator
    that compiles each shape, `accelerator_buckets` where the recipe sets none."""
    training = recipe.training
    buckets = tuple(
        buckets or bucket_lengths(recipe.backbone.sequence_length, training.bucket_lengths)
    )
    if compiling_accelerator and training.bucket_lengths is None:
        return accelerator_buckets(buckets)
    return buckets


def _replicas_split_the_batch(devices: int, source) -> UserError:
    return UserError(
        f"this task's loss reads the whole batch (in-batch negatives), and each of "
        f"TensorFlow's {devices} replicas would see only its share; use the JAX "
        "backend or distribution: one_device",
        source=source,
        key="training.distribution",
    )
