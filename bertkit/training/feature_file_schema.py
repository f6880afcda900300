"""What a features file holds, written down once: the writer and the checker read these tables.

A features file (`bertkit featurize`) is a `.npz` zip archive of plain `.npy` arrays, no
pickles. `MEMBERS` names each array (`{split}` is `train` or `validation`, `{column}` a
feature column), its dtype kind, rank and what its length must equal; `COLUMNS` gives each
known column's value range, by the name of a limit (`LIMITS`) that the header fixes;
`STATE_FIELDS` the task state's fields. `docs/reference/features-file.md` describes the same.

Example:
    >>> member("{split}/{column}/offsets").length
    'rows + 1'
    >>> COLUMNS["token_ids"].high, COLUMNS["labels"].ignored
    ('vocabulary', -100)
"""

from __future__ import annotations

import dataclasses

FORMAT_VERSION = 2
SPLITS = ("train", "validation")
# The tagging task's label of the word pieces its loss skips (its `IGNORED`), also the
# padding of its label rows: a sequence `labels` column may hold it besides [0, labels).
IGNORED_LABEL = -100

# Bounds on what the file may ask a reader to hold before any array is checked.
MAX_MEMBERS = 4096
MAX_HEADER_BYTES = 256 * 2**20
MAX_JSON_DEPTH = 64
MAX_DEFLATE_RATIO = 1100  # deflate cannot expand more than ~1032x: more is a forged size


@dataclasses.dataclass(frozen=True)
class Member:
    """One array of the archive (`{pattern}.npy`)."""

    pattern: str
    kinds: str  # numpy dtype kinds it may have: "i" signed, "u" unsigned integers, "f" floats
    ranks: tuple
    length: str  # what its first dimension must equal
    write_dtype: str  # what the writer stores
    meaning: str


MEMBERS = (
    Member("header", "u", (1,), "the header's bytes", "uint8", "UTF-8 JSON: the header"),
    Member(
        "{split}/{column}/values",
        "iu",
        (1,),
        "offsets[-1]",
        "int32",
        "a sequence column: every row's values, one row after the other",
    ),
    Member(
        "{split}/{column}/offsets",
        "iu",
        (1,),
        "rows + 1",
        "int64",
        "where each row starts in values: 0, then nondecreasing; row r is "
        "values[offsets[r]:offsets[r + 1]], of 1 to sequence_length pieces, as long as "
        "token_ids' row r",
    ),
    Member(
        "{split}/{column}",
        "iu",
        (1, 2),
        "rows",
        "int32",
        "a scalar column: one value (rank 1) or one fixed-size vector (rank 2) per row",
    ),
    Member(
        "{split}/example_index",
        "iu",
        (1,),
        "rows",
        "int64",
        "the example each row came from: -1 for rows of no single example; in the "
        "validation split each stored example's rows in turn (0, then the same or one "
        "more) or all -1",
    ),
)


def member(pattern: str) -> Member:
    return next(m for m in MEMBERS if m.pattern == pattern)


@dataclasses.dataclass(frozen=True)
class Column:
    """A known feature column: its values lie in [low, high); a name is a limit's."""

    name: str
    low: int | str
    high: int | str
    meaning: str
    ranks: tuple = (1,)  # as a scalar column
    ignored: int | None = None  # also allowed in its sequence form (and as its padding)


COLUMNS = {
    column.name: column
    for column in (
        Column("token_ids", 0, "vocabulary", "word-piece ids, [CLS] first (sequence)"),
        Column("segment_ids", 0, "segments", "0 for the first text, 1 for the second (sequence)"),
        Column(
            "labels",
            0,
            "labels",
            "label ids into the task state's labels: one per row (classification) or one "
            f"per word piece (tagging, {IGNORED_LABEL} where the loss skips the piece)",
            ignored=IGNORED_LABEL,
        ),
        Column("start_positions", 0, "sequence_length", "answer start piece (span QA)"),
        Column("end_positions", 0, "sequence_length", "answer end piece (span QA)"),
        Column("next_sentence", 0, 2, "1 where the second segment is a random one (MLM)"),
        Column("mask_positions", 0, "sequence_length", "masked piece positions (MLM)", ranks=(2,)),
        Column(
            "position_ids",
            0,
            "sequence_length",
            "each piece's position in its choice (multiple choice; sequence)",
        ),
        Column(
            "choice_index",
            0,
            "sequence_length",
            "each piece's choice, 1 to N (multiple choice; sequence)",
        ),
        Column(
            "choice_starts",
            0,
            "sequence_length",
            "each choice's [CLS] position (multiple choice)",
            ranks=(2,),
        ),
        Column(
            "mask_ids", -1, "vocabulary", "the masked pieces' ids, -1 in unused slots (MLM)", (2,)
        ),
    )
}
# A column of another task (a plugin's) is checked for kind, rank and length, not range.
OTHER_COLUMN_KINDS = "iuf"

LIMITS = {
    "vocabulary": "vocabulary.size: the checkpoint vocabulary's word pieces",
    "segments": "vocabulary.segments: the checkpoint's segment ids",
    "labels": "the number of the task state's labels",
    "sequence_length": "description.sequence_length: the recipe's backbone.sequence_length",
}


@dataclasses.dataclass(frozen=True)
class StateField:
    name: str
    meaning: str


STATE_FIELDS = (
    StateField(
        "labels",
        "a list of at least 2 distinct texts, the model's outputs in order; required when "
        "a split has a labels column",
    ),
    StateField("class_weights", "a list of finite numbers >= 0, one per label (tagging)"),
    StateField("null_score_threshold", "a finite number (span QA)"),
    StateField("target_mean", "a finite number (regression)"),
    StateField("target_std", "a finite number above 0 (regression)"),
    StateField(
        "num_choices",
        "a whole number of at least 2 (multiple choice); without `labels`, the labels "
        "column holds the right choice's index, below it",
    ),
)

HEADER_FIELDS = {
    "format": f"{FORMAT_VERSION}, this layout's number; another is refused",
    "description": "what model/task.json holds: task, options, data (paths relative to the "
    "recipe's folder), state, sequence_length, batch_size, bucket_lengths",
    "data_files": "per data file the rows came from (data.train, data.validation): its "
    "path relative to the recipe's folder, size in bytes and sha256",
    "vocabulary": "the checkpoint vocabulary the rows were tokenized with: size, sha256 of "
    "its word pieces joined by newlines, lowercase, segments",
    "train": "the training split's layout: rows, columns ({name: 'sequence' or 'scalar'}) "
    "and pad_values ({sequence column: padding value})",
    "validation": "the validation split's layout, when the file keeps it",
    "validation_examples": "the validation examples as the task's Example type: type "
    "('module:Class') and items (one object of its fields each)",
}


def member_name(split: str, column: str | None = None, part: str | None = None) -> str:
    """The archive name (without `.npy`) of a split's column, its part, or example_index.

    Example:
        >>> member_name("train", "token_ids", "offsets"), member_name("train")
        ('train/token_ids/offsets', 'train/example_index')
    """
    if column is None:
        return f"{split}/example_index"
    return f"{split}/{column}" + (f"/{part}" if part else "")
