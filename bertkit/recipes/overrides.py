"""Overrides of a recipe: `--set KEY=VALUE` strings and sections given as mappings.

They are applied to the raw recipe (parsed YAML) before it is checked against the
schema, so an override is checked as the file's own value would be; the key paths they
set let an error name `--set` instead of the file's line.
"""

from __future__ import annotations

from bertkit.errors import UserError
from bertkit.recipes.yaml_source import parse_scalar


def apply_overrides(raw: dict, overrides: list[str], sections: dict) -> dict:
    """Applies overrides in place; returns {key path they set: its origin's label} (for error
    locations): `--set`, or the section's keyword argument, `training=`."""
    touched = {}
    for text in overrides:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise UserError(f"expected KEY=VALUE, got '{text}'", source="--set")
        path = tuple(key.strip().split("."))
        _set_path(raw, path, parse_scalar(value, key.strip()) if value.strip() else None, text)
        touched[path] = "--set"
    for section, value in sections.items():
        if isinstance(value, dict) and isinstance(raw.get(section), dict):
            raw[section] = {**raw[section], **value}
            touched.update({(section, key): f"{section}=" for key in value})
        else:
            raw[section] = value
            touched[(section,)] = f"{section}="
    return touched


def _set_path(raw: dict, path: tuple, value, text: str) -> None:
    """Sets `raw[path[0]][path[1]]...` to `value`, making the sections on the way (a task
    given by name becomes `{"name": ...}`)."""
    node = raw
    for i, part in enumerate(path[:-1]):
        child = node.get(part)
        if child is None or isinstance(child, str) and (i, part) == (0, "task"):
            child = {"name": child} if part == "task" and isinstance(child, str) else {}
            node[part] = child
        if not isinstance(child, dict):
            raise UserError(
                f"'{'.'.join(path[: i + 1])}' is not a section", source="--set", key=".".join(path)
            )
        node = child
    node[path[-1]] = value
