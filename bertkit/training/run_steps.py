"""A fine-tuning run as public, named steps: prepare -> build -> fit -> finish.

`bertkit.finetune` is a short script over these steps (`bertkit.training.trainer`), and so is
any tool that needs part of a run as `finetune` makes it: the benchmarks time `build`'s
compiled model on `prepare`'s data instead of copying how it is made.

- `prepare` (`bertkit.training.task_data.TaskData`): the task, the backbone and the featurized
  data, from the data files or a features file.
- `build`: the batch plan and its batches, the task's model with its head, the model
  `fit` trains (compiled, optimizer built) and the validation split.
- `fit`: Keras `fit` with the run's callbacks (`fit_callbacks`), resumable mid-epoch
  (`bertkit.training.checkpointing`).
- `finish`: the best weights, calibration, test metrics, report, artifacts, export.

Example (a tiny random backbone and generated data; 32 rows in batches of 8):
    >>> import tempfile
    >>> from pathlib import Path
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
    featurizing 32 training and 0 validation examples
    >>> len(built.batches), built.trained is built.model
    (4, True)
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time

from bertkit.model.lora import enable_lora, finish_lora
from bertkit.recipes.recipe import Recipe
from bertkit.run_dir import FINISHED, RUNNING, RunDirectory, read_json, write_json
from bertkit.training.preemption import SigtermWatch
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
    from bertkit.training.optimization import make_optimizer
    from bertkit.training.phases import Phases
    from bertkit.training.validation import ValidationSplit

    training, phases = recipe.training, phases or Phases()
    task = data.task
    with phases("build_model"):
        jit_compile = jit_compile_setting(training.jit_compile)
        plan = batch_plan(recipe, tuple(data.description["bucket_lengths"]))
        batches = plan.training_batches(task, data.train_features)
        model = task.build_model(data.pretrained.backbone)
        task.initialize_head(model, data.pretrained.checkpoint_tensors())
        data.description = enable_lora(
            model, data.pretrained.backbone, training.lora, data.description
        )  # before `plan` shares its layers
        trained = plan.model_to_fit(model, data.pretrained.backbone)
        trained.compile(
            optimizer=make_optimizer(training, len(batches)),
            loss=task.loss(),
            weighted_metrics=task.metrics(),  # plain `metrics` get no weights
            jit_compile=jit_compile,
        )
        # Without a tf.distribute strategy Keras builds the optimizer inside the first
        # traced step; the slot variables it creates there make TensorFlow trace the
        # whole training step a second time. Built here, the step is traced once.
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


def batch_plan(recipe: Recipe, buckets=None):
    """The `BatchPlan` of `recipe`'s run on this backend and these devices."""
    import keras

    from bertkit.batching.plan import BatchPlan
    from bertkit.parallel.distribution import devices_sharing_a_batch

    compiles = bool(jit_compile_setting(recipe.training.jit_compile))
    return BatchPlan.from_recipe(
        recipe,
        compiles_each_shape=compiles or keras.backend.backend() == "jax",
        row_multiple=devices_sharing_a_batch(),
        buckets=buckets,
    )


def device_scope(recipe: Recipe):
    """The context `recipe`'s model is built and trained in (`training.distribution`).

    Raises a `UserError` naming the key when the batch options do not hold over the devices.
    """
    import keras

    from bertkit.batching.plan import BatchPlan
    from bertkit.parallel.distribution import data_parallel_devices, data_parallel_scope

    devices = data_parallel_devices(recipe.training, recipe.source)
    if devices:
        BatchPlan.check_devices(
            recipe.training, len(devices), keras.backend.backend(), recipe.source
        )
    return data_parallel_scope(devices)


def jit_compile_setting(setting):
    """`training.jit_compile` as Keras takes it: "auto" is XLA on a GPU and on JAX."""
    if setting != "auto":
        return setting
    import keras

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return bool(tf.config.list_logical_devices("GPU"))
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
    """Step 3: Keras `fit` of `built.trained` with the run's callbacks, from the run's
    checkpoint (`bertkit.training.checkpointing`); the history and the best epoch.
    Evaluation and the best weights use `built.model`."""
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
    from bertkit.training.callbacks import Evaluate, SetEpoch, StopOnNonFiniteLoss, TrackRun
    from bertkit.training.checkpointing import RunCheckpoint
    from bertkit.training.step_callbacks import (
        RecordSteps,
        StepTensorBoard,
        TimeSteps,
        TrainingProgress,
    )

    training, run, writes = recipe.training, settings.run, settings.writes
    task, validation, steps = built.data.task, built.validation, len(built.batches)
    monitor, mode = (f"val_{task.monitor}", task.mode) if validation else ("loss", "min")
    checkpoint = RunCheckpoint.of_run(run, training, writes=writes, sigterm=settings.sigterm)
    callbacks = [
        SetEpoch(built.batches),
        StopOnNonFiniteLoss(training.learning_rate),
        TimeSteps(phases),
    ]
    record_steps = RecordSteps(run.path / "steps.json", steps, log_every(steps))
    if writes:
        callbacks.append(record_steps)
        checkpoint.keeps["steps"] = record_steps
        if settings.verbose == 2:  # not a terminal: Keras prints one line per epoch, at its end
            callbacks.append(
                TrainingProgress(
                    steps, training.epochs, training.batch_size / training.micro_batches
                )
            )
            checkpoint.keeps["progress"] = callbacks[-1]
    if validation:
        callbacks.append(
            Evaluate(
                lambda _: validation.evaluate(built.model), "evaluating on the validation split"
            )
        )
    tracker = TrackRun(
        run,
        monitor,
        mode,
        training.early_stopping_patience,
        _finished_epochs(run, checkpoint.position[0]),
        on_best=validation and validation.keep_latest,
        writes=writes,
        weights_of=built.model,
    )
    callbacks += [tracker, checkpoint]  # restores the epoch's state after the others' resets
    callbacks += settings.callbacks  # after Evaluate and TrackRun: the epoch is recorded
    if writes and tensorflow_available():  # Keras logs TensorBoard with tf.summary, any backend
        callbacks.append(StepTensorBoard(str(run.logs_dir), record_steps))
    return callbacks, tracker, checkpoint


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
    from bertkit.serving.finetuned import FineTunedModel
    from bertkit.training.weights import load_model_weights

    run, model, validation = settings.run, built.model, built.validation
    description, predictions = built.data.description, None
    with phases("final_evaluation"):
        load_model_weights(model, run.weights_file)
        final = {}
        if validation:
            final["validation"], description, predictions = calibrate(
                validation, model, description, best_epoch, run if settings.writes else None
            )
        finetuned = FineTunedModel(run, built.data.task, model, description)
        if recipe.data.test and not from_features:
            final["test"] = finetuned.evaluate(
                recipe.data.test, recipe.training.eval_batch_size or 2 * recipe.training.batch_size
            )
    if not settings.writes:
        return finetuned
    with phases("report"):
        write_results(run, recipe, built.data, history, final, time.time() - started, predictions)
        backbone = finish_lora(model, built.data.pretrained.backbone, run.model_dir)
        built.data.task.write_artifacts(backbone, run.path)
    with phases("export"):
        export_run(run, finetuned)
    compilation = compiled.record() if compiled is not None else {}
    if built.precompiled:
        compilation["precompiled"] = built.precompiled
    run.set_status(
        FINISHED,
        phases=phases.record(),
        finetune_called_at=phases.called_at,
        compilation=compilation,
    )
    print(phases.line())
    if compilation.get("programs"):
        print(
            f"compiled {compilation['programs']} programs in {compilation['seconds']:.1f} s "
            f"({compilation['from_cache']} read from the compilation cache)"
        )
    return finetuned


def calibrate(
    validation, model, description: dict, best_epoch: int | None, run: RunDirectory | None
) -> tuple[dict, dict, list]:
    """The best weights' validation metrics, after the task calibrates on them; the
    description with the task's new state, and the predictions.

    The best epoch's validation outputs are those its evaluation kept (predicted
    again only in a resumed run whose best epoch came before the interruption).
    The task's state update (e.g. span QA's tuned no-answer threshold) is saved
    in `model/task.json` of `run` (None: a process that does not write) and the
    predictions decoded again with it, so the metrics and the predictions file
    describe the model that is exported.
    """
    task = validation.task
    outputs, predictions = validation.best_outputs(best_epoch, model)
    update = task.calibrate(validation.examples, predictions)
    if update:
        task.state = {**task.state, **update}
        description = {**description, "state": task.state}
        if run is not None:
            run.write_task_description(description)
        predictions = validation.decode(outputs)
    if run is not None:
        task.write_predictions(validation.examples, predictions, run.path)
    return task.evaluate(validation.examples, predictions), description, predictions


def write_results(
    run: RunDirectory,
    recipe: Recipe,
    data: TaskData,
    history: list,
    final: dict,
    seconds: float,
    validation_predictions,
) -> None:
    """`metrics.json`, the run report and model card; prints the final metrics."""
    from bertkit.report import write_run_report

    monitor = read_json(run.metrics_file)["monitor"]
    write_json(run.metrics_file, {"monitor": monitor, "epochs": history, "final": final})
    write_run_report(
        run.path, recipe, data, history, final, monitor, seconds, validation_predictions
    )
    for split, metrics in final.items():
        shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, (int, float)))
        print(f"{split}: {shown}")


def export_run(run: RunDirectory, finetuned) -> None:
    """The run's `saved_model/`: exported here on TensorFlow, by a TensorFlow child process
    after a JAX run, or a note on stderr where TensorFlow is not installed."""
    import keras

    from bertkit.serving.export import export_in_tensorflow_process, tensorflow_available

    on_tensorflow = keras.backend.backend() == "tensorflow"
    if not on_tensorflow and not tensorflow_available():
        print(
            f"no SavedModel: export needs TensorFlow; run 'bertkit export {run.path} "
            "--out DIR' where TensorFlow is installed",
            file=sys.stderr,
        )
        return
    if run.saved_model_dir.exists():
        shutil.rmtree(run.saved_model_dir)  # from an interrupted export of this run
    if on_tensorflow:
        finetuned.export(run.saved_model_dir)
    else:  # trained on JAX: the saved best weights, rebuilt on TensorFlow in a child
        export_in_tensorflow_process(run.path, run.saved_model_dir)
