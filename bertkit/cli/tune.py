"""`bertkit tune RECIPE`: hyperparameter search over a recipe's `search:` section."""

from __future__ import annotations

from bertkit.cli.arguments import add_command, add_set, positive


def add_to(commands) -> None:
    sub = add_command(
        commands, "tune", run, "hyperparameter search over a recipe's search: section"
    )
    sub.add_argument("recipe", help="recipe YAML file")
    add_set(sub)
    _add_budget_options(sub)
    _add_study_options(sub)
    _add_worker_options(sub)


def _add_budget_options(sub) -> None:
    """When the search stops."""
    sub.add_argument(
        "--trials",
        type=positive,
        metavar="N",
        help="finished trials to reach (default: search.trials)",
    )
    sub.add_argument(
        "--timeout",
        type=positive,
        metavar="SECONDS",
        help="start no trial after this many seconds (default: search.timeout)",
    )


def _add_study_options(sub) -> None:
    """Where the study lives: its storage, name and folder."""
    sub.add_argument(
        "--storage",
        metavar="URL",
        help="Optuna RDB storage shared by workers, e.g. postgresql://host/db "
        "(default: sqlite:///STUDY_FOLDER/study.db)",
    )
    sub.add_argument(
        "--study",
        metavar="NAME",
        help="study name (default: output_dir's name; with --storage, plus a "
        "hash of the study folder's path)",
    )
    sub.add_argument("--output", metavar="DIR", help="study folder (default: <output_dir>.study)")


def _add_worker_options(sub) -> None:
    """What this worker does: keep its trial alive, or only write the report."""
    sub.add_argument(
        "--heartbeat",
        type=positive,
        default=60,
        metavar="SECONDS",
        help="how often a worker marks its trial alive; a trial silent for twice "
        "as long is failed and run again (default: 60)",
    )
    sub.add_argument(
        "--report", action="store_true", help="only write the study's report (report.md and plots)"
    )


def run(args) -> None:
    from bertkit.cli.quiet_import import import_tensorflow_quietly
    from bertkit.tuning import tuner as tuning

    place = {
        "storage": args.storage,
        "study_name": args.study,
        "output_dir": args.output,
        "overrides": args.overrides,
    }
    if args.report:
        tuning.report(args.recipe, **place)
        return
    tuning.require_optuna()  # a missing extra and a bad recipe answer before TensorFlow loads
    tuning.check_search(tuning.load_search_recipe(args.recipe, args.overrides))
    import_tensorflow_quietly()
    tuning.tune(
        args.recipe,
        trials=args.trials,
        timeout=args.timeout,
        heartbeat_seconds=args.heartbeat,
        **place,
    )
