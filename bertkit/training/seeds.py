"""`training.seeds: N`: N ordinary runs of one recipe, their mean ± sd, and one kept model.

On small data one run says little: seeds of the same recipe differ by several points.
`finetune` hands a recipe with `seeds > 1` to `train_seeds`, inside the run directory's
lock, the directory prepared (or resumed, or moved aside by `overwrite`) as for any run::

    recipe.yaml, run.json          the recipe (seeds: N); run.json names the kept seed
    seeds/seed-42/, seed-43/, ...  one ordinary run directory per seed (training.seed + k)
    metrics.json                   each seed's final metrics, and their mean and sd
    report.md, learning_curve.png  the seeds table (mean ± sd) and one curve per seed
    README.md                      the kept seed's model card, with the seeds' mean ± sd
    model/, saved_model/           the kept seed's, hard-linked (copied across file systems)

The kept seed is the one whose validation `monitor` is the median (for an even N the
worse of the two middle ones: never a flattering pick) or, with `keep_seed: best`, the
best; without a validation split, the first. Its `model/` and `saved_model/` are linked
into the run rather than pointed at, so `bertkit.load`, `evaluate`, `predict`, `export`
and TensorFlow Serving read `<output_dir>` as any run directory, unchanged, and the
folder stays whole when copied or uploaded (a run directory follows no link out of
itself, and hard links cost no disk space).

A seed whose validation `monitor` is no better than the task's `Task.baseline` (the
majority class; tagging every word O) is flagged in one line, printed and kept in
`metrics.json` (`failed_seeds`) and the report.

Resuming: a seed whose `run.json` says finished is skipped, the interrupted one resumes
as any run does, and the aggregate is written again. `metrics.json` is rewritten after
every seed, so a stopped run shows the seeds it has.

Seeds train one after another in this process, or several at once in child processes
where several GPUs are visible (`training.parallel_seeds`: `bertkit.training.seeds_side_by_side`).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import statistics
from pathlib import Path

from bertkit.errors import UserError
from bertkit.progress import say
from bertkit.recipes.recipe import Recipe
from bertkit.run_dir import FINISHED, RUNNING, RunDirectory, read_json, write_json
from bertkit.training.seeds_side_by_side import seeds_at_once, train_side_by_side

LARGEST_SEED = 2**32 - 1


def train_seeds(
    recipe: Recipe, run: RunDirectory, finetune, *, verbose=None, features=None, callbacks=None
):
    """Trains `recipe.training.seeds` seeds into `run.path / "seeds"`, finished ones skipped,
    each with `finetune` (`bertkit.finetune`: passed in, as its module imports this one) or
    side by side in child processes, then writes the aggregate. Returns the kept model,
    loaded from `run` (in processes other than the writing one: the last seed's model)."""
    from bertkit.parallel.multi_process import writes_run_directory
    from bertkit.serving.finetuned import FineTunedModel

    done = _SeedsDone(recipe, run, features)
    at_once, finetuned, side_by_side = seeds_at_once(recipe.training, callbacks), None, {}
    for position, seed, seed_run in done.unfinished():
        if at_once > 1:
            side_by_side[seed] = (seed_recipe(recipe, seed, run), seed_run)
            continue
        say(f"seed {seed} ({position}): {seed_run.path}")
        try:
            finetuned = finetune(
                seed_recipe(recipe, seed, run),
                verbose=verbose,
                features=features,
                callbacks=callbacks,
            )
        except UserError as error:  # e.g. it diverged: which seed did, in one line
            raise done.failed(seed, error) from None
        done.finished(seed)
    if side_by_side:
        train_side_by_side(side_by_side, at_once, features, done.finished, done.failed)
    if not writes_run_directory():
        return finetuned
    finish_seeds(run, recipe, write_seeds_metrics(run, recipe, done.seeds, done.baseline))
    return FineTunedModel.load(run.path)


class _SeedsDone:
    """The seeds of a run and which have finished; `metrics.json` after each."""

    def __init__(self, recipe: Recipe, run: RunDirectory, features):
        from bertkit.parallel.multi_process import writes_run_directory

        self.recipe, self.run, self.seeds = recipe, run, seed_values(recipe.training)
        self.writes = writes_run_directory()
        self.baseline = validation_baseline(recipe, features) if self.writes else None
        self.done: list[int] = []

    def unfinished(self):
        """(`k of N`, seed, its run directory) of each seed still to train; says the others."""
        from bertkit.parallel.multi_process import process_zero_decides

        for index, seed in enumerate(self.seeds):
            seed_run = RunDirectory(seed_dir(self.run, seed))
            position = f"{index + 1} of {len(self.seeds)}"
            if process_zero_decides(lambda run=seed_run: run.status() == FINISHED):
                say(f"seed {seed} ({position}): finished, skipped")
                self.done.append(seed)
            else:
                yield position, seed, seed_run

    def failed(self, seed: int, error: UserError) -> UserError:
        """`error` of one seed, its message led by the seed (`seed 43: training diverged:
        ...`) and kept in the run's `run.json` (`failed_seed`) until a run of the seeds
        finishes."""
        if not error.message.startswith(f"seed {seed}: "):  # a child's names it already
            error = UserError(f"seed {seed}: {error}")
        if self.writes and self.run.run_file.is_file():
            self.run.set_status(RUNNING, failed_seed={"seed": seed, "error": error.message})
        return error

    def finished(self, seed: int) -> None:
        """Rewrites `metrics.json` with `seed` done, and flags it if it did not learn."""
        self.done.append(seed)
        if not self.writes:
            return
        done = sorted(self.done, key=self.seeds.index)
        metrics = write_seeds_metrics(self.run, self.recipe, done, self.baseline)
        failed = next(e.get("failed") for e in metrics["seeds"] if e["seed"] == seed)
        if failed:
            say(failed)


def seed_values(training) -> list[int]:
    """`training.seed`, `seed + 1`, ... (`training.seeds` of them)."""
    last = training.seed + training.seeds - 1
    if last > LARGEST_SEED:
        raise UserError(
            f"seeds from {training.seed} to {last} go past {LARGEST_SEED}, the "
            "largest seed; lower training.seed",
            key="training.seeds",
        )
    return list(range(training.seed, last + 1))


def seed_dir(run: RunDirectory, seed: int) -> Path:
    return run.path / "seeds" / f"seed-{seed}"


def seed_recipe(recipe: Recipe, seed: int, run: RunDirectory) -> Recipe:
    """One seed's recipe: an ordinary run (`seeds: 1`) in `seeds/seed-<seed>/`."""
    training = dataclasses.replace(recipe.training, seed=seed, seeds=1)
    return dataclasses.replace(
        recipe, training=training, search=None, output_dir=str(seed_dir(run, seed))
    )


def validation_baseline(recipe: Recipe, features=None) -> tuple[float, str] | None:
    """The task's `baseline` on the validation examples (read, not featurized), or None."""
    from bertkit.task import Task
    from bertkit.training.task_data import make_task

    task = make_task(recipe)
    if type(task).baseline is Task.baseline:
        return None
    if features:
        from bertkit.training.feature_file import read_feature_file

        examples = read_feature_file(features, example_type=task.Example).validation_examples
    elif recipe.data.validation:
        examples = task.read(recipe.data.validation)
    else:
        examples = task.split_validation(task.read(recipe.data.train))[1]
    return task.baseline(examples) if examples else None


# ---- the aggregate
def write_seeds_metrics(run: RunDirectory, recipe: Recipe, seeds: list[int], baseline) -> dict:
    """`metrics.json` of the seeds finished so far; returns it."""
    from bertkit.training.task_data import make_task

    task = make_task(recipe)  # an instance: its monitor may follow its options
    entries, failed, monitor = [], [], "loss"
    for seed in seeds:
        metrics = read_json(RunDirectory(seed_dir(run, seed)).metrics_file)
        monitor = metrics.get("monitor", monitor)
        entries.append({"seed": seed, "run": f"seeds/seed-{seed}", **metrics.get("final", {})})
        value = entries[-1].get("validation", {}).get(task.monitor)
        line = failed_seed_line(seed, value, baseline, task.monitor, task.mode)
        if line:
            entries[-1]["failed"] = line
            failed.append(line)
    kept = kept_seed(entries, task.monitor, task.mode, recipe.training.keep_seed)
    mean, sd = mean_and_sd(entries)
    result = {
        "monitor": monitor,
        "keep_seed": recipe.training.keep_seed,
        "kept_seed": kept,
        "seeds": entries,
        "mean": mean,
        "sd": sd,
        "failed_seeds": failed,
    }
    write_json(run.metrics_file, result)
    return result


def failed_seed_line(seed: int, value, baseline, monitor: str, mode: str) -> str | None:
    """The one line that flags a seed that did not learn, or None.

    Example:
        >>> failed_seed_line(44, 0.5, (0.5, "majority-class"), "accuracy", "max")
        'seed 44: val_accuracy 0.500 is at the majority-class baseline 0.500; it did not learn'
        >>> failed_seed_line(42, 0.8, (0.5, "majority-class"), "accuracy", "max") is None
        True
    """
    if value is None or baseline is None:
        return None
    level, name = baseline
    if (value > level if mode == "max" else value < level) and abs(value - level) > 1e-9:
        return None
    where = "at" if abs(value - level) <= 1e-9 else ("below" if mode == "max" else "above")
    return (
        f"seed {seed}: val_{monitor} {value:.3f} is {where} the {name} baseline "
        f"{level:.3f}; it did not learn"
    )


def kept_seed(entries: list[dict], monitor: str, mode: str, keep: str) -> int:
    """The seed whose validation `monitor` is the median (of an even number, the worse of
    the two middle ones) or the best (`keep="best"`, the first of equals); without
    validation metrics, the first seed.

    Example:
        >>> entries = [{"seed": s, "validation": {"f1": v}} for s, v in
        ...            [(42, 0.7), (43, 0.9), (44, 0.8), (45, 0.6)]]
        >>> kept_seed(entries, "f1", "max", "median"), kept_seed(entries, "f1", "max", "best")
        (42, 43)
    """
    scored = [e for e in entries if monitor in e.get("validation", {})]
    if not scored:
        return entries[0]["seed"]
    best_first = sorted(scored, key=lambda e: e["validation"][monitor], reverse=mode == "max")
    return best_first[0 if keep == "best" else len(best_first) // 2]["seed"]


def mean_and_sd(entries: list[dict]) -> tuple[dict, dict]:
    """Mean and sample standard deviation (None for one seed) of every number that each
    seed has in its `validation` and `test` metrics.

    Example:
        >>> mean_and_sd([{"validation": {"f1": 0.5}}, {"validation": {"f1": 0.7}}])
        ({'validation': {'f1': 0.6}}, {'validation': {'f1': 0.141421}})
    """
    mean, sd = {}, {}
    for split in ("validation", "test"):
        names = [
            name
            for name, value in entries[0].get(split, {}).items()
            if all(_is_number(e.get(split, {}).get(name)) for e in entries)
        ]
        for name in names:
            values = [float(e[split][name]) for e in entries]
            mean.setdefault(split, {})[name] = round(statistics.fmean(values), 6)
            sd.setdefault(split, {})[name] = (
                round(statistics.stdev(values), 6) if len(values) > 1 else None
            )
    return mean, sd


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# ---- the kept model, the report, the model card
def finish_seeds(run: RunDirectory, recipe: Recipe, metrics: dict) -> None:
    """Links the kept seed's model into `run`, writes the report and model card, prints
    the mean ± sd and marks the run finished."""
    from bertkit.training.seed_report import summary_line, write_seeds_report
    from bertkit.training.task_data import make_task

    kept = RunDirectory(seed_dir(run, metrics["kept_seed"]))
    for name in ("model", "saved_model"):
        keep_folder(run, kept.path / name, name)
    write_seeds_report(run.path, recipe, metrics)
    say(summary_line(metrics, make_task(recipe).monitor))  # failed seeds: said as each ended
    run.set_status(
        FINISHED,
        seeds=[e["seed"] for e in metrics["seeds"]],
        kept_seed=metrics["kept_seed"],
        failed_seed=None,  # one that failed before, trained again since
    )


def keep_folder(run: RunDirectory, source: Path, name: str) -> None:
    """`run/name` becomes a hard-linked copy of `source` (or goes, if `source` is absent)."""
    if source.is_dir():
        run.replace_folder(
            name,
            lambda folder: shutil.copytree(
                source, folder, dirs_exist_ok=True, copy_function=_link_or_copy
            ),
        )
    elif (run.path / name).is_symlink() or (run.path / name).is_file():
        (run.path / name).unlink()
    elif (run.path / name).is_dir():
        shutil.rmtree(run.path / name)


def _link_or_copy(source, target) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system, or links not allowed
        shutil.copy2(source, target)
