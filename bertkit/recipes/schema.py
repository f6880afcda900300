"""Strict, typed validation of nested mappings into frozen dataclasses.

The recipe schema is written as ordinary dataclasses (see `bertkit.recipes.recipe` and
each task's `Options`/`Data`); this module checks a parsed YAML mapping against
them and turns every mistake into one `UserError` with file, line and key path.
It also renders the same dataclasses as JSON Schema for editor completion.

Field metadata understood here: `help` (description), `min`/`max` (inclusive
bounds; of each item, for a list), `min_exclusive`, `max_exclusive`, and `path=True` (a
file path, resolved against the recipe's folder).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path

from bertkit.errors import UserError


@dataclasses.dataclass(frozen=True)
class Origin:
    """Where values come from: a file plus {key path: line}, or a label like `--set`."""

    source: str
    lines: dict = dataclasses.field(default_factory=dict)
    base_dir: Path | None = None

    def error(self, message: str, path: tuple) -> UserError:
        line = None
        for cut in range(len(path), -1, -1):  # nearest enclosing key with a known line
            if path[:cut] in self.lines:
                line = self.lines[path[:cut]]
                break
        key = ".".join(str(p) for p in path) or None
        return UserError(message, source=self.source, line=line, key=key)

    def base_dir_for(self, path: tuple) -> Path | None:
        return self.base_dir


class MixedOrigin:
    """Values from a file, some replaced by overrides (`--set`, keyword arguments): each key
    knows its origin.

    `overridden` maps each key path an override set to that override's `Origin`. A key
    inside an overridden one is the override's; so is a section the file lacks that an
    override made on its way (`--set foo.bar=1` in a recipe without `foo`).
    """

    def __init__(self, file_origin: Origin, overridden: dict):
        self.file_origin = file_origin
        self.overridden = overridden

    def for_path(self, path: tuple) -> Origin:
        for key, origin in self.overridden.items():
            if path[: len(key)] == key:
                return origin
        if path not in self.file_origin.lines:
            for key, origin in self.overridden.items():
                if key[: len(path)] == path:
                    return origin
        return self.file_origin

    def error(self, message: str, path: tuple) -> UserError:
        return self.for_path(path).error(message, path)

    def base_dir_for(self, path: tuple) -> Path | None:
        return self.for_path(path).base_dir


def build(cls, mapping, origin: Origin, path: tuple = ()):
    """Validates `mapping` against dataclass `cls` and returns an instance.

    Example:
        >>> @dataclasses.dataclass(frozen=True)
        ... class Training:
        ...     epochs: int = dataclasses.field(default=3, metadata={"min": 1})
        >>> build(Training, {"epochs": 2}, Origin("r.yaml"))
        Training(epochs=2)
        >>> build(Training, {"epoch": 2}, Origin("r.yaml", {("epoch",): 4}))
        Traceback (most recent call last):
        ...
        bertkit.errors.UserError: r.yaml:4: epoch: unknown key 'epoch'; did you mean 'epochs'?
    """
    if not isinstance(mapping, dict):
        raise origin.error(f"expected a mapping, got {_describe(mapping)}", path)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in mapping:
        if key not in fields:
            raise origin.error(_unknown_key_message(key, fields), path + (key,))
    hints = typing.get_type_hints(cls)
    values = {}
    for name, field in fields.items():
        if name in mapping:
            values[name] = check_value(hints[name], field, mapping[name], origin, path + (name,))
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise origin.error(f"missing required key '{name}'", path + (name,))
    return cls(**values)


def _unknown_key_message(key, fields) -> str:
    close = difflib.get_close_matches(str(key), list(fields), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else f"; expected one of: {', '.join(fields)}"
    return f"unknown key '{key}'{hint}"


def check_value(hint, field, value, origin: Origin, path: tuple):
    """Checks one value against a type hint and the field's metadata."""
    meta = field.metadata if field is not None else {}
    value = _check_type(hint, value, origin, path)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        _check_bounds(value, meta, origin, path)
    if isinstance(value, tuple):  # a list's bounds are each item's
        for index, item in enumerate(value):
            if isinstance(item, (int, float)) and not isinstance(item, bool):
                _check_bounds(item, meta, origin, path + (index,))
    base_dir = origin.base_dir_for(path)
    if meta.get("path") and isinstance(value, str) and base_dir is not None:
        value = str((base_dir / Path(value).expanduser()).resolve())
    return value


def _check_type(hint, value, origin, path):
    origin_type = typing.get_origin(hint)
    if origin_type in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        others = [o for o in options if o is not type(None)]
        if len(others) == 1:  # `X | None`: X's own error, with its key path (nested sections)
            return _check_type(others[0], value, origin, path)
        errors = []
        for option in (o for o in options if o is not type(None)):
            try:
                return _check_type(option, value, origin, path)
            except UserError as error:
                errors.append(error.message)
        raise origin.error(" or ".join(dict.fromkeys(errors)), path)
    if origin_type is typing.Literal:
        choices = typing.get_args(hint)
        if value in choices and type(value) in {type(c) for c in choices}:
            return value
        shown = ", ".join(repr(c) if c is not None else "null" for c in choices)
        raise origin.error(f"expected one of {shown}, got {_describe(value)}", path)
    if origin_type in (list, tuple):
        (item_type, *_) = typing.get_args(hint) or (object,)
        if not isinstance(value, list):
            raise origin.error(f"expected a list, got {_describe(value)}", path)
        return tuple(_check_type(item_type, v, origin, path + (i,)) for i, v in enumerate(value))
    if dataclasses.is_dataclass(hint):
        return build(hint, value, origin, path)
    return _check_scalar(hint, value, origin, path)


def _check_scalar(hint, value, origin, path):
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > _LARGEST_FLOAT:
            raise origin.error(f"expected a finite number, got {_describe(value)}", path)
        return float(value)
    is_bool_as_int = hint is int and isinstance(value, bool)
    if hint is object or (isinstance(value, hint) and not is_bool_as_int):
        return value
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    raise origin.error(f"expected {names.get(hint, hint.__name__)}, got {_describe(value)}", path)


_LARGEST_FLOAT = 2**1024 - 2**971  # sys.float_info.max as an int: float() of more overflows
_LARGEST_INTEGER = 2**63 - 1  # what every integer a recipe sets must fit (NumPy's int64)


def _check_bounds(value, meta, origin, path):
    if isinstance(value, float) and not math.isfinite(value):
        raise origin.error(f"expected a finite number, got {value}", path)
    largest = meta.get("max", _LARGEST_INTEGER if isinstance(value, int) else None)
    shown = _describe(value)
    if "min" in meta and value < meta["min"]:
        raise origin.error(f"must be at least {meta['min']}, got {shown}", path)
    if largest is not None and value > largest:
        raise origin.error(f"must be at most {largest}, got {shown}", path)
    if isinstance(value, int) and value < -_LARGEST_INTEGER:
        raise origin.error(f"must be at least {-_LARGEST_INTEGER}, got {shown}", path)
    if "min_exclusive" in meta and value <= meta["min_exclusive"]:
        raise origin.error(f"must be greater than {meta['min_exclusive']}, got {shown}", path)
    if "max_exclusive" in meta and value >= meta["max_exclusive"]:
        raise origin.error(f"must be less than {meta['max_exclusive']}, got {shown}", path)


def _describe(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, int) and abs(value) > 10**30:
        # Python refuses to print an integer of more than 4300 digits (a ValueError).
        return f"an integer of {_digits(value)} digits"
    return repr(value)


def _digits(value: int) -> int:
    """Decimal digits of an integer, counted without converting it to text."""
    digits = int(abs(value).bit_length() * math.log10(2))
    return digits + 1 if abs(value) >= 10**digits else digits


def to_plain(instance):
    """A dataclass instance as nested plain dicts/lists (for YAML and JSON output)."""
    if dataclasses.is_dataclass(instance):
        return {
            f.name: to_plain(getattr(instance, f.name))
            for f in dataclasses.fields(instance)
            if f.init
        }
    if isinstance(instance, (list, tuple)):
        return [to_plain(v) for v in instance]
    return instance


def json_schema(cls) -> dict:
    """JSON Schema (draft 2020-12) of a dataclass, with help texts and bounds.

    Example:
        >>> @dataclasses.dataclass(frozen=True)
        ... class Data:
        ...     train: str = dataclasses.field(metadata={"help": "training file"})
        >>> json_schema(Data)["required"]
        ['train']
    """
    hints = typing.get_type_hints(cls)
    properties, required = {}, []
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        prop = _type_schema(hints[field.name])
        meta = field.metadata
        if "help" in meta:
            prop["description"] = meta["help"]
        bounded = _bounded_part(prop)
        for key, schema_key in (
            ("min", "minimum"),
            ("max", "maximum"),
            ("min_exclusive", "exclusiveMinimum"),
            ("max_exclusive", "exclusiveMaximum"),
        ):
            if key in meta:
                bounded[schema_key] = meta[key]
        if field.default is not dataclasses.MISSING:
            prop["default"] = to_plain(field.default)
        elif field.default_factory is dataclasses.MISSING:
            required.append(field.name)
        properties[field.name] = prop
    schema = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema


def _bounded_part(prop: dict) -> dict:
    """Where a field's bounds go in its JSON Schema: itself, or its items (a list's, also in
    `anyOf` with null)."""
    for part in [prop, *prop.get("anyOf", ())]:
        if part.get("type") == "array":
            return part["items"]
    return prop


def _type_schema(hint) -> dict:
    origin_type = typing.get_origin(hint)
    if origin_type in (typing.Union, types.UnionType):
        return {"anyOf": [_type_schema(option) for option in typing.get_args(hint)]}
    if origin_type is typing.Literal:
        return {"enum": list(typing.get_args(hint))}
    if origin_type in (list, tuple):
        (item_type, *_) = typing.get_args(hint) or (object,)
        return {"type": "array", "items": _type_schema(item_type)}
    if dataclasses.is_dataclass(hint):
        return json_schema(hint)
    simple = {int: "integer", float: "number", bool: "boolean", str: "string", type(None): "null"}
    return {"type": simple[hint]} if hint in simple else {}
