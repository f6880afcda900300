"""A fine-tuning run as public, named steps: prepare -> build -> fit -> finish.

`bertkit.finetune` is a short script over these steps (`bertkit.training.trainer`), and so is any
tool that needs part of a run as `finetune` makes it (the benchmarks time `build`'s model).

- `prepare` (`bertkit.training.task_data.TaskData`): the task, the backbone and the featurized
  data, from the data files or a features file.
- `build`: the batch plan and its batches, the task's model with its head, the model
  `fit` trains (compiled, optimizer built) and the validation split.
- `fit`: Keras `fit` with the run's callbacks (`fit_callbacks`), resumable mid-epoch
  (`bertkit.training.checkpointing`).
- `finish`: the best weights, calibration, test metrics, report, artifacts, export.

Example (a tiny random backbone and generated data; 32 rows in batches of 8):
    >>> import tempfile; from pathlib import Path
    >>> from bertkit.recipes.recipe import load_recipe
    >>> from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = write_tiny_checkpoint(folder / "tiny")
    >>> _ = write_sentiment_tsv(folder / "train.tsv", 32)
    >>> recipe = load_recipe({"schema": 1, "task": "classification",
    ...     "backbone": {"preset": str(folder / "tiny"), "sequence_length": 32},
    ...     "data": {"train": str(folder / "train.tsv"), "text": "sentence"},
    ...     "training": {"batch_size": 8}})
    >>> built = build(recipe, prepare(recipe))  # doctest: +ELLIPSIS
    loading the backbone ...
    featurizing 32 training and 0 validation examples...[UNK]: 0.0% of ... word pieces
    >>> len(built.batches), built.plan.packing, built.trained is built.model  # packed model
    (4, True, False)
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time

from bertkit.model.lora import enable_lora, finish_lora
from bertkit.recipes.recipe import Recipe
from bertkit.run_dir import RUNNING, RunDirectory, read_json
from bertkit.training.preemption import SigtermWatch
from bertkit.training.run_results import (  # public here too: tests patch `export_run` here
    export_run,
    final_evaluation,
    record_finished,
    write_results,
)
from bertkit.training.task_data import TaskData


# ---- prepare: `TaskData` (bertkit.training.task_data)
def prepare(recipe: Recipe, *, features=None, state: dict | None = None, phases=None) -> TaskData:
    """Step 1: the task, backbone and featurized data, from the data files or `features`."""
    if features:
        from bertkit.training.phases import Phases

        with (phases or Phases())("read"):
            return TaskData.from_file(recipe, features)
    return TaskData.read(recipe, state, phases)


# ---- build
@dataclasses.dataclass
class BuiltRun:
    """What `build` makes: the model and batches of a run, ready for `fit`."""

    data: TaskData
    plan: object  # bertkit.batching.plan.BatchPlan
    batches: object  # bertkit.batching.steps.TrainingBatches
    model: object  # the task's model: evaluation, best weights, export
    trained: object  # what `fit` trains: `model`, or its packed form; compiled
    validation: object  # bertkit.training.validation.ValidationSplit, or None
    precompiled: dict | None = None  # what `compile_programs` compiled before `fit`


def build(recipe: Recipe, data: TaskData, *, phases=None) -> BuiltRun:
    """Step 2: batch plan and batches, the model with its head, compiled, and the
    validation split (timed as `build_model`)."""
    from bertkit.training.optimization import head_variables, make_optimizer
    from bertkit.training.phases import Phases
    from bertkit.training.validation import ValidationSplit

    training, phases, task = recipe.training, phases or Phases(), data.task
    with phases("build_model"):
        jit_compile = jit_compile_setting(training.jit_compile)
        plan = batch_plan(recipe, tuple(data.description["bucket_lengths"]))
        batches = plan.training_batches(task, data.train_features)
        backbone = data.pretrained.backbone
        model = task_model(recipe, data)
        trained, head = plan.model_to_fit(model, backbone), head_variables(model, backbone)
        rates = task.learning_rates(model)
        trained.compile(
            optimizer=make_optimizer(training, len(batches), head, rates, backbone),
            loss=task.loss(),
            weighted_metrics=task.metrics(),  # plain `metrics` get no weights
            jit_compile=jit_compile,
        )
        # Built here, not in the first traced step (Keras' way without a tf.distribute
        # strategy), the optimizer's slots do not make TensorFlow trace the step twice.
        trained.optimizer.build(trained.trainable_variables)
    validation = None
    if data.validation:
        validation = ValidationSplit(
            task,
            data.validation,
            data.validation_features,
            training.eval_batch_size or 2 * training.batch_size,
            plan.pad_lengths,
            phases,
        )
    return BuiltRun(data, plan, batches, model, trained, validation)


def task_model(recipe: Recipe, data: TaskData):
    """The task's model as the recipe makes it, before `plan` shares its layers (resume)."""
    from bertkit.model.feature_layers import build_on_features, freeze_as_configured
    from bertkit.model.reinitialize import reinitialize_top_layers

    training, backbone, task = recipe.training, data.pretrained.backbone, data.task
    model = build_on_features(task, backbone, recipe.backbone.features, recipe.source)
    task.initialize_head(model, data.pretrained.checkpoint_tensors())
    reinitialize_top_layers(backbone, training.reinit_top_layers, training.seed, recipe.source)
    data.description = enable_lora(model, backbone, training.lora, data.description)
    data.description = freeze_as_configured(backbone, recipe.backbone, data.description)
    return model


def batch_plan(recipe: Recipe, buckets=None):
    """The `BatchPlan` of `recipe`'s run on this backend and these devices."""
    import keras

    from bertkit.batching.packing_choice import run_packing
    from bertkit.batching.plan import BatchPlan
    from bertkit.parallel import distribution

    training = recipe.training
    compiles = bool(jit_compile_setting(training.jit_compile))
    compiles = compiles or keras.backend.backend() == "jax"
    rows = devices = distribution.devices_sharing_a_batch()
    if compiles and training.micro_batches == 1:  # micro-batches have row counts of their own
        rows = distribution.full_batch_rows(training.batch_size)
    where = dict(row_multiple=rows, devices=devices, buckets=buckets)
    where["accelerator"], where["packing"] = distribution.on_accelerator(), run_packing(recipe)
    return BatchPlan.from_recipe(recipe, compiles_each_shape=compiles, **where)


def device_scope(recipe: Recipe):
    """The context `recipe`'s model is built and trained in (`training.distribution`).

    Raises a `UserError` naming the key when the batch options do not hold over the devices.
    """
    import keras

    from bertkit.batching.plan import BatchPlan
    from bertkit.parallel.distribution import data_parallel_devices, data_parallel_scope

    devices = data_parallel_devices(recipe.training, recipe.source)
    if devices:
        spans_batch = recipe.task_class().loss_spans_batch(recipe.task_options)
        BatchPlan.check_devices(
            recipe.training, len(devices), keras.backend.backend(), recipe.source, spans_batch
        )
    return data_parallel_scope(devices)


def jit_compile_setting(setting):
    """`training.jit_compile` as Keras takes it: "auto" is XLA on a GPU and on JAX."""
    if setting != "auto":
        return setting
    import keras

    if keras.backend.backend() == "tensorflow":
        from bertkit.parallel.distribution import on_accelerator

        return on_accelerator()  # TensorFlow's GPUs
    return keras.backend.backend() == "jax"


# ---- fit
@dataclasses.dataclass
class FitSettings:
    """How `fit` runs: the run directory and who writes it, output, more callbacks."""

    run: RunDirectory
    resuming: bool = False
    writes: bool = True  # False in the processes of a multi-process job but the first
    verbose: int = 2
    callbacks: list = dataclasses.field(default_factory=list)  # after bertkit's own
    sigterm: SigtermWatch = dataclasses.field(default_factory=SigtermWatch)  # see `finetune`


def fit(
    built: BuiltRun, recipe: Recipe, settings: FitSettings, phases
) -> tuple[list[dict], int | None]:
    """Step 3: Keras `fit` of `built.trained` from the run's checkpoint (`bertkit.training.
    checkpointing`); the history and the best epoch. Evaluation, best weights: `built.model`."""
    from bertkit.parallel.multi_process import wait_for_all
    from bertkit.training.checkpointing import fit_from
    from bertkit.training.precompile import compile_programs

    run, training = settings.run, recipe.training
    if settings.resuming and read_json(run.run_file).get("trained"):
        # Killed after training (final evaluation, export): the best weights are saved.
        print(f"resuming {run.path} after training", file=sys.stderr)
        return read_json(run.metrics_file)["epochs"], read_json(run.run_file).get("best_epoch")
    callbacks, tracker, checkpoint = fit_callbacks(built, recipe, settings, phases)
    epoch, step = checkpoint.position
    if epoch or step:
        where = f"at epoch {epoch + 1} step {step}" if step else f"after epoch {epoch}"
        print(f"resuming {run.path} {where}", file=sys.stderr)
    built.precompiled = compile_programs(built, range(epoch, training.epochs), phases)
    with settings.sigterm.training():
        fit_from(
            built.trained,
            built.batches,
            callbacks,
            checkpoint,
            epochs=training.epochs,
            verbose=settings.verbose if settings.writes else 0,
        )
    if settings.writes:
        run.set_status(RUNNING, trained=True)  # then the checkpoint is not needed
        shutil.rmtree(run.checkpoint_dir, ignore_errors=True)
    wait_for_all("trained")  # the others then read the best weights process 0 saved
    settings.sigterm.stop_if_requested()
    best = tracker.best()
    return tracker.history, best and best["epoch"]


def fit_callbacks(
    built: BuiltRun, recipe: Recipe, settings: FitSettings, phases
) -> tuple[list, object, object]:
    """The callbacks of a run's `fit`, in order, its `TrackRun` (best epoch) and its
    `RunCheckpoint` (where a resumed run starts)."""
    from bertkit.serving.export import tensorflow_available
    from bertkit.training.callbacks import Evaluate
    from bertkit.training.checkpointing import RunCheckpoint
    from bertkit.training.step_callbacks import StepTensorBoard

    run, validation = settings.run, built.validation
    checkpoint = RunCheckpoint.of_run(
        run, recipe.training, writes=settings.writes, sigterm=settings.sigterm
    )
    callbacks, record_steps = _step_callbacks(built, recipe.training, settings, checkpoint, phases)
    if validation:
        callbacks.append(
            Evaluate(
                lambda _: validation.evaluate(built.model), "evaluating on the validation split"
            )
        )
    tracker = _track_run(built, recipe.training, settings, checkpoint)
    callbacks += [tracker, checkpoint]  # restores the epoch's state after the others' resets
    callbacks += settings.callbacks  # after Evaluate and TrackRun: the epoch is recorded
    if settings.writes and tensorflow_available():  # Keras logs TensorBoard with tf.summary
        callbacks.append(StepTensorBoard(str(run.logs_dir), record_steps))
    return callbacks, tracker, checkpoint


def _step_callbacks(built: BuiltRun, training, settings: FitSettings, checkpoint, phases):
    """The per-step callbacks (epoch setting, the non-finite loss stop, step timing; writing:
    the step records and progress lines, kept in the checkpoint) and the `RecordSteps`."""
    from bertkit.training.callbacks import SetEpoch, StopOnNonFiniteLoss
    from bertkit.training.step_callbacks import RecordSteps, TimeSteps, TrainingProgress

    steps = len(built.batches)
    callbacks = [
        SetEpoch(built.batches),
        StopOnNonFiniteLoss(training.learning_rate),
        TimeSteps(phases),
    ]
    record_steps = RecordSteps(settings.run.path / "steps.json", steps, log_every(steps))
    if settings.writes:
        callbacks.append(record_steps)
        checkpoint.keeps["steps"] = record_steps
        if settings.verbose == 2:  # not a terminal: Keras prints one line per epoch, at its end
            callbacks.append(
                TrainingProgress(
                    steps, training.epochs, training.batch_size / training.micro_batches
                )
            )
            checkpoint.keeps["progress"] = callbacks[-1]
    return callbacks, record_steps


def _track_run(built: BuiltRun, training, settings: FitSettings, checkpoint):
    """The `TrackRun` of validation's metric (else the loss), from the epochs run so far."""
    from bertkit.training.averaging import epoch_window
    from bertkit.training.callbacks import TrackRun

    task, validation, run = built.data.task, built.validation, settings.run
    finished, patience = checkpoint.position[0], training.early_stopping_patience  # resumed
    monitor, mode = (f"val_{task.monitor}", task.mode) if validation else ("loss", "min")
    return TrackRun(
        run,
        monitor,
        mode,
        patience,
        _finished_epochs(run, finished),
        on_best=validation and validation.keep_latest,
        writes=settings.writes,
        weights_of=built.model,
        floor=validation.floor() if validation and patience else None,
        average=epoch_window(run, training, finished, settings.writes),
    )


def _finished_epochs(run: RunDirectory, epochs: int) -> list[dict]:
    """The records of a resumed run's first `epochs` epochs, from `metrics.json`."""
    if not epochs or not run.metrics_file.exists():
        return []
    return read_json(run.metrics_file)["epochs"][:epochs]


def log_every(steps_per_epoch: int) -> int:
    """Steps between records of the loss and learning rate: about 50 per epoch."""
    return max(1, steps_per_epoch // 50)


# ---- finish
def finish(
    built: BuiltRun,
    recipe: Recipe,
    settings: FitSettings,
    phases,
    *,
    history: list,
    best_epoch: int | None,
    started: float,
    from_features: bool,
    compiled=None,
):
    """Step 4: the best weights, calibrated on validation; test metrics; then (in the
    writing process) metrics, report, the task's artifacts and the SavedModel.
    `compiled` (a `CompileCounter`) goes to `run.json`. Returns the `FineTunedModel`."""
    run = settings.run
    with phases("final_evaluation"):
        finetuned, final, predictions = final_evaluation(
            built, recipe, settings, best_epoch, from_features
        )
    if not settings.writes:
        return finetuned
    with phases("report"):
        write_results(run, recipe, built.data, history, final, time.time() - started, predictions)
        backbone = finish_lora(built.model, built.data.pretrained.backbone, run.model_dir)
        built.data.task.write_artifacts(backbone, run.path)
    with phases("export"):
        export_run(run, finetuned, recipe.export)
    record_finished(run, phases, compiled, built.precompiled)
    return finetuned
