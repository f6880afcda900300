"""`finetune`: recipe -> fine-tuned model, run directory and SavedModel, with Keras `fit`.

An interrupted run (Ctrl-C, kill) resumes from its last checkpoint when `finetune` is called
again with the same recipe and output directory, and ends as an uninterrupted run would: the
last finished epoch, or a step (`training.checkpoint_every_steps`, `_minutes`; see
`bertkit.training.checkpointing`). SIGTERM (SLURM, Kubernetes, a preemptible VM) saves the
step that runs and raises `bertkit.training.Preempted`, a `SystemExit` with status 143.

Called in every process of a multi-process job (after `keras.distribution.initialize` or
`bertkit.parallel.multi_process.start_processes`), the processes train together; process
0 alone writes the run directory (see `bertkit.parallel.multi_process`).

With `training.seeds > 1`, the run directory holds one ordinary run per seed in `seeds/`
and their mean ± sd, and the median (or best) seed's model (`bertkit.training.seeds`).

Example:
    >>> import bertkit
    >>> model = bertkit.finetune("recipes/quickstart.yaml",
    ...                          training={"epochs": 1})  # doctest: +SKIP
    >>> model.predict(["What a delight."])[0]["label"]  # doctest: +SKIP
    'positive'
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

from bertkit.errors import UserError
from bertkit.parallel.multi_process import process_zero_decides, quiet_unless_writer
from bertkit.recipes.preflight import check_run
from bertkit.recipes.recipe import Recipe, load_recipe
from bertkit.run_dir import RUNNING, RunDirectory, read_json
from bertkit.training import run_steps
from bertkit.training.phases import Phases
from bertkit.training.run_steps import (  # noqa: F401 (public here too: the benchmarks import them)
    FitSettings,
    batch_plan,
    jit_compile_setting,
    log_every,
)
from bertkit.training.task_data import TaskData


def finetune(
    recipe,
    *,
    output_dir=None,
    overwrite: bool = False,
    overrides=None,
    features=None,
    verbose: int | None = None,
    callbacks=None,
    **sections,
):
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

    Resuming, multi-process jobs and an example: see the module's docstring.
    """
    phases = Phases()
    with phases("recipe"):
        recipe, run = _checked_run(recipe, overrides, sections, output_dir, features)
        fresh = overwrite or run.is_empty()
    with contextlib.ExitStack() as held, quiet_unless_writer():
        with phases("recipe"):
            resuming = _resuming(held, run, recipe, overwrite)
        return _train_or_undo(
            run, fresh, lambda: _train(recipe, run, resuming, verbose, features, phases, callbacks)
        )


def _train(recipe, run, resuming, verbose, features, phases, callbacks):
    """One run (`_Trainer`); with `training.seeds > 1`, one per seed in `seeds/`, then
    their aggregate (`bertkit.training.seeds`)."""
    if recipe.training.seeds > 1:
        from bertkit.training.seeds import train_seeds

        return train_seeds(
            recipe, run, finetune, verbose=verbose, features=features, callbacks=callbacks
        )
    return _Trainer(recipe, run, resuming, verbose, features, phases, callbacks).execute()


def _checked_run(recipe, overrides, sections, output_dir, features):
    """The recipe, its files checked before the run directory is touched, and that directory."""
    recipe = _as_recipe(recipe, overrides, sections, output_dir, "finetune")
    check_run(recipe, data_files=not features)  # what `bertkit check` checks
    if features:
        from bertkit.training.feature_file_archive import check_features_path

        check_features_path(features)
    return recipe, RunDirectory(recipe.output_dir)


def _train_or_undo(run: RunDirectory, fresh: bool, train):
    """`train()`'s result. When it fails (a user error, or any exception before training
    left a checkpoint or metrics: a full disk, Ctrl-C), the writing process puts back the
    run `--overwrite` was to replace, or removes what a fresh run made."""
    from bertkit.parallel.multi_process import writes_run_directory

    writes = writes_run_directory()
    try:
        finetuned = train()
    except BaseException as error:
        if not writes or not (isinstance(error, UserError) or not run.has_trained()):
            raise
        if run.replaced_dir.is_dir():
            run.restore_replaced()  # the run --overwrite was to replace comes back
        elif fresh and not run.has_trained():
            run.remove_made()  # nothing trained yet: leave no half-made run behind
        raise
    if writes:
        run.drop_replaced()
    return finetuned


def _resuming(held: contextlib.ExitStack, run: RunDirectory, recipe, overwrite: bool) -> bool:
    """Process 0 opens the run directory (`_open_run`) and tells every process whether the
    run resumes."""
    return bool(process_zero_decides(lambda: _open_run(held, run, recipe.to_yaml(), overwrite)))


def _open_run(
    held: contextlib.ExitStack, run: RunDirectory, recipe_yaml: str, overwrite: bool
) -> bool:
    """Locks the run directory (until `held` closes) and prepares it; True when resuming."""
    held.enter_context(run.lock())
    return run.prepare(recipe_yaml, overwrite)


def featurize(recipe, out=None, *, overrides=None, overwrite: bool = False, **sections) -> Path:
    """Tokenizes a recipe's training and validation data once into a features file.

    The file lets `finetune(..., features=FILE)` train where TensorFlow is not
    installed (for example JAX on a GPU machine). Default path:
    `<output_dir>.features.npz`. An existing file there is replaced only when it is a
    features file of the same recipe (task and training file), or with `overwrite`;
    the new file is checked as `finetune` reads it, and the time of both is printed.
    """
    from bertkit.training import feature_file_data as made_from
    from bertkit.training.feature_file import keeps_validation, write_feature_file

    recipe = _as_recipe(recipe, overrides, sections, None, "featurize")
    out = Path(out or f"{recipe.output_dir}.features.npz")
    made_from.check_replaceable(out, recipe, overwrite)  # before the work, not after
    phases = Phases()
    data = TaskData.read(recipe, phases=phases)
    path = write_feature_file(
        out,
        description=made_from.portable_description(data.description, recipe),
        train=data.train_features,
        validation=data.validation_features,
        validation_examples=made_from.portable_examples(data.validation, recipe),
        example_type=data.task.Example,
        data_files=made_from.data_files(recipe),
        vocabulary=made_from.vocabulary_of(data.pretrained),
    )
    validating = _validate(path, data.task.Example)
    kept = keeps_validation(data.validation_features, data.validation, data.task.Example)
    print(
        f"wrote {path}: {len(data.train_features)} training rows, "
        f"{len(data.validation_features) if kept else 0} validation rows "
        f"(featurizing {phases.total(['featurize']):.2f} s, validating {validating:.2f} s)"
    )
    if data.validation_features is not None and not kept:
        print(
            f"the {recipe.task} task decodes with TensorFlow: evaluate the trained run "
            "with 'bertkit evaluate RUN_DIR' where TensorFlow is installed"
        )
    return path


def _validate(path: Path, example_type) -> float:
    """Seconds to check `path` as `finetune --features` does before it reads the rows."""
    from bertkit.training.feature_file import check_feature_file

    started = time.perf_counter()
    check_feature_file(path, example_type=example_type)
    return time.perf_counter() - started


def _as_recipe(recipe, overrides, sections, output_dir, called_as) -> Recipe:
    if not isinstance(recipe, Recipe):
        recipe = load_recipe(recipe, overrides, called_as=called_as, **sections)
    if output_dir is not None:
        recipe = recipe.with_output_dir(output_dir, source=f"{called_as}(output_dir=...)")
    return recipe


class _Trainer:
    """One run, top to bottom, over the public steps of `bertkit.training.run_steps`:
    prepare -> build -> fit -> finish.

    Each step's wall seconds go to `run.json` under `phases` (see `bertkit.training.phases`).
    """

    def __init__(
        self,
        recipe: Recipe,
        run: RunDirectory,
        resuming: bool,
        verbose,
        features,
        phases,
        callbacks=None,
    ):
        from bertkit.parallel.multi_process import writes_run_directory

        self.recipe, self.phases, self.features_file = recipe, phases, features
        self.settings = FitSettings(
            run,
            resuming,
            writes=writes_run_directory(),
            callbacks=list(callbacks or ()),
            verbose=verbose if verbose is not None else (1 if sys.stdout.isatty() else 2),
        )

    def execute(self):
        import keras

        from bertkit.parallel.multi_process import process_count
        from bertkit.training.compilation import CompileCounter, use_compilation_cache
        from bertkit.training.preemption import watching_sigterm

        policy = keras.config.dtype_policy()
        # SIGTERM saves the step and stops (`Preempted`); in a job of several processes,
        # all of them after the same step
        sigterm = watching_sigterm(processes=process_count())
        try:
            if self.recipe.training.mixed_precision:
                keras.config.set_dtype_policy(f"mixed_{self.recipe.training.mixed_precision}")
            use_compilation_cache(self.recipe.training.compilation_cache)
            with (
                sigterm as self.settings.sigterm,
                run_steps.device_scope(self.recipe),
                CompileCounter() as self.compiled,
            ):
                return self._train()
        finally:
            keras.config.set_dtype_policy(policy)  # a process-wide setting: leave it as found

    def _train(self):
        import keras

        from bertkit.model.backbone import save_architecture

        started, recipe, phases = time.time(), self.recipe, self.phases
        run, settings = self.settings.run, self.settings
        keras.utils.set_random_seed(recipe.training.seed)
        data = run_steps.prepare(
            recipe, features=self.features_file, state=self._saved_state(), phases=phases
        )
        if settings.writes:
            _note_small_data(recipe, data, run)
        built = run_steps.build(recipe, data, phases=phases)
        if settings.writes:
            _note_packing(built.plan, run)
            with phases("build_model"):
                save_architecture(data.pretrained, run.model_dir)
                run.write_task_description(data.description)
                if data.unknown_pieces is not None:
                    run.set_status(RUNNING, unknown_pieces=data.unknown_pieces.record())
        # fit's steps and evaluations are timed apart; `fit_overhead` is the rest
        # (Keras' set-up, checkpoints, TensorBoard logs, the metrics file)
        parts = ("precompile", "first_step", "train_steps", "evaluation")
        before = phases.total(parts)
        with phases("fit_overhead"):
            history, best_epoch = run_steps.fit(built, recipe, settings, phases)
        phases.add("fit_overhead", before - phases.total(parts))
        return run_steps.finish(
            built,
            recipe,
            settings,
            phases,
            history=history,
            best_epoch=best_epoch,
            started=started,
            from_features=bool(self.features_file),
            compiled=self.compiled,
        )

    def _saved_state(self) -> dict | None:
        run = self.settings.run
        if self.settings.resuming and run.task_file.exists():
            return read_json(run.task_file)["state"]
        return None


def _note_packing(plan, run: RunDirectory) -> None:
    """Whether training packs and the batches' order, in `run.json` (`packing`,
    `batch_order`), and a status line where `training.packing: auto` did not pack, naming why."""
    from bertkit.progress import say

    record = {"packed": plan.packing}
    if plan.unpacked_because:
        record["why_not"] = plan.unpacked_because
        say(f"training unpacked (training.packing: auto): {plan.unpacked_because}")
    run.set_status(RUNNING, packing=record, batch_order=plan.order)


def _note_small_data(recipe: Recipe, data: TaskData, run: RunDirectory) -> None:
    """The small-data hint, a status line (`bertkit.recipes.presets`), and in `run.json` the values
    `training.preset` filled in."""
    import numpy as np

    from bertkit.progress import say
    from bertkit.recipes.presets import small_data_hint

    if recipe.preset_values:
        preset = {"name": recipe.training.preset, "values": recipe.preset_values}
        run.set_status(RUNNING, preset=preset)
    if hint := small_data_hint(recipe, len(np.unique(data.train_features.example_index))):
        say(hint)
