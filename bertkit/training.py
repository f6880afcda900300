"""`finetune`: recipe -> fine-tuned model, run directory and SavedModel, with Keras `fit`."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import sys
import time
from pathlib import Path

from bertkit.errors import UserError
from bertkit.progress import say
from bertkit.recipe import Recipe, check_inputs, load_recipe
from bertkit.run_dir import FINISHED, RUNNING, RunDirectory, read_json, write_json


def finetune(recipe, *, output_dir=None, overwrite: bool = False, overrides=None,
             features=None, verbose: int | None = None, callbacks=None, **sections):
    """Fine-tunes the model a recipe describes; returns the `FineTunedModel`.

    Args:
        recipe: a recipe file path, a mapping, or a `Recipe`.
        output_dir: run directory, replacing the recipe's `output_dir`.
        overwrite: replace a finished run in the output directory.
        overrides: `--set`-style strings, e.g. `["training.epochs=1"]`.
        features: a file written by `featurize` for this recipe: train from it without
            reading or tokenizing the data (and without TensorFlow, e.g. on JAX).
        verbose: Keras progress output (default: a bar on a terminal, else a line per epoch).
        callbacks: more Keras callbacks for `fit`, run after bertkit's validation: at the end of
            an epoch its validation metrics are in `logs` (`val_<metric>`) and in
            `metrics.json`. One that sets `model.stop_training` ends training there, and
            the run finishes with the best epoch so far (`bertkit tune` prunes this way).
        **sections: recipe sections to merge, e.g. `training={"epochs": 1}`.

    An interrupted run (Ctrl-C, kill) resumes from its last finished epoch when
    called again with the same recipe and output directory.

    Called in every process of a multi-process job (after `keras.distribution.
    initialize` or `bertkit.multi_process.start_processes`), the processes train
    together; process 0 alone writes the run directory (see `bertkit.multi_process`).

    Example:
        >>> import bertkit
        >>> model = bertkit.finetune("recipes/quickstart.yaml",
        ...                          training={"epochs": 1})  # doctest: +SKIP
        >>> model.predict(["What a delight."])[0]["label"]  # doctest: +SKIP
        'positive'
    """
    from bertkit.multi_process import (
        process_zero_decides,
        quiet_unless_writer,
        writes_run_directory,
    )
    from bertkit.phases import Phases

    phases = Phases()
    with phases("recipe"):
        recipe = _as_recipe(recipe, overrides, sections, output_dir)
        check_inputs(recipe, data_files=not features)  # before the run directory is touched
        if features and not Path(features).is_file():
            raise UserError("file not found", source=features)
        run = RunDirectory(recipe.output_dir)
        fresh = overwrite or run.is_empty()
        writes = writes_run_directory()
    with contextlib.ExitStack() as held, quiet_unless_writer():
        with phases("recipe"):
            resuming = bool(process_zero_decides(
                lambda: _open_run(held, run, recipe.to_yaml(), overwrite)))
        try:
            finetuned = _Trainer(recipe, run, resuming, verbose, features, phases,
                                 callbacks).execute()
        except UserError:
            if not writes:
                raise
            if run.replaced_dir.is_dir():
                run.restore_replaced()  # the run --overwrite was to replace comes back
            elif fresh and not run.metrics_file.exists():
                shutil.rmtree(run.path)  # nothing trained yet: leave no half-made run behind
            raise
        if writes:
            run.drop_replaced()
    return finetuned


def _open_run(held: contextlib.ExitStack, run: RunDirectory, recipe_yaml: str,
              overwrite: bool) -> bool:
    """Locks the run directory (until `held` closes) and prepares it; True when resuming."""
    held.enter_context(run.lock())
    return run.prepare(recipe_yaml, overwrite)


def featurize(recipe, out=None, *, overrides=None, **sections) -> Path:
    """Tokenizes a recipe's training and validation data once into a features file.

    The file lets `finetune(..., features=FILE)` train where TensorFlow is not
    installed (for example JAX on a GPU machine). Default path:
    `<output_dir>.features.npz`.
    """
    from bertkit.feature_file import keeps_validation, write_feature_file

    recipe = _as_recipe(recipe, overrides, sections, None)
    data = TaskData.read(recipe)
    out = Path(out or f"{recipe.output_dir}.features.npz")
    path = write_feature_file(out, description=data.description, train=data.train_features,
                              validation=data.validation_features,
                              validation_examples=data.validation,
                              example_type=data.task.Example)
    kept = keeps_validation(data.validation_features, data.validation, data.task.Example)
    print(f"wrote {path}: {len(data.train_features)} training rows, "
          f"{len(data.validation_features) if kept else 0} validation rows")
    if data.validation_features is not None and not kept:
        print(f"the {recipe.task} task decodes with TensorFlow: evaluate the trained run "
              "with 'bertkit evaluate RUN_DIR' where TensorFlow is installed")
    return path


def _as_recipe(recipe, overrides, sections, output_dir) -> Recipe:
    if not isinstance(recipe, Recipe):
        recipe = load_recipe(recipe, overrides, **sections)
    if output_dir is not None:
        recipe = dataclasses.replace(recipe, output_dir=str(Path(output_dir).resolve()))
    return recipe


@dataclasses.dataclass
class TaskData:
    """A run's task, backbone and featurized data, from the files or from a features file.

    `TaskData.read(recipe)` prepares what `finetune` trains on, for tools that time or
    inspect it (the benchmarks).
    """

    task: object
    pretrained: object
    description: dict
    train_features: object
    validation: list | None
    validation_features: object

    @classmethod
    def read(cls, recipe: Recipe, state: dict | None = None, phases=None) -> TaskData:
        """Reads, loads the backbone and featurizes; `phases` (a `Phases`) times each."""
        from bertkit.backbone import load_pretrained
        from bertkit.phases import Phases

        phases = phases or Phases()
        # Reading needs only the options: it runs before the model loads, so data errors
        # come fast; the task that featurizes is then made complete, tokenizer and state.
        with phases("read"):
            reader = _new_task(recipe)
            train = reader.read(recipe.data.train)
            if not train:
                raise UserError("no training examples", source=recipe.data.train)
            if recipe.data.validation:
                validation = reader.read(recipe.data.validation)
            else:
                train, validation = reader.split_validation(train)
            state = state if state is not None else reader.fit_state(train)
            labels = state.get("labels") if isinstance(state, dict) else None
            if labels is not None and len(labels) < 2:
                raise UserError(f"the training data has only one label ({', '.join(labels)}) "
                                "and the model would learn nothing; a task needs at least two",
                                source=recipe.data.train)
        with phases("load_backbone"):
            pretrained = cls._backbone(recipe, load_pretrained)
        with phases("featurize"):
            task = _new_task(recipe, pretrained.tokenizer, state)
            say(f"featurizing {len(train)} training and {len(validation or ())} validation "
                "examples")
            validation_features = (task.featurize(validation, training=False) if validation
                                   else None)
            train_features = task.featurize(train, training=True)
        return cls(task, pretrained, _description(task, recipe), train_features, validation,
                   validation_features)

    @classmethod
    def from_file(cls, recipe: Recipe, path) -> TaskData:
        from bertkit.backbone import load_pretrained
        from bertkit.feature_file import read_feature_file

        reader = _new_task(recipe)
        stored = read_feature_file(path, example_type=reader.Example)
        expected = _description(reader, recipe)
        for key in ("task", "options", "data", "sequence_length", "bucket_lengths", "state"):
            if key not in stored.description or (key != "state" and
                                                 stored.description[key] != expected[key]):
                raise UserError(f"was made from another recipe ({key} differs); run "
                                "'bertkit featurize' on this recipe", source=path)
        pretrained = cls._backbone(recipe, load_pretrained)
        task = _new_task(recipe, pretrained.tokenizer, stored.description["state"])
        return cls(task, pretrained, stored.description, stored.train,
                   stored.validation_examples, stored.validation)

    @staticmethod
    def _backbone(recipe, load_pretrained):
        say(f"loading the backbone {recipe.backbone.preset}")
        return load_pretrained(recipe.backbone.preset,
                               sequence_length=recipe.backbone.sequence_length,
                               lowercase=recipe.backbone.lowercase, source=recipe.source)


def _new_task(recipe: Recipe, tokenizer=None, state: dict | None = None):
    """The recipe's task; without a tokenizer it can read files, but not featurize."""
    return recipe.task_class()(recipe.task_options, recipe.data, tokenizer,
                               recipe.backbone.sequence_length, state)


def _description(task, recipe: Recipe) -> dict:
    from bertkit.batching import bucket_lengths
    from bertkit.finetuned import task_description

    buckets = bucket_lengths(recipe.backbone.sequence_length, recipe.training.bucket_lengths)
    return task_description(task, recipe.backbone.sequence_length, recipe.training.batch_size,
                            buckets)


class _Trainer:
    """One run's steps, top to bottom: data, model, fit, final evaluation, export.

    Each step's wall seconds go to `run.json` under `phases` (see `bertkit.phases`).
    """

    def __init__(self, recipe: Recipe, run: RunDirectory, resuming: bool, verbose, features,
                 phases, callbacks=None):
        from bertkit.multi_process import writes_run_directory

        self.phases = phases
        self.writes = writes_run_directory()  # False in the processes but the first
        self.extra_callbacks = list(callbacks or ())
        self.recipe, self.run, self.resuming = recipe, run, resuming
        self.training = recipe.training
        self.features_file = features
        self.validation_predictions = None  # the best weights', for the report
        self.verbose = verbose if verbose is not None else (1 if sys.stdout.isatty() else 2)

    def execute(self):
        import keras

        from bertkit.distribution import data_parallel_scope

        policy = keras.config.dtype_policy()
        try:
            if self.training.mixed_precision:
                keras.config.set_dtype_policy(f"mixed_{self.training.mixed_precision}")
            with data_parallel_scope(self.training, self.recipe.source):
                return self._train()
        finally:
            keras.config.set_dtype_policy(policy)  # a process-wide setting: leave it as found

    def _train(self):
        import keras

        from bertkit.backbone import save_architecture
        from bertkit.batching import TrainingBatches, padding_lengths
        from bertkit.callbacks import load_model_weights
        from bertkit.distribution import devices_sharing_a_batch
        from bertkit.finetuned import FineTunedModel
        from bertkit.optimization import make_optimizer
        from bertkit.packing import packed_row_counts, packed_training_model
        from bertkit.validation import ValidationSplit

        started = time.time()
        recipe, training, phases = self.recipe, self.training, self.phases
        keras.utils.set_random_seed(training.seed)

        # ---- data, backbone, features
        if self.features_file:
            with phases("read"):
                data = TaskData.from_file(recipe, self.features_file)
        else:
            data = TaskData.read(recipe, self._saved_state(), phases)
        task, description = data.task, data.description
        buckets = tuple(description["bucket_lengths"])
        eval_batch_size = training.eval_batch_size or 2 * training.batch_size

        # ---- model
        with phases("build_model"):
            jit_compile = jit_compile_setting(training.jit_compile)
            compiles = bool(jit_compile) or keras.backend.backend() == "jax"
            pad_lengths = padding_lengths(buckets, compiles_each_shape=compiles)
            batches = TrainingBatches(
                task, data.train_features, training.batch_size, buckets, training.seed,
                training.batch_order, training.micro_batches,
                row_multiple=devices_sharing_a_batch(), pad_lengths=pad_lengths,
                packing=training.packing,
                row_counts=packed_row_counts(training.batch_size) if compiles else None)
            model = task.build_model(data.pretrained.backbone)
            task.initialize_head(model, data.pretrained.checkpoint_tensors())
            # What `fit` trains: the model itself, or the same layers taking packed rows.
            trained = (packed_training_model(model, data.pretrained.backbone)
                       if training.packing else model)
            trained.compile(optimizer=make_optimizer(training, len(batches)), loss=task.loss(),
                            weighted_metrics=task.metrics(),  # plain `metrics` get no weights
                            jit_compile=jit_compile)
            # Without a tf.distribute strategy Keras builds the optimizer inside the first
            # traced step; the slot variables it creates there make TensorFlow trace the
            # whole training step a second time. Built here, the step is traced once.
            trained.optimizer.build(trained.trainable_variables)
            if self.writes:
                save_architecture(data.pretrained, self.run.model_dir)
                self.run.write_task_description(description)

        # ---- fit: its steps and evaluations are timed apart; `fit_overhead` is the rest
        # (Keras' set-up, checkpoints, TensorBoard logs, the metrics file)
        validation = None
        if data.validation:
            validation = ValidationSplit(task, data.validation, data.validation_features,
                                         eval_batch_size, pad_lengths, phases)
        parts = ("first_step", "train_steps", "evaluation")
        before = phases.total(parts)
        with phases("fit_overhead"):
            history, best_epoch = self._fit(trained, model, task, batches, validation)
        phases.add("fit_overhead", before - phases.total(parts))

        # ---- best weights, calibration, final evaluation, report, export
        with phases("final_evaluation"):
            load_model_weights(model, self.run.weights_file)
            final = {}
            if validation:
                final["validation"], description = self._calibrate(validation, model,
                                                                    description, best_epoch)
            finetuned = FineTunedModel(self.run, task, model, description)
            if recipe.data.test and not self.features_file:
                final["test"] = finetuned.evaluate(recipe.data.test, eval_batch_size)
        if not self.writes:
            return finetuned
        with phases("report"):
            self._write_results(history, final, time.time() - started, data)
            task.write_artifacts(data.pretrained.backbone, self.run.path)
        with phases("export"):
            self._export(finetuned)
        self.run.set_status(FINISHED, phases=phases.record(), finetune_called_at=phases.called_at)
        print(phases.line())
        return finetuned

    def _saved_state(self) -> dict | None:
        if self.resuming and self.run.task_file.exists():
            return read_json(self.run.task_file)["state"]
        return None

    def _export(self, finetuned) -> None:
        import keras

        from bertkit.export import export_in_tensorflow_process, tensorflow_available

        on_tensorflow = keras.backend.backend() == "tensorflow"
        if not on_tensorflow and not tensorflow_available():
            print(f"no SavedModel: export needs TensorFlow; run 'bertkit export {self.run.path} "
                  "--out DIR' where TensorFlow is installed", file=sys.stderr)
            return
        if self.run.saved_model_dir.exists():
            shutil.rmtree(self.run.saved_model_dir)  # from an interrupted export of this run
        if on_tensorflow:
            finetuned.export(self.run.saved_model_dir)
        else:  # trained on JAX: the saved best weights, rebuilt on TensorFlow in a child
            export_in_tensorflow_process(self.run.path, self.run.saved_model_dir)

    def _calibrate(self, validation, model, description: dict,
                   best_epoch: int | None) -> tuple[dict, dict]:
        """The best weights' validation metrics, after the task calibrates on them.

        The best epoch's validation outputs are those its evaluation kept (predicted
        again only in a resumed run whose best epoch came before the interruption).
        The task's state update (e.g. span QA's tuned no-answer threshold) is saved
        in `model/task.json` and the predictions decoded again with it, so the
        metrics and the predictions file describe the model that is exported.
        """
        task = validation.task
        outputs, predictions = validation.best_outputs(best_epoch, model)
        update = task.calibrate(validation.examples, predictions)
        if update:
            task.state = {**task.state, **update}
            description = {**description, "state": task.state}
            if self.writes:
                self.run.write_task_description(description)
            predictions = validation.decode(outputs)
        if self.writes:
            task.write_predictions(validation.examples, predictions, self.run.path)
        self.validation_predictions = predictions  # for the report's error analysis
        return task.evaluate(validation.examples, predictions), description

    def _fit(self, trained, model, task, batches, validation) -> tuple[list[dict], int | None]:
        """Keras `fit` of `trained` (`model`, or its packed form) with the run's callbacks;
        the history and the best epoch. Evaluation and the best weights use `model`."""

        from bertkit.callbacks import (
            AtomicBackupAndRestore,
            Evaluate,
            SetEpoch,
            StepTensorBoard,
            StopOnNonFiniteLoss,
            TimeSteps,
            TrackRun,
        )
        from bertkit.export import tensorflow_available
        from bertkit.multi_process import wait_for_all

        if self.resuming and read_json(self.run.run_file).get("trained"):
            # Killed after training (final evaluation, export): the best weights are saved.
            print(f"resuming {self.run.path} after training", file=sys.stderr)
            return (read_json(self.run.metrics_file)["epochs"],
                    read_json(self.run.run_file).get("best_epoch"))
        initial_epoch = self.run.resumed_epoch() if self.resuming else 0
        history = []
        if initial_epoch and self.run.metrics_file.exists():
            history = read_json(self.run.metrics_file)["epochs"][:initial_epoch]
        monitor, mode = (f"val_{task.monitor}", task.mode) if validation else ("loss", "min")
        writes = self.writes
        callbacks = [SetEpoch(batches), StopOnNonFiniteLoss(self.training.learning_rate),
                     TimeSteps(self.phases)]
        if writes:
            callbacks += self._progress_callbacks(len(batches))
        if validation:
            callbacks.append(Evaluate(lambda _: validation.evaluate(model),
                                      "evaluating on the validation split"))
        tracker = TrackRun(self.run, monitor, mode, self.training.early_stopping_patience,
                           history, on_best=validation and validation.keep_latest, writes=writes,
                           weights_of=model)
        callbacks += [tracker, AtomicBackupAndRestore(str(self.run.checkpoint_dir),
                                                      writes=writes, delete_checkpoint=False)]
        callbacks += self.extra_callbacks  # after Evaluate and TrackRun: the epoch is recorded
        if writes and tensorflow_available():  # Keras logs TensorBoard with tf.summary, any backend
            callbacks.append(StepTensorBoard(
                str(self.run.logs_dir), profile_batch=0, update_freq=log_every(len(batches))))
        if initial_epoch:
            print(f"resuming {self.run.path} after epoch {initial_epoch}", file=sys.stderr)
        trained.fit(batches.as_dataset(), epochs=self.training.epochs, callbacks=callbacks,
                    verbose=self.verbose if writes else 0, shuffle=False)  # shuffled per epoch
        if writes:
            self.run.set_status(RUNNING, trained=True)  # then the checkpoint is not needed
            shutil.rmtree(self.run.checkpoint_dir, ignore_errors=True)
        wait_for_all("trained")  # the others then read the best weights process 0 saved
        best = tracker.best()
        return tracker.history, best and best["epoch"]

    def _progress_callbacks(self, steps: int) -> list:
        from bertkit.callbacks import RecordSteps, TrainingProgress

        callbacks = [RecordSteps(self.run.path / "steps.json", steps, log_every(steps))]
        if self.verbose == 2:  # not a terminal: Keras prints one line per epoch, at its end
            callbacks.append(TrainingProgress(steps, self.training.epochs, self.training.batch_size
                                              / self.training.micro_batches))
        return callbacks

    def _write_results(self, history, final, seconds, data) -> None:
        from bertkit.report import write_run_report

        monitor = read_json(self.run.metrics_file)["monitor"]
        write_json(self.run.metrics_file, {"monitor": monitor, "epochs": history, "final": final})
        write_run_report(self.run.path, self.recipe, data, history, final, monitor, seconds,
                         self.validation_predictions)
        for split, metrics in final.items():
            shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()
                              if isinstance(v, (int, float)))
            print(f"{split}: {shown}")


def log_every(steps_per_epoch: int) -> int:
    """Steps between records of the loss and learning rate: about 50 per epoch."""
    return max(1, steps_per_epoch // 50)


def jit_compile_setting(setting):
    """`training.jit_compile` as Keras takes it: "auto" is XLA on a GPU and on JAX."""
    if setting != "auto":
        return setting
    import keras

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return bool(tf.config.list_logical_devices("GPU"))
    return keras.backend.backend() == "jax"
