"""`bertkit check RECIPE`: validate a recipe and print it fully resolved (and, on stderr,
the small-data hint of `bertkit.recipes.presets` for a small training set)."""

from __future__ import annotations

from bertkit.cli.arguments import add_command, add_set


def add_to(commands) -> None:
    sub = add_command(
        commands,
        "check",
        run,
        "validate a recipe (and what finetune checks before it trains) and print it fully resolved",
    )
    sub.add_argument("recipe", help="recipe YAML file")
    add_set(sub)


def run(args) -> None:
    from bertkit.recipes.preflight import check_run
    from bertkit.recipes.recipe import load_recipe

    recipe = load_recipe(args.recipe, args.overrides)
    check_run(recipe)  # "will this run start?": what finetune checks before it trains
    if recipe.search is not None:
        from bertkit.tuning.tuner import check_search

        check_search(recipe)  # and will its search: a validation split to score trials on
    hint = _small_data_hint(recipe)  # counted first: the recipe and its comment in one write
    print(recipe.to_yaml() + (f"# {hint}\n" if hint else ""), end="")  # `| head` takes it whole


def _small_data_hint(recipe) -> str | None:
    from bertkit.recipes.presets import small_data_hint
    from bertkit.training.task_data import make_task

    if recipe.training.preset == "small_data":  # the count is not needed
        return None
    return small_data_hint(recipe, len(make_task(recipe).read(recipe.data.train)))
