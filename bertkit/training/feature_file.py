"""Tokenized features in one `.npz` file, so training can run where TensorFlow is absent.

`bertkit featurize RECIPE` tokenizes the recipe's data once (tf-text, on a machine with
TensorFlow) and writes the training rows, the validation rows and the validation examples;
`bertkit finetune RECIPE --features FILE` then trains from it with any Keras backend, for
example `KERAS_BACKEND=jax` on a GPU machine that has only JAX. The file holds plain arrays and
JSON (no pickles): ragged columns are stored as concatenated values plus row offsets. Its
layout is `bertkit.training.feature_file_schema`'s (docs/reference/features-file.md); reading
checks all of it in one pass, before anything is built from it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from bertkit.errors import UserError
from bertkit.task import Features
from bertkit.training import feature_file_checks as checks
from bertkit.training.feature_file_archive import (
    NOT_FEATURES,
    parse_header,
    read_archive,
    write_atomically,
)
from bertkit.training.feature_file_examples import (
    count_examples,
    examples_from_json,
    examples_to_json,
)
from bertkit.training.feature_file_schema import (
    COLUMNS,
    FORMAT_VERSION,
    member,
    member_name,
)

__all__ = [
    "FORMAT_VERSION",
    "FeatureFile",
    "check_feature_file",
    "keeps_validation",
    "read_feature_file",
]


def _stored(values: np.ndarray, pattern: str, column: str) -> np.ndarray:
    """`values` in the dtype the schema writes (a plugin's own columns keep theirs)."""
    return values.astype(member(pattern).write_dtype) if column in COLUMNS else values


def _pack_features(split: str, features: Features, arrays: dict) -> dict:
    columns = {}
    for name, column in features.columns.items():
        if features.is_sequence(name):
            lengths = np.fromiter(map(len, column), np.int64, len(column))
            values = np.concatenate(column) if column else np.zeros(0, np.int32)
            arrays[member_name(split, name, "values")] = _stored(
                values, "{split}/{column}/values", name
            )
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            arrays[member_name(split, name, "offsets")] = offsets.astype(np.int64)
            columns[name] = "sequence"
        else:
            arrays[member_name(split, name)] = _stored(np.asarray(column), "{split}/{column}", name)
            columns[name] = "scalar"
    arrays[member_name(split)] = np.asarray(features.example_index, np.int64)
    pads = {
        name: value.item() if hasattr(value, "item") else value
        for name, value in features.pad_values.items()
    }
    return {"rows": len(features), "columns": columns, "pad_values": pads}


def keeps_validation(
    validation: Features | None, examples: list | None, example_type: type | None
) -> bool:
    """Whether a features file can hold this validation split (see `write_feature_file`)."""
    return (
        validation is not None
        and not validation.extras
        and examples_to_json(examples or [], example_type) is not None
    )


def write_feature_file(
    path,
    *,
    description: dict,
    train: Features,
    validation: Features | None,
    validation_examples: list | None,
    example_type: type | None = None,
    data_files: dict | None = None,
    vocabulary: dict | None = None,
) -> Path:
    """Saves featurized splits and what is needed to evaluate the validation split.

    Validation rows whose decoding needs extras (character offsets, windows: tagging,
    span QA), or whose examples are not of the task's `example_type` (`Task.Example`),
    are left out: their validation is evaluated where TensorFlow is (`bertkit evaluate
    RUN_DIR`). `data_files` and `vocabulary` identify what the rows were made from
    (`bertkit.training.feature_file_data`). The file is written to a temporary file
    beside `path` and renamed over it, so a failed write leaves an older file intact.
    """
    arrays: dict = {}
    header = {
        "format": FORMAT_VERSION,
        "description": description,
        "data_files": data_files or {},
        "vocabulary": vocabulary or {},
        "train": _pack_features("train", train, arrays),
    }
    if keeps_validation(validation, validation_examples, example_type):
        header["validation"] = _pack_features("validation", validation, arrays)
        header["validation_examples"] = examples_to_json(validation_examples or [], example_type)
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    path = Path(path)
    write_atomically(path, arrays)
    return path


@dataclasses.dataclass
class FeatureFile:
    description: dict
    train: Features
    validation: Features | None
    validation_examples: list | None
    data_files: dict = dataclasses.field(default_factory=dict)
    vocabulary: dict = dataclasses.field(default_factory=dict)


def read_feature_file(path, example_type: type | None = None) -> FeatureFile:
    """Loads what `write_feature_file` wrote (no TensorFlow needed), every array and header
    field checked against the schema first (`check_feature_file`).

    Validation examples are rebuilt as `example_type` (the recipe's `Task.Example`) when
    the file's match it, else refused; without `example_type` they are not read.
    """
    header, splits, examples = check_feature_file(path, example_type)
    features = {split: _features(header[split], checked) for split, checked in splits.items()}
    return FeatureFile(
        header["description"],
        features["train"],
        features.get("validation"),
        examples,
        header["data_files"],
        header["vocabulary"],
    )


def check_feature_file(path, example_type: type | None = None) -> tuple[dict, dict, list | None]:
    """The header, each split's checked arrays and the validation examples of a features
    file; a `UserError` naming the file, array and first bad row for any departure from
    `bertkit.training.feature_file_schema`."""
    arrays = read_archive(path)
    if "header" not in arrays:
        raise UserError(f"{NOT_FEATURES} (no header)", source=path)
    raw = checks.check_array(arrays.pop("header"), "header", "header", path)
    if raw.dtype != np.uint8:
        raise UserError(f"{NOT_FEATURES} (its header is not bytes)", source=path)
    header = parse_header(raw.tobytes(), path)
    checks.check_format(header, path)
    limits = checks.check_limits(header, path)
    layouts = {"train": checks.check_layout("train", header.get("train"), path)}
    if "validation" in header:
        layouts["validation"] = checks.check_layout("validation", header["validation"], path)
    _check_members(arrays, layouts, path)
    examples_count, examples = None, None
    if "validation" in layouts:
        examples_count = count_examples(header.get("validation_examples"), path)
        if example_type is not None:  # first: the type the file names is the first question
            labels = header["description"]["state"].get("labels")
            examples = examples_from_json(header["validation_examples"], example_type, labels, path)
    splits = {
        split: _check_split(split, layout, arrays, limits, examples_count, path)
        for split, layout in layouts.items()
    }
    return header, splits, examples


def _features(layout: dict, checked: dict) -> Features:
    columns = {}
    for name, value in checked.items():
        if isinstance(value, tuple):  # a sequence: (values, offsets)
            values, bounds = value[0], value[1].tolist()  # slicing by Python ints: fast
            columns[name] = [values[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        elif name != "example_index":
            columns[name] = value
    return Features(columns, checked["example_index"], dict(layout["pad_values"]))


def _check_members(arrays: dict, layouts: dict, path) -> None:
    """The archive holds exactly the arrays its header's layouts name."""
    expected = set().union(*(checks.expected_members(s, layout) for s, layout in layouts.items()))
    missing = sorted(expected - set(arrays))
    if missing:
        raise checks.refuse(f"{missing[0]} is missing (the header names it)", path)
    unknown = sorted(set(arrays) - expected)
    if unknown:
        raise checks.refuse(f"holds an array its header does not name: {unknown[0][:80]!r}", path)


def _check_split(split, layout: dict, arrays: dict, limits: dict, examples, path) -> dict:
    """{column: array, or (values, offsets) for a sequence; "example_index": array}."""
    rows, columns, token_offsets = layout["rows"], {}, None
    names = sorted(layout["columns"], key=lambda name: name != "token_ids")  # token_ids first
    for name in names:
        if layout["columns"][name] == "sequence":
            columns[name] = _sequence(split, name, arrays, rows, limits, path)
            offsets = columns[name][1]
            if token_offsets is None:
                token_offsets = offsets
            elif not np.array_equal(offsets, token_offsets):
                _refuse_other_lengths(offsets, token_offsets, f"{split}/{name}", path)
        else:
            columns[name] = _scalar(split, name, arrays, rows, limits, path)
    name = member_name(split)
    index = checks.check_array(arrays[name], name, "{split}/example_index", path)
    checks.check_length(index, name, rows, f"the header's {rows} {split} rows", path)
    checks.check_example_index(index, name, split, examples, path)
    columns["example_index"] = index.astype(np.int64)
    return columns


def _sequence(split, name, arrays, rows, limits, path) -> tuple[np.ndarray, np.ndarray]:
    offsets_name, values_name = (member_name(split, name, part) for part in ("offsets", "values"))
    offsets = checks.check_array(
        arrays[offsets_name], offsets_name, "{split}/{column}/offsets", path
    )
    checks.check_length(offsets, offsets_name, rows + 1, f"the header's {rows} rows, and 1", path)
    values = checks.check_array(
        arrays[values_name], values_name, "{split}/{column}/values", path, column=name
    )
    checks.check_offsets(offsets, len(values), offsets_name, limits["sequence_length"], path)
    checks.check_range(
        values,
        f"{split}/{name}",
        name,
        limits,
        path,
        lambda i: int(np.searchsorted(offsets, i, side="right")) - 1,
    )
    return _stored(values, "{split}/{column}/values", name), offsets


def _refuse_other_lengths(offsets: np.ndarray, token_offsets: np.ndarray, name: str, path):
    lengths, token_lengths = np.diff(offsets), np.diff(token_offsets)
    row = int(np.flatnonzero(lengths != token_lengths)[0])
    raise checks.refuse(
        f"{name} row {row} has {lengths[row]} values; its token_ids row has {token_lengths[row]}",
        path,
    )


def _scalar(split, name, arrays, rows, limits, path) -> np.ndarray:
    array_name = member_name(split, name)
    array = checks.check_array(arrays[array_name], array_name, "{split}/{column}", path, name)
    checks.check_length(array, array_name, rows, f"the header's {rows} {split} rows", path)
    checks.check_range(array, array_name, name, limits, path, None)
    return _stored(array, "{split}/{column}", name)
