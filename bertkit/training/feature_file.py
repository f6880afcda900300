"""Tokenized features in one `.npz` file, so training can run where TensorFlow is absent.

`bertkit featurize RECIPE` tokenizes the recipe's data once (tf-text, on a machine with
TensorFlow) and writes the training rows, the validation rows and the validation examples;
`bertkit finetune RECIPE --features FILE` then trains from it with any Keras backend, for
example `KERAS_BACKEND=jax` on a GPU machine that has only JAX. The file holds plain arrays and
JSON (no pickles): ragged columns are stored as concatenated values plus row offsets.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from bertkit.errors import UserError
from bertkit.task import Features

FORMAT_VERSION = 1


def _pack_features(prefix: str, features: Features, arrays: dict) -> dict:
    columns = {}
    for name, column in features.columns.items():
        if features.is_sequence(name):
            arrays[f"{prefix}/{name}/values"] = np.concatenate(column) if column else np.zeros(0)
            arrays[f"{prefix}/{name}/offsets"] = np.cumsum([0] + [len(v) for v in column])
            columns[name] = "sequence"
        else:
            arrays[f"{prefix}/{name}"] = np.asarray(column)
            columns[name] = "scalar"
    arrays[f"{prefix}/example_index"] = np.asarray(features.example_index)
    return {"columns": columns, "pad_values": features.pad_values}


def _unpack_features(prefix: str, layout: dict, data) -> Features:
    columns = {}
    for name, kind in layout["columns"].items():
        if kind == "sequence":
            values, offsets = data[f"{prefix}/{name}/values"], data[f"{prefix}/{name}/offsets"]
            columns[name] = [values[a:b] for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
        else:
            columns[name] = data[f"{prefix}/{name}"]
    return Features(columns, data[f"{prefix}/example_index"], layout["pad_values"])


def _type_name(kind: type) -> str:
    return f"{kind.__module__}:{kind.__qualname__}"


def _examples_to_json(examples: list, example_type: type | None) -> dict | None:
    """The examples as JSON, or None when they are not all of the task's `Example` type."""
    if not examples:
        return {"type": None, "items": []}
    if example_type is None or not all(type(e) is example_type for e in examples):
        return None
    return {"type": _type_name(example_type), "items": [dataclasses.asdict(e) for e in examples]}


def _examples_from_json(value, example_type: type | None, path) -> list | None:
    """Rebuilds the stored examples as the recipe's task `Example` type, and only as that.

    The file only names the type; it is compared with the task's, never imported: a
    features file is data from elsewhere and must not choose code to run.
    """
    if not isinstance(value, dict) or not isinstance(value.get("items"), list):
        raise UserError("not a bertkit features file (validation examples)", source=path)
    if value.get("type") is None:
        return []
    if example_type is None or value["type"] != _type_name(example_type):
        expected = _type_name(example_type) if example_type else "none"
        raise UserError(
            f"validation examples of type {str(value['type'])[:80]!r}; the "
            f"recipe's task reads {expected}",
            source=path,
        )
    fields = {field.name for field in dataclasses.fields(example_type)}
    examples = []
    for number, item in enumerate(value["items"], 1):
        if not isinstance(item, dict) or set(item) - fields:
            raise UserError(
                f"validation example {number} is not a {example_type.__name__} "
                f"(fields: {', '.join(sorted(fields))})",
                source=path,
            )
        try:
            examples.append(example_type(**{k: _frozen(v) for k, v in item.items()}))
        except TypeError as error:  # a required field missing
            raise UserError(f"validation example {number}: {error}", source=path) from None
    return examples


def _frozen(value):
    """JSON lists back to the tuples the frozen example dataclasses hold."""
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value


def keeps_validation(
    validation: Features | None, examples: list | None, example_type: type | None
) -> bool:
    """Whether a features file can hold this validation split (see `write_feature_file`)."""
    return (
        validation is not None
        and not validation.extras
        and _examples_to_json(examples or [], example_type) is not None
    )


def write_feature_file(
    path,
    *,
    description: dict,
    train: Features,
    validation: Features | None,
    validation_examples: list | None,
    example_type: type | None = None,
) -> Path:
    """Saves featurized splits and what is needed to evaluate the validation split.

    Validation rows whose decoding needs extras (character offsets, windows: tagging,
    span QA), or whose examples are not of the task's `example_type` (`Task.Example`),
    are left out: their validation is evaluated where TensorFlow is (`bertkit evaluate
    RUN_DIR`).
    """
    arrays: dict = {}
    header = {
        "format": FORMAT_VERSION,
        "description": description,
        "train": _pack_features("train", train, arrays),
    }
    if keeps_validation(validation, validation_examples, example_type):
        header["validation"] = _pack_features("validation", validation, arrays)
        header["validation_examples"] = _examples_to_json(validation_examples or [], example_type)
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:
        np.savez(handle, **arrays)
    return path


@dataclasses.dataclass
class FeatureFile:
    description: dict
    train: Features
    validation: Features | None
    validation_examples: list | None


def read_feature_file(path, example_type: type | None = None) -> FeatureFile:
    """Loads what `write_feature_file` wrote (no TensorFlow needed).

    Validation examples are rebuilt as `example_type` (the recipe's `Task.Example`) when
    the file's match it, else refused; without `example_type` they are not read.
    """
    try:
        data = np.load(path, allow_pickle=False)
        header = json.loads(bytes(data["header"]).decode())
    except FileNotFoundError:
        raise UserError("features file not found", source=path) from None
    except (OSError, ValueError, KeyError) as error:
        raise UserError(f"not a bertkit features file ({error})", source=path) from None
    if not isinstance(header, dict) or header.get("format") != FORMAT_VERSION:
        found = header.get("format") if isinstance(header, dict) else None
        raise UserError(
            f"features file format {found} is not {FORMAT_VERSION}; featurize again", source=path
        )
    try:
        validation = None
        if "validation" in header:
            validation = _unpack_features("validation", header["validation"], data)
        train = _unpack_features("train", header["train"], data)
        description = dict(header["description"])
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise UserError(
            f"damaged features file ({type(error).__name__}: {error})"[:200], source=path
        ) from None
    examples = None
    if example_type is not None and "validation_examples" in header:
        examples = _examples_from_json(header["validation_examples"], example_type, path)
    return FeatureFile(description, train, validation, examples)
