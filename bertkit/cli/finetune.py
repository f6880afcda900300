"""`bertkit finetune RECIPE`: fine-tune the model a recipe describes (`bertkit.finetune`)."""

from __future__ import annotations

from bertkit.cli.arguments import add_command, add_process_options, add_set


def add_to(commands) -> None:
    sub = add_command(
        commands,
        "finetune",
        run,
        "fine-tune the model a recipe describes",
        needs_model=True,
        check=check,
    )
    sub.add_argument("recipe", help="recipe YAML file")
    add_set(sub)
    sub.add_argument("--output", metavar="DIR", help="run directory (replaces output_dir)")
    sub.add_argument("--overwrite", action="store_true", help="replace a finished run")
    sub.add_argument(
        "--seeds",
        metavar="N",
        help="train N seeds (training.seeds): mean ± sd, the median seed's model kept",
    )
    sub.add_argument(
        "--features",
        metavar="FILE",
        help="train from a file written by 'bertkit featurize' (no TensorFlow "
        "needed, e.g. KERAS_BACKEND=jax)",
    )
    add_process_options(sub)
    sub.epilog = (
        "An interrupted run (Ctrl-C, kill) resumes when the same command runs again. "
        "SIGTERM (SLURM, Kubernetes) saves the step that runs and exits 143. "
        "Checkpoints: at epoch ends, and with --set training.checkpoint_every_steps=N "
        "or training.checkpoint_every_minutes=M."
    )


def check(args) -> None:
    """What `bertkit check` checks, and `--output`: before TensorFlow loads."""
    from bertkit.recipes.preflight import check_run
    from bertkit.recipes.recipe import load_recipe

    recipe = load_recipe(args.recipe, _overrides(args))
    if args.output is not None:
        recipe = recipe.with_output_dir(args.output, source="--output")
    check_run(recipe, data_files=not args.features)


def _overrides(args) -> list[str]:
    return [*args.overrides, *([f"training.seeds={args.seeds}"] if args.seeds else [])]


def run(args) -> None:
    import bertkit
    from bertkit.parallel.multi_process import (
        start_processes,
        stopped_process_ends_job,
        writes_run_directory,
    )

    start_processes(
        args.coordinator,
        args.num_processes,
        args.process_id,
        args.heartbeat_timeout,
        args.startup_timeout,
    )  # before anything is built
    overrides = _overrides(args)
    with stopped_process_ends_job():  # one line, not JAX's traceback and abort
        model = bertkit.finetune(
            args.recipe,
            overrides=overrides,
            output_dir=args.output,
            overwrite=args.overwrite,
            features=args.features,
        )
    if writes_run_directory():
        exported = ", saved_model/" if model.run.saved_model_dir.is_dir() else ""
        print(f"run written to {model.run.path} (report.md, model card README.md{exported})")
