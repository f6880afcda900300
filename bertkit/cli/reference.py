"""The generated reference pages of the docs, written from the code so they cannot drift.

`recipe_reference()` renders the JSON Schema that `bertkit schema` prints (every key with
its type, default, range or choices and help text); `cli_reference()` renders the argument
parsers of `bertkit` (every command, argument, default and help text). The docs' MkDocs hook
(`docs/hooks/reference.py`) puts them into `docs/reference/recipe.md` and `cli.md` at build
time. `undocumented_keys` and `undocumented_arguments` name what has no help text
(tests/test_help_texts.py fails on any). Nothing here imports TensorFlow.

Example:
    >>> schema = {"type": "object", "properties": {
    ...     "epochs": {"type": "integer", "minimum": 1, "default": 3, "description": "passes"},
    ...     "seed": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None}}}
    >>> print(key_table(schema))
    | Key | Type | Default | Range or choices | Description |
    |---|---|---|---|---|
    | `epochs` | integer | `3` | ≥ 1 | passes |
    | `seed` | integer or null | `null` |  |  |
    >>> undocumented_keys(schema)
    ['seed']
"""

from __future__ import annotations

import argparse
import json

_BOUNDS = (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<"))
_TABLE_HEAD = "| Key | Type | Default | Range or choices | Description |\n|---|---|---|---|---|"


# ---------------------------------------------------------------- the recipe (JSON Schema)
def recipe_reference() -> str:
    """The recipe reference: the top-level keys, then one section per section of a recipe
    (`task` and `data` with one part per installed task)."""
    from bertkit.recipes.recipe import recipe_json_schema

    schema = recipe_json_schema()
    parts = ["## Top level", key_table(schema, nested=False)]
    for key, prop in schema["properties"].items():
        variants = [v for v in prop.get("anyOf", []) if "properties" in v]
        if "properties" in prop:
            parts += [f"## `{key}`", *_description(prop), key_table(prop), *_patterns(prop, key)]
        elif variants:
            parts += [f"## `{key}`", _variants_intro(key)]
            for variant in variants:
                parts += [f"### `{key}` of `{variant['title']}`", key_table(variant)]
    return "\n\n".join(parts) + "\n"


def _variants_intro(key: str) -> str:
    if key == "task":
        return (
            "`task:` is a task's name alone (`task: tagging`), or a mapping of its `name` and "
            "the options below that differ from their defaults."
        )
    return f"The keys of `{key}:` depend on the recipe's task:"


def _description(prop: dict) -> list[str]:
    return [_sentence(prop["description"])] if "description" in prop else []


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def key_table(schema: dict, nested: bool = True) -> str:
    """A Markdown table of the keys of an object schema; with `nested`, the keys of a
    mapping inside it follow it, dotted (`lora.rank`)."""
    rows = [_row(key, prop, schema) for key, prop in schema_keys(schema, nested)]
    return "\n".join([_TABLE_HEAD, *rows])


def schema_keys(schema: dict, nested: bool = True, prefix: str = ""):
    """(dotted key, its schema) of each key of an object schema, depth first; the keys of
    an object inside an `anyOf` (an optional section) count as nested too."""
    for key, prop in schema.get("properties", {}).items():
        yield prefix + key, prop
        if nested:
            for inner in [prop, *prop.get("anyOf", [])]:
                if "properties" in inner:
                    yield from schema_keys(inner, nested, f"{prefix}{key}.")


def _row(key: str, prop: dict, schema: dict) -> str:
    required = key in schema.get("required", ()) and "default" not in prop
    default = "required" if required else _default(prop)
    cells = [f"`{key}`", type_text(prop), default, range_text(prop), prop.get("description", "")]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(prop: dict) -> str:
    if "default" not in prop:
        return ""
    return f"`{json.dumps(prop['default'])}`"


def type_text(prop: dict) -> str:
    """A key's type in words: `integer or null`, `list of string`, `name or mapping`.

    >>> type_text({"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]})
    'list of string or null'
    """
    if "const" in prop:  # the value itself is in range_text's column
        names = {bool: "boolean", int: "integer", float: "number", str: "string"}
        return names.get(type(prop["const"]), "any")
    if "enum" in prop:
        return "choice"
    if "anyOf" in prop:  # constants are named once, as "name"; range_text lists them
        kinds = ("name" if "const" in o else type_text(o) for o in prop["anyOf"])
        return " or ".join(dict.fromkeys(kinds))
    kind = prop.get("type", "mapping" if "properties" in prop else "any")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array":
        return f"list of {type_text(prop.get('items', {}))}"
    return "mapping" if kind == "object" else kind


def range_text(prop: dict) -> str:
    """A key's bounds (`≥ 0, < 1`) or choices (`"tpe"`, `"random"`), its options' too.

    >>> range_text({"anyOf": [{"enum": ["bfloat16", "float16"]}, {"type": "null"}]})
    '`"bfloat16"`, `"float16"`'
    """
    bounds = [f"{sign} {prop[key]}" for key, sign in _BOUNDS if key in prop]
    options = [prop, *prop.get("anyOf", [])]
    choices = [c for o in options for c in o.get("enum", [o["const"]] if "const" in o else [])]
    return ", ".join(bounds + [f"`{json.dumps(choice)}`" for choice in choices])


def _patterns(prop: dict, key: str) -> list[str]:
    """The keys an object takes by pattern (the searched keys of `search:`)."""
    parts = []
    for pattern, value in prop.get("patternProperties", {}).items():
        kinds = "; or ".join(option.get("description", "") for option in value.get("anyOf", []))
        parts.append(
            f"Any other key of `{key}:` is a dotted recipe key matching `{pattern}`: {kinds}."
        )
        for option in value.get("anyOf", []):
            if "properties" in option:
                parts.append(key_table(option))
    return parts


def undocumented_keys(schema: dict, prefix: str = "") -> list[str]:
    """The dotted keys of a JSON Schema without a description, in every section, variant
    and pattern (the task's `name`, a constant, is its own documentation)."""
    found = []
    for key, prop in schema_keys(schema, nested=False, prefix=prefix):
        if "description" not in prop and "const" not in prop:
            found.append(key)
        for index, option in enumerate([prop, *prop.get("anyOf", [])]):
            inner = f"{key}." if option is prop else f"{key}.<{option.get('title', index)}>."
            found += undocumented_keys(option, inner) if "properties" in option else []
            for value in option.get("patternProperties", {}).values():
                for kind in value.get("anyOf", []):
                    found += undocumented_keys(kind, f"{key}.<searched key>.")
    return found


# ---------------------------------------------------------------- the command line
def cli_reference(parser: argparse.ArgumentParser | None = None) -> str:
    """The command-line reference: each command's usage and arguments, by group, then the
    flags the installed tasks add to `bertkit predict`."""
    parser = parser or _bertkit_parser()
    parts = [f"```text\n{parser.format_usage().strip()}\n```", _command_list(parser)]
    for name, command in commands(parser).items():
        parts += [f"## `{parser.prog} {name}`", _sentence(command.description or "")]
        parts += [f"```text\n{command.format_usage().strip()}\n```"]
        for title, actions in argument_groups(command):
            parts += [f"**{title[:1].upper() + title[1:]}**", _argument_table(command, actions)]
    return "\n\n".join(parts + _task_flags()) + "\n"


def _bertkit_parser() -> argparse.ArgumentParser:
    from bertkit.cli import _parser

    return _parser()


def _subparsers(parser) -> argparse._SubParsersAction | None:
    found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return found[0] if found else None


def commands(parser) -> dict[str, argparse.ArgumentParser]:
    """{command name: its parser}, in the order `--help` lists them."""
    sub = _subparsers(parser)
    return dict(sub.choices) if sub is not None else {}


def _command_list(parser) -> str:
    rows = [
        f"| [`{a.dest}`](#{parser.prog}-{a.dest}) | {a.help} |"
        for a in _subparsers(parser)._choices_actions
    ]
    return "\n".join(["| Command | What it does |", "|---|---|", *rows])


def argument_groups(parser):
    """(group title, its documented actions) of each group that has any; `-h` and the
    arguments hidden from `--help` are left out."""
    for group in parser._action_groups:
        actions = [
            a
            for a in group._group_actions
            if not isinstance(a, argparse._HelpAction) and a.help is not argparse.SUPPRESS
        ]
        if actions:
            yield group.title, actions


def _argument_table(parser, actions) -> str:
    rows = [
        "| "
        + " | ".join(_cell(c) for c in (_argument(a), _argument_default(a), help_text(parser, a)))
        + " |"
        for a in actions
    ]
    return "\n".join(["| Argument | Default | Description |", "|---|---|---|", *rows])


def _argument(action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    value = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
    return ", ".join(f"`{option}{value}`" for option in action.option_strings)


def _argument_default(action) -> str:
    if action.nargs == 0 or action.default in (None, [], argparse.SUPPRESS):
        return ""
    return f"`{action.default}`"


def help_text(parser, action) -> str:
    """An argument's help as `--help` shows it (`%(default)s` filled in), with its choices."""
    text = (action.help or "") % {**vars(action), "prog": parser.prog}
    if action.choices and not isinstance(action.choices, dict):
        text += " (one of: " + ", ".join(f"`{c}`" for c in action.choices) + ")"
    return text


def _task_flags() -> list[str]:
    from bertkit.registry import describe_tasks

    rows = [
        f"| `{info.name}` | `{option.flag} {option.metavar}` | {_cell(option.help)} |"
        for info in describe_tasks()
        for option in info.predict_options
    ]
    if not rows:
        return []
    intro = "Flags of `bertkit predict` that the run's task adds (`bertkit tasks` lists them):"
    return [
        "### Task flags of `bertkit predict`",
        intro,
        "\n".join(["| Task | Flag | Description |", "|---|---|---|", *rows]),
    ]


def undocumented_arguments(parser: argparse.ArgumentParser | None = None) -> list[str]:
    """`command argument` for each argument and command without a help text."""
    parser = parser or _bertkit_parser()
    found = [
        f"{parser.prog} {name} (the command)"
        for name, sub in commands(parser).items()
        if not sub.description
    ]
    for name, sub in [("", parser), *commands(parser).items()]:
        for action in sub._actions:
            hidden = action.help is argparse.SUPPRESS or isinstance(
                action, argparse._SubParsersAction
            )
            if not hidden and not (action.help or "").strip():
                found.append(
                    f"{parser.prog} {name} {_argument(action).strip('`')}".replace("  ", " ")
                )
    return found
