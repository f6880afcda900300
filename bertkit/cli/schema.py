"""`bertkit schema`: print the JSON Schema of recipes."""

from __future__ import annotations

import json

from bertkit.cli.arguments import add_command


def add_to(commands) -> None:
    add_command(commands, "schema", run, "print the JSON Schema of recipes")


def run(args) -> None:
    from bertkit.recipes.recipe import recipe_json_schema

    print(json.dumps(recipe_json_schema(), indent=2))
