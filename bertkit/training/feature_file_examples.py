"""The validation examples a features file stores: JSON of the task's `Example` type.

The file only names the type; it is compared with the task's, never imported: a features
file is data from elsewhere and must not choose code to run. Each field's value must be
of the type the dataclass declares (a text, a number, a list of texts...), and a label
one of the task state's labels, so a bad example is refused before training, not in the
report at its end.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing

from bertkit.errors import UserError


def type_name(kind: type) -> str:
    return f"{kind.__module__}:{kind.__qualname__}"


def examples_to_json(examples: list, example_type: type | None) -> dict | None:
    """The examples as JSON, or None when they are not all of the task's `Example` type."""
    if not examples:
        return {"type": None, "items": []}
    if example_type is None or not all(type(e) is example_type for e in examples):
        return None
    return {"type": type_name(example_type), "items": [dataclasses.asdict(e) for e in examples]}


def count_examples(value, path) -> int:
    if not isinstance(value, dict) or not isinstance(value.get("items"), list):
        raise UserError(
            "header: validation_examples is not {type, items}; featurize again", source=path
        )
    return len(value["items"])


def examples_from_json(value, example_type: type, labels: list | None, path) -> list:
    """Rebuilds the stored examples as the recipe's task `Example` type, and only as that."""
    if value.get("type") is None:
        return []
    if value["type"] != type_name(example_type):
        raise UserError(
            f"validation examples of type {str(value['type'])[:80]!r}; the "
            f"recipe's task reads {type_name(example_type)}",
            source=path,
        )
    hints = typing.get_type_hints(example_type)
    fields = {field.name for field in dataclasses.fields(example_type)}
    examples = []
    for number, item in enumerate(value["items"], 1):
        if not isinstance(item, dict) or set(item) - fields:
            raise UserError(
                f"validation example {number} is not a {example_type.__name__} "
                f"(fields: {', '.join(sorted(fields))})",
                source=path,
            )
        _check_fields(item, hints, labels, number, path)
        try:
            examples.append(example_type(**{k: _frozen(v) for k, v in item.items()}))
        except TypeError as error:  # a required field missing
            raise UserError(f"validation example {number}: {error}", source=path) from None
    return examples


def _check_fields(item: dict, hints: dict, labels, number: int, path) -> None:
    for name, value in item.items():
        if not checker(hints.get(name, typing.Any))(value):
            raise UserError(
                f"validation example {number}: {name} is {value!r:.40}, not a "
                f"{_hint_words(hints[name])}; featurize again",
                source=path,
            )
    label = item.get("label")
    if labels is not None and isinstance(label, str) and label not in labels:
        raise UserError(
            f"validation example {number}: label {label!r:.40} is not among the task "
            "state's labels; featurize again",
            source=path,
        )


def matches(value, hint) -> bool:
    """Whether a JSON value is of a dataclass field's type (`tuple[str, ...]` as a list).

    Example:
        >>> matches(["a", "b"], tuple[str, ...]), matches(5, str | None), matches(None, str | None)
        (True, False, True)
    """
    return checker(hint)(value)


@functools.lru_cache(maxsize=256)
def checker(hint):
    """A function telling whether a JSON value is of type `hint`, made once per hint."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [checker(option) for option in args if option is not type(None)]
        if len(options) == 1 and type(None) in args:  # `X | None`, the common case
            return lambda value, check=options[0]: value is None or check(value)
        nullable = type(None) in args
        return lambda value: (nullable and value is None) or any(c(value) for c in options)
    if origin in (tuple, list):
        if origin is tuple and args and args[-1] is not Ellipsis:
            items = [checker(arg) for arg in args]
            return lambda value: (
                isinstance(value, list)
                and len(value) == len(items)
                and all(check(v) for check, v in zip(items, value, strict=True))
            )
        item = checker(args[0]) if args else (lambda value: True)
        return lambda value: isinstance(value, list) and all(map(item, value))
    return _SIMPLE.get(hint, lambda value: True)  # another annotation: the task's to check


_SIMPLE = {
    type(None): lambda value: value is None,
    str: lambda value: isinstance(value, str) and _encodes(value),
    bool: lambda value: isinstance(value, bool),
    int: lambda value: isinstance(value, int) and not isinstance(value, bool),
    float: lambda value: isinstance(value, (int, float)) and not isinstance(value, bool),
}


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


def _hint_words(hint) -> str:
    return {str: "text", int: "whole number", float: "number"}.get(
        hint, str(hint).replace("typing.", "")
    )


def _frozen(value):
    """JSON lists back to the tuples the frozen example dataclasses hold."""
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value
