"""What `finish` (`bertkit.training.run_steps`) leaves in a run directory: the calibrated
validation metrics and predictions, `metrics.json`, the reading matter (learning_curve.png,
report.md with the task's error analysis, the model card README.md) and the SavedModel."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from bertkit.errors import UserError
from bertkit.model_card import data_size, write_model_card
from bertkit.recipes.recipe import Recipe
from bertkit.recipes.sections import ExportConfig
from bertkit.report import best_epoch, plot_learning_curve, write_report
from bertkit.run_dir import FINISHED, RunDirectory, read_json, write_json
from bertkit.training.task_data import TaskData


def final_evaluation(built, recipe: Recipe, settings, best_epoch, from_features: bool):
    """The best weights' `FineTunedModel`, calibrated on validation; the final metrics
    (validation, and test where there is a test file) and the validation predictions.
    `built` and `settings`: `run_steps.BuiltRun` and `run_steps.FitSettings`."""
    from bertkit.serving.finetuned import FineTunedModel
    from bertkit.training.averaging import averaged_line
    from bertkit.training.weights import load_model_weights

    run, model, validation = settings.run, built.model, built.validation
    description, predictions = built.data.description, None
    load_model_weights(model, run.weights_file)
    final, averaged = {}, read_json(run.run_file).get("averaged_epochs")
    if averaged:  # the mean's outputs are not the best epoch's: predicted again
        print(averaged_line(averaged, best_epoch))
    if validation:
        final["validation"], description, predictions = calibrate(
            validation,
            model,
            description,
            None if averaged else best_epoch,
            run if settings.writes else None,
        )
    finetuned = FineTunedModel(run, built.data.task, model, description)
    if recipe.data.test and not from_features:
        final["test"] = finetuned.evaluate(
            recipe.data.test, recipe.training.eval_batch_size or 2 * recipe.training.batch_size
        )
    return finetuned, final, predictions


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
    monitor = read_json(run.metrics_file)["monitor"]
    write_json(run.metrics_file, {"monitor": monitor, "epochs": history, "final": final})
    write_run_report(
        run.path, recipe, data, history, final, monitor, seconds, validation_predictions
    )
    for split, metrics in final.items():
        shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, (int, float)))
        print(f"{split}: {shown}")


def export_run(run: RunDirectory, finetuned, export: ExportConfig | None = None) -> None:
    """The run's `saved_model/`: exported here on TensorFlow, by a TensorFlow child process
    after a JAX run, or a note on stderr where TensorFlow is not installed; none with the
    recipe's `export.saved_model: false`; and with its `export.quantize` (`export`: the
    recipe's `ExportConfig`) `saved_model_int8/`. First the staging folders of an export
    killed here before (SIGKILL runs no clean-up) are removed: the run's lock is held, so
    no other process writes them."""
    import keras

    from bertkit.serving.staging import remove_stale_staging

    for folder in (run.saved_model_dir, run.path / "saved_model_int8"):
        remove_stale_staging(folder)
    export = export or ExportConfig()
    on_tensorflow = keras.backend.backend() == "tensorflow"
    if export.saved_model:
        export_float(run, finetuned, on_tensorflow)
    if export.quantize is not None:
        export_int8(run, finetuned, export, on_tensorflow)


def export_float(run: RunDirectory, finetuned, on_tensorflow: bool) -> None:
    from bertkit.serving.export import export_in_tensorflow_process, tensorflow_available

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


def export_int8(run: RunDirectory, finetuned, export, on_tensorflow: bool) -> None:
    """`saved_model_int8/` through the quality gate (`bertkit.serving.quantize`); where the
    gate refuses it, one line on stderr: the run and its float SavedModel stand."""
    target = run.path / "saved_model_int8"
    if target.exists():
        shutil.rmtree(target)  # from an earlier export of this run
    if not on_tensorflow:
        print(
            f"no int8 SavedModel: run 'bertkit export {run.path} --out DIR --quantize int8' "
            "on the TensorFlow backend",
            file=sys.stderr,
        )
        return
    from bertkit.serving.quantize import gate_line

    try:
        finetuned.export(target, quantize=export.quantize, max_metric_drop=export.max_metric_drop)
    except UserError as error:
        print(f"bertkit: warning: no saved_model_int8/: {error}", file=sys.stderr)
        return
    print(gate_line(finetuned.task, target))


def record_finished(run: RunDirectory, phases, compiled, precompiled) -> None:
    """Marks the run finished in `run.json`, with its phases and compilation record
    (`compiled`: a `CompileCounter` or None; `precompiled`: what `compile_programs` did),
    and prints them."""
    compilation = compiled.record(phases.first_step_ended) if compiled is not None else {}
    if precompiled:
        compilation["precompiled"] = precompiled
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
    late = compilation.get("after_first_step", {})
    if late.get("seconds", 0) >= 1:  # a stall in the steps
        print(
            f"compiled {late['compiled']} programs after the first step in "
            f"{late['seconds']:.1f} s (longest: {late['longest']['function']}, "
            f"{late['longest']['seconds']:.1f} s)"
        )


def write_run_report(
    directory,
    recipe,
    data,
    history: list[dict],
    final: dict,
    monitor: str,
    seconds: float,
    validation_predictions: list[dict] | None,
) -> None:
    """All of a finished run's reading matter: learning_curve.png, report.md (with the
    task's error analysis of the validation split) and the model card README.md."""
    directory, task = Path(directory), data.task
    steps_file = directory / "steps.json"
    steps = read_json(steps_file)["steps"] if steps_file.exists() else []
    mode = task.mode if monitor.startswith("val_") else "min"
    plot_learning_curve(history, directory / "learning_curve.png", steps, monitor, mode)
    plain = recipe.to_dict()
    write_report(
        directory / "report.md",
        recipe=plain,
        history=history,
        final=final,
        monitor=monitor,
        seconds=seconds,
        mode=mode,
        steps=steps,
        task_section=_task_section(data, validation_predictions, directory),
        lora=data.description.get("lora"),
    )
    write_model_card(
        directory / "README.md",
        recipe=plain,
        data_sizes=_data_sizes(recipe, data),
        final=final,
        monitor=monitor,
        task_description=task.description,
        best=best_epoch(history, monitor, mode),
    )


def _task_section(data, validation_predictions, directory: Path) -> str | None:
    """The task's error analysis of the validation split; None (and a warning) when its
    `report` fails: a plugin's report must not lose the run."""
    task = data.task
    if validation_predictions is None or not data.validation:
        return None
    try:
        return task.report(data.validation, validation_predictions, directory)
    except Exception as error:  # noqa: BLE001
        print(
            f"bertkit: warning: the {task.name} task's report failed: "
            f"{type(error).__name__}: {error}",
            file=sys.stderr,
        )
        return None


def _data_sizes(recipe, data) -> dict:
    """The model card's data table: each split's file, examples and size."""
    import numpy as np

    sizes = {
        "train": data_size(recipe.data.train, len(np.unique(data.train_features.example_index)))
    }
    if data.validation:
        sizes["validation"] = data_size(recipe.data.validation, len(data.validation))
    if recipe.data.test:
        sizes["test"] = data_size(recipe.data.test, None)
    return sizes
