"""Every recipe key and every command-line argument has a help text, and the generated
reference pages (docs/reference/recipe.md and cli.md, bertkit/cli/reference.py) show each."""

import argparse
import subprocess
import sys

from bertkit.cli import _parser, reference
from bertkit.recipes.recipe import recipe_json_schema
from bertkit.registry import describe_tasks

SCHEMA = recipe_json_schema()


def test_every_recipe_key_has_a_help_text():
    missing = reference.undocumented_keys(SCHEMA)
    assert not missing, (
        "recipe keys without a help text (metadata={'help': ...} on the dataclass field):\n  "
        + "\n  ".join(missing)
    )


def test_every_command_and_argument_has_a_help_text():
    missing = reference.undocumented_arguments(_parser())
    assert not missing, "arguments without help=...:\n  " + "\n  ".join(missing)


def test_every_predict_flag_of_a_task_has_a_help_text():
    missing = [
        f"{info.name} {option.flag}"
        for info in describe_tasks()
        for option in info.predict_options
        if not option.help.strip()
    ]
    assert not missing, f"task flags of `bertkit predict` without a help text: {missing}"


# ---------------------------------------------------------------- the checks can fail
def test_a_key_without_help_is_found_in_sections_variants_and_patterns():
    documented = {"type": "integer", "description": "ok"}
    schema = {
        "properties": {
            "training": {"properties": {"epochs": {"type": "integer"}, "seed": documented}},
            "task": {
                "anyOf": [
                    {"const": "tagging"},
                    {"title": "tagging", "properties": {"name": {"const": "tagging"}, "x": {}}},
                ],
                "description": "ok",
            },
            "search": {
                "description": "ok",
                "patternProperties": {"^t": {"anyOf": [{"properties": {"low": {}}}]}},
            },
            "output_dir": {"type": "string"},
        }
    }
    assert reference.undocumented_keys(schema) == [
        "training",
        "training.epochs",
        "task.<tagging>.x",
        "search.<searched key>.low",
        "output_dir",
    ]


def test_an_argument_or_command_without_help_is_found():
    parser = argparse.ArgumentParser(prog="tool")
    commands = parser.add_subparsers()
    run = commands.add_parser("run", description="runs")
    run.add_argument("recipe")
    run.add_argument("--out", metavar="DIR", help="where")
    run.add_argument("--quiet", action="store_true")
    run.add_argument("--hidden", help=argparse.SUPPRESS)
    commands.add_parser("bare")
    assert reference.undocumented_arguments(parser) == [
        "tool bare (the command)",
        "tool run recipe",
        "tool run --quiet",
    ]


# ---------------------------------------------------------------- the generated pages
def test_the_recipe_reference_shows_every_key_with_its_help():
    page = reference.recipe_reference()
    keys = list(reference.schema_keys(SCHEMA, nested=False))  # the top-level table
    for prop in SCHEMA["properties"].values():
        sections = [prop] if "properties" in prop else []
        sections += [v for v in prop.get("anyOf", []) if "properties" in v]
        keys += [key for section in sections for key in reference.schema_keys(section)]
    for key, prop in keys:
        help_text = " ".join(prop["description"].split()).replace("|", "\\|")
        rows = [line for line in page.splitlines() if line.startswith(f"| `{key}` |")]
        assert any(help_text in row for row in rows), f"no row of {key} with its help text"
    assert "| `rank` | integer | `8` |" not in page  # nested keys are dotted
    assert "| `lora.rank` | integer |" in page
    assert "### `data` of `tagging`" in page and "| `tag_column` | integer | `-1` |" in page


def test_the_cli_reference_shows_every_command_and_flag():
    page = reference.cli_reference()
    parser = _parser()
    for name, command in reference.commands(parser).items():
        assert f"## `bertkit {name}`" in page
        for action in command._actions:
            if action.help is argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            names = action.option_strings or [action.dest]
            assert any(f"`{n}" in page for n in names), f"{name}: {names}"
    assert "| `--heartbeat-timeout SECONDS` | `60` | end the job when a process" in page
    assert "| `classification` | `--top-k K` |" in page  # a task's flag of predict


def test_generating_the_references_imports_no_tensorflow():
    code = (
        "import sys\n"
        "from bertkit.cli import reference\n"
        "reference.recipe_reference(), reference.cli_reference()\n"
        "print(sorted({'tensorflow', 'keras', 'jax'} & set(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_every_name_of_the_public_api_has_a_docstring():
    import bertkit

    def written(name):  # a dataclass without a docstring gets its signature as one
        doc = (getattr(bertkit, name).__doc__ or "").strip()
        return doc and not doc.startswith(f"{name}(")

    bare = [name for name in bertkit.__all__ if not written(name)]
    assert not bare, f"bertkit.__all__ names without a docstring (docs/reference/api.md): {bare}"
