"""The embedding task's data: (anchor, positive[, negative]) pairs or scored text pairs,
read from CSV, TSV or JSON lines with `bertkit.tabular`, and made into model rows.

A row holds all the texts of its example (the row contract: a row's loss reads its own
row, and the batch for in-batch negatives): the anchor as `token_ids` / `segment_ids`
with its own `padding_mask`, the positive and negative as `positive_token_ids` and
`negative_token_ids` with theirs. Each is padded inside the row to the row's longest text,
so that `Features.lengths` (and length buckets) count the longest text, and `pad_batch`
pads them all alike.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from bertkit.errors import UserError
from bertkit.tabular import detect_format, read_records, read_rows
from bertkit.task import Features

TEXTS = ("anchor", "positive", "negative")  # the texts of a row, in the model's order


@dataclasses.dataclass(frozen=True)
class PairExample:
    """One training or validation example; `predict` makes ones of an anchor alone."""

    anchor: str
    positive: str | None = None
    negative: str | None = None
    score: float | None = None  # scored pairs: in [0, 1] once read
    source: str | None = None
    line: int | None = None


def read_pairs(path, data) -> list[PairExample]:
    """The (anchor, positive) pairs of `path`, with negatives when its first row has the
    `data.negative` column (then every row needs one)."""
    fmt = detect_format(path, data.format)
    first = next(iter(read_records(path, fmt)), (None, {}))[1]
    columns = [data.anchor, data.positive]
    if data.negative and data.negative in first:
        columns.append(data.negative)
    examples = []
    for line, row in read_rows(path, fmt, columns):
        texts = [_text(row, name, path, line) for name in columns] + [None]
        examples.append(PairExample(texts[0], texts[1], texts[2], None, str(path), line))
    return examples


def read_scored_pairs(path, data) -> list[PairExample]:
    """The (text, text_pair, score) rows of `path`, scores mapped from
    [`data.score_min`, `data.score_max`] to [0, 1]."""
    fmt = detect_format(path, data.format)
    columns = [data.text, data.text_pair, data.score]
    examples = []
    for line, row in read_rows(path, fmt, columns):
        text, pair = (_text(row, name, path, line) for name in columns[:2])
        score = _score(row[data.score], data, path, line)
        examples.append(PairExample(text, pair, None, score, str(path), line))
    return examples


def _text(row: dict, name: str, path, line: int) -> str:
    value = row[name]  # read_rows: present and not empty
    if not isinstance(value, str):
        raise UserError(f"expected a text, got {value!r:.40}", source=path, line=line, key=name)
    return value


def _score(value, data, path, line: int) -> float:
    try:
        score = float(value)
    except (TypeError, ValueError):
        score = math.nan
    low, high = data.score_min, data.score_max
    if isinstance(value, bool) or not low <= score <= high:
        raise UserError(
            f"expected a score from {low:g} to {high:g}, got {value!r:.40}",
            source=path,
            line=line,
            key=data.score,
        )
    return (score - low) / (high - low)


def pair_features(tokenizer, examples: list, texts: int, sequence_length: int) -> Features:
    """Model rows of `examples` with `texts` texts each (2: anchor and positive, 3: and a
    negative); a text an example lacks (predict's positive) is a row of no tokens."""
    names = TEXTS[:texts]
    encoded = {name: _encode(tokenizer, examples, name, sequence_length) for name in names}
    widths = [max(len(encoded[name][row]) for name in names) for row in range(len(examples))]
    columns = {"segment_ids": [np.zeros(width, np.int32) for width in widths]}
    for name in names:
        ids_name = "token_ids" if name == "anchor" else f"{name}_token_ids"
        columns[ids_name] = [_padded(ids, w) for ids, w in zip(encoded[name], widths, strict=True)]
        columns[f"{name}_mask"] = [
            _padded(np.ones(len(ids), np.int32), w)
            for ids, w in zip(encoded[name], widths, strict=True)
        ]
    positives = {}  # a key per distinct positive text: another row's equal one is no negative
    keys = [positives.setdefault(e.positive, len(positives)) for e in examples]
    columns["positive_key"] = np.array(keys, np.int32)
    columns["scores"] = np.array([e.score or 0.0 for e in examples], np.float32)
    return Features(columns, example_index=np.arange(len(examples)))


def _encode(tokenizer, examples: list, name: str, sequence_length: int) -> list:
    """Each example's `name` text as word-piece ids ([CLS] ... [SEP]); none for a missing one."""
    given = [i for i, e in enumerate(examples) if getattr(e, name) is not None]
    ids = [np.zeros(0, np.int32)] * len(examples)
    if given:
        texts = [getattr(examples[i], name) for i in given]
        encoded, _ = tokenizer.encode(texts, sequence_length=sequence_length)
        for i, row in zip(given, encoded, strict=True):
            ids[i] = np.asarray(row, np.int32)
    return ids


def _padded(values: np.ndarray, width: int) -> np.ndarray:
    return np.pad(values, (0, width - len(values)))
