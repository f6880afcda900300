"""Safe YAML loading that remembers the line of every key.

Recipes are loaded with PyYAML's safe constructors only: a `!!python/...` tag is
an error, never executed. Each value's line is kept so that every later
validation error can say `recipe.yaml:12: training.learning_rate: ...`.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from pathlib import Path

import yaml

from bertkit.errors import UserError
from bertkit.files import read_text

KeyPath = tuple  # ("training", "learning_rate")


MAX_RECIPE_BYTES = 1_000_000  # recipes are short; a bigger file is a mistake or an attack
# The deepest recipe key path is 4 levels (search: training.lora.rank: choices: [...]);
# PyYAML composes nested values recursively, and a 2 KB `[[[[...` exhausts Python's stack.
MAX_NESTING = 32


class RecipeLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading `3e-5` as a number as YAML 1.2 does (1.1 wants `3.0e-5`).

    Anchors and aliases (`&a`, `*a`, `<<: *a`) are refused: ten lines of nested aliases
    (a "billion laughs") expand to gigabytes, and a recipe has no need of them. So are
    values nested more than `MAX_NESTING` levels deep, before they recurse that deep.
    """

    depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if self.depth >= MAX_NESTING:
            raise yaml.composer.ComposerError(
                None,
                None,
                f"values nested more than {MAX_NESTING} levels deep (at column "
                f"{event.start_mark.column + 1}); a recipe nests a few",
                event.start_mark,
            )
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(
                None,
                None,
                "anchors and aliases (&name, *name) are not allowed in recipes; "
                "write the values out",
                event.start_mark,
            )
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_scalar(text: str, key: str | None = None):
    """A command-line value as YAML would read it: `3` -> 3, `3e-5` -> 3e-05, `null` -> None.

    Invalid YAML, tags and aliases are a `UserError` from `--set`, naming `key`.
    """
    try:
        return parse_yaml(text, source="--set")[0]
    except UserError as error:
        raise UserError(f"{error.message} (in {text[:60]!r})", source="--set", key=key) from None


def load_yaml(path) -> tuple[object, dict[KeyPath, int]]:
    """Reads a YAML file into plain Python values plus a {key path: line} map.

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "r.yaml")
        >>> _ = open(path, "w").write("a:\\n  b: 3\\n")
        >>> load_yaml(path)
        ({'a': {'b': 3}}, {(): 1, ('a',): 1, ('a', 'b'): 2})
    """
    path = Path(path)
    if path.is_file() and path.stat().st_size > MAX_RECIPE_BYTES:
        raise UserError(
            f"is {path.stat().st_size:,} bytes; a recipe is at most {MAX_RECIPE_BYTES:,}",
            source=path,
        )
    return parse_yaml(read_text(path), source=path)


def parse_yaml(text: str, source="<string>") -> tuple[object, dict[KeyPath, int]]:
    """Parses YAML text; see `load_yaml`."""
    try:
        loader = RecipeLoader(text)  # checks every character first
    except yaml.reader.ReaderError as error:
        raise _character_error(text, error, source) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None, {(): 1}
        lines: dict[KeyPath, int] = {}
        return _to_python(loader, node, (), lines, source), lines
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = mark.line + 1 if mark else None
        problem = error.problem or str(error)
        if "could not determine a constructor" in problem:
            tag = problem.split("tag ")[-1]
            raise UserError(
                f"unsupported YAML tag {tag}; recipes are plain data", source=source, line=line
            ) from None
        raise UserError(f"invalid YAML: {problem}", source=source, line=line) from None
    except yaml.YAMLError as error:
        raise UserError(f"invalid YAML: {error}", source=source) from None
    finally:
        loader.dispose()


def _character_error(text: str, error, source) -> UserError:
    """A character YAML does not allow (a control character, a NUL byte), with its line and
    column: PyYAML's own message gives only an offset into "<unicode string>"."""
    line = text.count("\n", 0, error.position) + 1
    column = error.position - (text.rfind("\n", 0, error.position) + 1) + 1
    character = error.character
    if isinstance(character, str):
        character = ord(character)
    named = {0: "a NUL byte"}.get(character, "a control character")
    if unicodedata.category(chr(character)) != "Cc" and character:
        named = "a character YAML does not allow"
    return UserError(
        f"{named} (U+{character:04X}) at column {column}; YAML allows tabs, line ends and "
        "printable characters",
        source=source,
        line=line,
    )


_PLAIN_TAGS = {
    yaml.MappingNode: "tag:yaml.org,2002:map",
    yaml.SequenceNode: "tag:yaml.org,2002:seq",
}


def _to_python(loader, node, path: KeyPath, lines: dict, source):
    lines[path] = node.start_mark.line + 1
    if type(node) in _PLAIN_TAGS and node.tag != _PLAIN_TAGS[type(node)]:
        raise UserError(
            f"unsupported YAML tag '{node.tag}'; recipes are plain data",
            source=source,
            line=node.start_mark.line + 1,
        )
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        mapping = {}
        for key_node, value_node in node.value:
            key = _construct(loader, key_node, path, source)
            if not isinstance(key, str):
                raise UserError(
                    f"keys must be names, got {key!r}",
                    source=source,
                    line=key_node.start_mark.line + 1,
                )
            if key in mapping:
                raise UserError(
                    f"duplicate key '{key}'",
                    source=source,
                    line=key_node.start_mark.line + 1,
                    key=".".join(path + (key,)),
                )
            mapping[key] = _to_python(loader, value_node, path + (key,), lines, source)
            lines[path + (key,)] = key_node.start_mark.line + 1
        return mapping
    if isinstance(node, yaml.SequenceNode):
        return [
            _to_python(loader, item, path + (i,), lines, source)
            for i, item in enumerate(node.value)
        ]
    return _construct(loader, node, path, source)


def _construct(loader, node, path: KeyPath, source):
    """One scalar's value; one that cannot be read (`2001-13-45`, 5000 digits) is a UserError."""
    try:
        return loader.construct_object(node, deep=True)
    except ValueError as error:
        if node.tag == "tag:yaml.org,2002:int":  # int("9" * 5000): Python's 4300-digit limit
            digits = sum(character.isdigit() for character in node.value)
            message = (
                f"a number of {digits} digits is too long to read (at most "
                f"{sys.get_int_max_str_digits()})"
            )
        else:
            message = f"cannot read {node.value[:40]!r}: {error}"
        raise UserError(
            message,
            source=source,
            line=node.start_mark.line + 1,
            key=".".join(map(str, path)) or None,
        ) from None
