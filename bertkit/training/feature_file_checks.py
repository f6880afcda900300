"""The checks of a features file's header and arrays, against `feature_file_schema`.

Every check is a whole-array numpy expression (no Python loop per row), so checking
SST-2's 67k training rows takes milliseconds. Each failure is a `UserError` naming the
file, the split's array or the header's field, the first bad row and what was expected.
"""

from __future__ import annotations

import math

import numpy as np

from bertkit.errors import UserError
from bertkit.training.feature_file_schema import (
    COLUMNS,
    FORMAT_VERSION,
    OTHER_COLUMN_KINDS,
    member,
    member_name,
)

_KIND_WORDS = {"i": "integers", "u": "integers", "f": "numbers"}
_TYPE_WORDS = {"U": "text", "S": "bytes", "O": "Python objects", "b": "booleans"}


def refuse(message: str, path) -> UserError:
    return UserError(f"{message}; featurize again", source=path)


# ---- the header
def check_format(header, path) -> None:
    """The header is an object of this layout's format number."""
    found = header.get("format") if isinstance(header, dict) else None
    if not isinstance(header, dict) or not isinstance(found, int) or isinstance(found, bool):
        raise UserError("not a bertkit features file (its header has no format)", source=path)
    if found < FORMAT_VERSION:
        raise UserError(
            f"made by an older bertkit (features format {found}; this one reads "
            f"{FORMAT_VERSION}); featurize again",
            source=path,
        )
    if found > FORMAT_VERSION:
        raise UserError(
            f"made by a newer bertkit (features format {found}; this one reads "
            f"{FORMAT_VERSION}); featurize again with this bertkit, or upgrade it",
            source=path,
        )


def field(mapping: dict, key: str, kind, where: str, path):
    """`mapping[key]`, which must be of `kind` (a type or tuple of types, bool never an int)."""
    if not isinstance(mapping, dict) or key not in mapping:
        raise refuse(f"header: {where}{key} is missing", path)
    value = mapping[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise refuse(f"header: {where}{key} is {_shown(value)}; expected {names}", path)
    return value


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_limits(header: dict, path) -> dict:
    """The header's description, vocabulary and task state, and the limits they set."""
    description = field(header, "description", dict, "", path)
    for key, kind in (("task", str), ("options", dict), ("data", dict), ("state", dict)):
        field(description, key, kind, "description.", path)
    length = field(description, "sequence_length", int, "description.", path)
    vocabulary = field(header, "vocabulary", dict, "", path)
    limits = {
        "sequence_length": length,
        "vocabulary": field(vocabulary, "size", int, "vocabulary.", path),
        "segments": field(vocabulary, "segments", int, "vocabulary.", path),
    }
    field(vocabulary, "sha256", str, "vocabulary.", path)
    field(vocabulary, "lowercase", bool, "vocabulary.", path)
    for name, value in limits.items():
        if value < 1:
            raise refuse(f"header: {name} is {value}; expected 1 or more", path)
    field(header, "data_files", dict, "", path)
    limits["labels"] = check_state(description["state"], header, path)
    return limits


def check_state(state: dict, header: dict, path) -> int | None:
    """The task state's known fields (`STATE_FIELDS`); returns the number of labels."""
    where = "description.state."
    has_labels = any(
        isinstance(header.get(split), dict)
        and isinstance(header[split].get("columns"), dict)
        and "labels" in header[split]["columns"]
        for split in ("train", "validation")
    )
    labels = None
    if (has_labels and "num_choices" not in state) or "labels" in state:
        labels = field(state, "labels", list, where, path)
        if len(labels) < 2 or not all(isinstance(label, str) for label in labels):
            raise refuse(
                f"header: {where}labels is {_shown(labels)}; expected 2 or more texts", path
            )
        if len(set(labels)) != len(labels):
            raise refuse(f"header: {where}labels names a label twice: {_shown(labels)}", path)
    if "class_weights" in state:
        weights = field(state, "class_weights", list, where, path)
        if len(weights) != len(labels or ()) or not all(_finite(w) and w >= 0 for w in weights):
            raise refuse(
                f"header: {where}class_weights is {_shown(weights)}; expected "
                f"{len(labels or ())} finite numbers >= 0, one per label",
                path,
            )
    if "null_score_threshold" in state and not _finite(state["null_score_threshold"]):
        raise refuse(f"header: {where}null_score_threshold is not a finite number", path)
    _check_targets_and_choices(state, where, path)
    if labels is None and "num_choices" in state:
        return state["num_choices"]  # multiple choice: the labels are the right choices' indices
    return None if labels is None else len(labels)


def _check_targets_and_choices(state: dict, where: str, path) -> None:
    """Regression's target statistics (finite, a spread above 0) and multiple choice's
    number of choices (a whole number of at least 2)."""
    for name in ("target_mean", "target_std"):
        if name in state and not _finite(state[name]):
            raise refuse(f"header: {where}{name} is not a finite number", path)
    if "target_std" in state and state["target_std"] <= 0:
        raise refuse(f"header: {where}target_std is {state['target_std']}; expected above 0", path)
    if "num_choices" in state:
        count = state["num_choices"]
        if not isinstance(count, int) or isinstance(count, bool) or count < 2:
            raise refuse(f"header: {where}num_choices is {_shown(count)}; expected 2 or more", path)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_layout(split: str, layout, path) -> dict:
    """A split's layout: `rows`, `columns` and `pad_values` of the right kinds."""
    where = f"{split}."
    if layout is None:
        raise refuse(f"header: {split} is missing", path)
    if not isinstance(layout, dict):
        raise refuse(f"header: {split} is {_shown(layout)}; expected dict", path)
    rows = field(layout, "rows", int, where, path)
    if rows < 1:
        raise refuse(f"header: {where}rows is {rows}; expected at least 1", path)
    columns = field(layout, "columns", dict, where, path)
    for name, kind in columns.items():
        bad_name = not name.isidentifier() or name == "example_index"
        if bad_name or kind not in ("sequence", "scalar"):
            raise refuse(
                f"header: {where}columns: {_shown(name)}: {_shown(kind)}; expected a name "
                "(letters, digits, _) and 'sequence' or 'scalar'",
                path,
            )
    for name in ("token_ids", "segment_ids"):
        if columns.get(name) != "sequence":
            raise refuse(f"header: {where}columns has no sequence column {name}", path)
    pad_values = field(layout, "pad_values", dict, where, path)
    for name, value in pad_values.items():
        column = COLUMNS.get(name)
        allowed = () if column is None else (0, column.low, column.ignored)
        if (
            columns.get(name) != "sequence"
            or not _finite(value)
            or allowed
            and value not in allowed
        ):
            raise refuse(
                f"header: {where}pad_values: {_shown(name)}: {_shown(value)} is not a padding "
                "value of a sequence column",
                path,
            )
    return layout


def expected_members(split: str, layout: dict) -> set:
    names = {member_name(split)}
    for name, kind in layout["columns"].items():
        parts = ("values", "offsets") if kind == "sequence" else (None,)
        names.update(member_name(split, name, part) for part in parts)
    return names


# ---- the arrays
def check_array(array: np.ndarray, name: str, pattern: str, path, column=None) -> np.ndarray:
    """`array` is of the member's dtype kinds and ranks; returned in native byte order."""
    spec = member(pattern)
    kinds = OTHER_COLUMN_KINDS if column is not None and column not in COLUMNS else spec.kinds
    if array.dtype.kind not in kinds or array.dtype.fields is not None:
        what = _TYPE_WORDS.get(array.dtype.kind, "values")
        raise refuse(
            f"{name} holds {what} ({array.dtype.str}); expected {_KIND_WORDS[kinds[0]]}", path
        )
    ranks = (
        COLUMNS[column].ranks if pattern == "{split}/{column}" and column in COLUMNS else spec.ranks
    )
    if array.ndim not in ranks:
        expected = " or ".join(map(str, ranks))
        raise refuse(f"{name} has {array.ndim} dimensions {array.shape}; expected {expected}", path)
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        row = int(np.flatnonzero(~np.isfinite(array.reshape(len(array), -1)).all(axis=1))[0])
        raise refuse(f"{name} row {row} holds a value that is not finite", path)
    return array.astype(array.dtype.newbyteorder("="), copy=False)


def check_length(array: np.ndarray, name: str, expected: int, what: str, path) -> None:
    if len(array) != expected:
        raise refuse(f"{name} holds {len(array)} rows; expected {expected} ({what})", path)


def check_offsets(offsets: np.ndarray, values_length: int, name: str, limit: int, path) -> None:
    """Row r is values[offsets[r]:offsets[r + 1]]: 1 to `limit` pieces, inside values."""
    if offsets[0] != 0:
        raise refuse(f"{name} starts at {offsets[0]}; expected 0", path)
    lengths = np.diff(offsets.astype(np.int64))
    bad = np.flatnonzero((lengths < 1) | (lengths > limit))
    if bad.size:
        row, length = int(bad[0]), int(lengths[bad[0]])
        if length < 0:
            problem = f"ends (at {offsets[row + 1]}) before it starts (at {offsets[row]})"
        elif length == 0:
            problem = "has 0 pieces; a row has at least one"
        else:
            problem = f"has {length} pieces, past the sequence length {limit}"
        raise refuse(f"{name} row {row} {problem}", path)
    if offsets[-1] != values_length:
        raise refuse(f"{name} ends at {offsets[-1]}; its values hold {values_length}", path)


def check_range(values, name: str, column: str, limits: dict, path, row_of) -> None:
    """The values of a known column lie in its range; `row_of(i)`: the row of flat index i."""
    spec = COLUMNS.get(column)
    if spec is None or values.size == 0:
        return
    low, high = (limits[b] if isinstance(b, str) else b for b in (spec.low, spec.high))
    if high is None:  # no labels in the state to refer to
        raise refuse(f"{name}: the task state has no labels for it to refer to", path)
    flat = values.reshape(-1)
    bad = (flat < low) | (flat >= high)
    if spec.ignored is not None and row_of is not None:  # a sequence: skipped pieces
        bad &= flat != spec.ignored
    found = np.flatnonzero(bad)
    if found.size:
        index = int(found[0])
        row = row_of(index) if row_of is not None else index // (flat.size // len(values))
        value = flat[index]
        raise refuse(f"{name} row {row} holds {value}, {_outside(spec, value, low, high)}", path)


def _outside(spec, value, low: int, high: int) -> str:
    if value >= high:
        return {
            "vocabulary": f"past the vocabulary's {high} ids",
            "segments": f"past the checkpoint's {high} segment ids",
            "labels": f"past the task state's {high} labels",
            "sequence_length": f"past the sequence length {high}",
        }.get(spec.high, f"expected below {high}")
    also = f" (or {spec.ignored})" if spec.ignored is not None else ""
    return f"expected {low} or more{also}"


def check_example_index(index: np.ndarray, name: str, split: str, examples: int | None, path):
    """-1 for rows of no example; the validation split's rows are its examples' in order, one
    or more an example (windows): 0, then each the same as the one before or one more, up to
    the last stored example."""
    if split == "validation" and not (index == -1).all():
        steps = np.diff(index)
        wrong = np.concatenate([[index[0] != 0], (steps != 0) & (steps != 1)])
        if wrong.any():
            row = int(np.flatnonzero(wrong)[0])
            raise refuse(
                f"{name} row {row} holds {index[row]}; expected each stored validation "
                "example's rows in turn (0, then the same or one more)",
                path,
            )
        if examples != int(index[-1]) + 1:
            raise refuse(
                f"{name} holds rows of {int(index[-1]) + 1} validation examples for "
                f"{examples} stored; expected one or more rows per example",
                path,
            )
    bad = np.flatnonzero(index < -1)
    if bad.size:
        raise refuse(f"{name} row {int(bad[0])} holds {index[bad[0]]}; expected -1 or more", path)
