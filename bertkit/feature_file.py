"""Tokenized features in one `.npz` file, so training can run where TensorFlow is absent.

`bertkit featurize RECIPE` tokenizes the recipe's data once (tf-text, on a machine with
TensorFlow) and writes the training rows, the validation rows and the validation examples;
`bertkit finetune RECIPE --features FILE` then trains from it with any Keras backend, for
example `KERAS_BACKEND=jax` on a GPU machine that has only JAX. The file holds plain arrays and
JSON (no pickles): ragged columns are stored as concatenated values plus row offsets.
"""

from __future__ import annotations

import dataclasses
import importlib
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


def _examples_to_json(examples: list) -> dict:
    if not examples:
        return {"type": None, "items": []}
    kind = type(examples[0])
    if not dataclasses.is_dataclass(kind):
        raise TypeError(f"examples of type {kind.__name__} are not dataclasses")
    return {"type": f"{kind.__module__}:{kind.__qualname__}",
            "items": [dataclasses.asdict(e) for e in examples]}


def _examples_from_json(value: dict) -> list:
    if value["type"] is None:
        return []
    module, _, name = value["type"].partition(":")
    kind = getattr(importlib.import_module(module), name)
    return [kind(**{k: tuple(v) if isinstance(v, list) else v for k, v in item.items()})
            for item in value["items"]]


def write_feature_file(path, *, description: dict, train: Features,
                       validation: Features | None, validation_examples: list | None) -> Path:
    """Saves featurized splits and what is needed to evaluate the validation split.

    Validation rows whose decoding needs extras (character offsets, windows: tagging,
    span QA) are left out: those tasks decode with TensorFlow ops anyway, so their
    validation is evaluated where TensorFlow is (`bertkit evaluate RUN_DIR`).
    """
    arrays: dict = {}
    header = {"format": FORMAT_VERSION, "description": description,
              "train": _pack_features("train", train, arrays)}
    if validation is not None and not validation.extras:
        header["validation"] = _pack_features("validation", validation, arrays)
        header["validation_examples"] = _examples_to_json(validation_examples or [])
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


def read_feature_file(path) -> FeatureFile:
    """Loads what `write_feature_file` wrote (no TensorFlow needed)."""
    try:
        data = np.load(path, allow_pickle=False)
        header = json.loads(bytes(data["header"]).decode())
    except FileNotFoundError:
        raise UserError("features file not found", source=path) from None
    except (OSError, ValueError, KeyError) as error:
        raise UserError(f"not a bertkit features file ({error})", source=path) from None
    if header.get("format") != FORMAT_VERSION:
        raise UserError(f"features file format {header.get('format')} is not "
                        f"{FORMAT_VERSION}; featurize again", source=path)
    validation = None
    if "validation" in header:
        validation = _unpack_features("validation", header["validation"], data)
    examples = (_examples_from_json(header["validation_examples"])
                if "validation_examples" in header else None)
    return FeatureFile(header["description"], _unpack_features("train", header["train"], data),
                       validation, examples)
