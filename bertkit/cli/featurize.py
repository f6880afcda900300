"""`bertkit featurize RECIPE`: tokenize a recipe's data once into a features file."""

from __future__ import annotations

from bertkit.cli.arguments import add_command, add_set


def add_to(commands) -> None:
    sub = add_command(
        commands,
        "featurize",
        run,
        "tokenize a recipe's data once into a features file",
        needs_model=True,
        check=check,
    )
    sub.add_argument("recipe", help="recipe YAML file")
    add_set(sub)
    sub.add_argument("--out", metavar="FILE", help="default: <output_dir>.features.npz")
    sub.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --out that is not a features file of this recipe",
    )


def check(args) -> None:
    """What `bertkit check` checks: before TensorFlow loads."""
    from bertkit.recipes.preflight import check_run
    from bertkit.recipes.recipe import load_recipe

    check_run(load_recipe(args.recipe, args.overrides))


def run(args) -> None:
    from bertkit.training.trainer import featurize

    featurize(args.recipe, args.out, overrides=args.overrides, overwrite=args.overwrite)
