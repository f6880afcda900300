"""Features files (issue 55, and issue 51's features-file items): checked in full on load,
portable between folders, and written by `featurize` without destroying a file.

Every damaged file is made in the test from one valid file, featurized once per module.
"""

import errno
import io
import json
import pickle
import re
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from bertkit.errors import UserError
from bertkit.testing import run_bertkit, write_sentiment_tsv, write_tiny_checkpoint
from bertkit.testing.tiny import tiny_vocabulary
from bertkit.training import feature_file_archive
from bertkit.training.feature_file import read_feature_file
from bertkit.training.feature_file_schema import (
    COLUMNS,
    HEADER_FIELDS,
    IGNORED_LABEL,
    MEMBERS,
    STATE_FIELDS,
)
from bertkit_tasks.classification.task import TextExample

DOCS = Path(__file__).resolve().parent.parent / "docs" / "reference" / "features-file.md"
RECIPE = {
    "schema": 1,
    "task": "classification",
    "backbone": {"preset": "./ckpt", "sequence_length": 32},
    "data": {"train": "train.tsv", "validation": "dev.tsv", "text": "sentence"},
    "training": {"epochs": 1, "batch_size": 8},
    "export": {"saved_model": False},
    "output_dir": "run",
}


def make_folder(folder: Path, data: bool = True) -> Path:
    write_tiny_checkpoint(folder / "ckpt", num_layers=1, hidden_size=16, intermediate_size=32)
    if data:
        write_sentiment_tsv(folder / "train.tsv", 16, seed=0)
        write_sentiment_tsv(folder / "dev.tsv", 8, seed=1)
    (folder / "r.yaml").write_text(yaml.safe_dump(RECIPE))
    return folder


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A folder with a tiny recipe, its data and checkpoint, and `features.npz` of it."""
    folder = make_folder(tmp_path_factory.mktemp("made"))
    result = run_bertkit("featurize", "r.yaml", "--out", "features.npz", cwd=folder)
    assert result.returncode == 0, result.stderr
    assert re.search(r"\(featurizing \d+\.\d\d s, validating \d+\.\d\d s\)", result.stdout)
    return folder


def final_loss(run: Path) -> float:
    return json.loads((run / "metrics.json").read_text())["epochs"][-1]["loss"]


@pytest.fixture(scope="module")
def trained_loss(made):
    """The loss of training from the valid features file, in the folder that made it."""
    result = run_bertkit(
        "finetune", "r.yaml", "--features", "features.npz", "--output", "valid-run", cwd=made
    )
    assert result.returncode == 0, result.stderr
    return final_loss(made / "valid-run")


def contents(path: Path) -> tuple[dict, dict]:
    with np.load(path, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    return arrays, json.loads(bytes(arrays.pop("header")).decode())


def write(path: Path, arrays: dict, header: dict) -> Path:
    deep = "[" * 3000 + "]" * 3000  # json.dumps would not nest it: written as text
    text = json.dumps(header).replace('"__3000_deep__"', deep)
    header_bytes = np.frombuffer(text.encode(), np.uint8)
    np.savez(path, header=header_bytes, **arrays)
    return path


def refused(made: Path, name: str, message: str, *extra) -> str:
    """`finetune --features NAME` exits 2 with one line naming the file, before training."""
    result = run_bertkit(
        "finetune", "r.yaml", "--features", name, "--output", "refused-run", *extra, cwd=made
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"bertkit: error: {name}: "), result.stderr
    assert message in result.stderr, result.stderr
    assert "allow_pickle" not in result.stderr
    assert not (made / "refused-run").exists()  # no training started, nothing left behind
    return result.stderr


# ---- every damage: one line, exit 2, before training
def _cut_half(raw: bytes) -> bytes:
    return raw[: len(raw) // 2]


@pytest.mark.parametrize(
    "cut, message",
    [
        (_cut_half, "is cut short or damaged (not a whole zip archive); featurize again"),
        (lambda raw: raw[:-10], "is cut short or damaged"),
        (lambda raw: b"", "is empty (0 bytes): not a bertkit features file"),
        (lambda raw: pickle.dumps({"token_ids": [1, 2]}), "not a bertkit features file (that"),
        (lambda raw: np.random.default_rng(0).bytes(4000), "not a bertkit features file"),
        (lambda raw: Path("/etc/passwd").read_bytes(), "not a bertkit features file"),
    ],
    ids=["cut-in-the-middle", "tail-cut", "empty", "pickle", "random-bytes", "passwd"],
)
def test_a_file_that_is_not_a_whole_features_file_is_one_line(made, cut, message):
    (made / "bad.npz").write_bytes(cut((made / "features.npz").read_bytes()))
    refused(made, "bad.npz", message)


def test_a_folder_or_a_device_is_said_to_be_one(made):
    (made / "folder.npz").mkdir(exist_ok=True)
    refused(made, "folder.npz", "is a folder, not a features file")
    result = run_bertkit("finetune", "r.yaml", "--features", "/dev/null", cwd=made)
    assert result.returncode == 2
    assert result.stderr == (
        "bertkit: error: /dev/null: is not a regular file (a device or a pipe), not a "
        "features file\n"
    )


def _state(change):
    def damage(arrays, header):
        change(header["description"]["state"])

    return damage


def _array(name, change):
    def damage(arrays, header):
        arrays[name] = change(arrays[name])

    return damage


def _set(name, index, value):
    def change(array):
        array = array.copy()
        array[index] = value
        return array

    return _array(name, change)


def _deep_header(arrays, header):
    header["description"]["options"]["deep"] = "__3000_deep__"


def _longer_last_row(arrays, header):
    for column in ("token_ids", "segment_ids"):
        arrays[f"train/{column}/values"] = np.concatenate(
            [arrays[f"train/{column}/values"], np.full(40, 1, np.int32)]
        )
        arrays[f"train/{column}/offsets"][-1] += 40


def _empty_row(arrays, header):
    for column in ("token_ids", "segment_ids"):
        arrays[f"train/{column}/offsets"][3] = arrays[f"train/{column}/offsets"][2]


def _swapped_offsets(arrays, header):
    for column in ("token_ids", "segment_ids"):
        offsets = arrays[f"train/{column}/offsets"]
        offsets[[4, 5]] = offsets[[5, 4]]


def _numeric_text(arrays, header):
    header["validation_examples"]["items"][2]["text"] = 5


def _one_example_less(arrays, header):
    header["validation_examples"]["items"].pop()


def _one_example_more(arrays, header):
    header["validation_examples"]["items"].append({"text": "one more", "label": "positive"})


def _traversing_member(arrays, header):
    arrays["../../escaped"] = np.zeros(3, np.int32)


def _forged_vocabulary_size(arrays, header):
    header["vocabulary"]["size"] = 10**6  # so a token id past the real vocabulary passes
    arrays["train/token_ids/values"][3] = 5000


def _old_format(arrays, header):
    header["format"] = 1


DAMAGES = {
    "json-nested-3000-deep": (_deep_header, "header: JSON nested 3003 levels deep, past 64"),
    "labels-missing": (
        _state(lambda state: state.pop("labels")),
        "header: description.state.labels is missing; featurize again",
    ),
    "labels-an-integer": (
        _state(lambda state: state.update(labels=2)),
        "header: description.state.labels is 2; expected list",
    ),
    "a-single-label": (
        _state(lambda state: state.update(labels=["negative"])),
        "description.state.labels is ['negative']; expected 2 or more texts",
    ),
    "token-ids-as-strings": (
        _array("train/token_ids/values", lambda a: a.astype(str)),
        "train/token_ids/values holds text (<U",
    ),
    "token-id-past-the-vocabulary": (
        _set("train/token_ids/values", 30, 31022),
        "train/token_ids row 2 holds 31022, past the vocabulary's 144 ids; featurize again",
    ),
    "negative-token-id": (
        _set("train/token_ids/values", 5, -3),
        "train/token_ids row 0 holds -3, expected 0 or more; featurize again",
    ),
    "label-past-the-labels": (
        _set("train/labels", 7, 2),
        "train/labels row 7 holds 2, past the task state's 2 labels",
    ),
    "negative-label": (_set("train/labels", 0, -1), "train/labels row 0 holds -1, expected 0"),
    "offsets-end-before-start": (_swapped_offsets, "train/token_ids/offsets row 4 ends (at"),
    "a-row-of-0-pieces": (_empty_row, "train/token_ids/offsets row 2 has 0 pieces"),
    "a-row-past-the-sequence-length": (
        _longer_last_row,
        "train/token_ids/offsets row 15 has",
    ),
    "labels-shorter-than-rows": (
        _array("train/labels", lambda a: a[:-1]),
        "train/labels holds 15 rows; expected 16",
    ),
    "labels-2-d": (
        _array("train/labels", lambda a: a[:, None]),
        "train/labels has 2 dimensions (16, 1); expected 1",
    ),
    "a-text-that-is-a-number": (_numeric_text, "validation example 3: text is 5, not a text"),
    "fewer-examples-than-rows": (
        _one_example_less,
        "validation/example_index holds rows of 8 validation examples for 7 stored",
    ),
    "more-examples-than-rows": (
        _one_example_more,
        "validation/example_index holds rows of 8 validation examples for 9 stored",
    ),
    "example-index-out-of-order": (
        _set("validation/example_index", 3, 5),
        "validation/example_index row 3 holds 5; expected each stored validation example's",
    ),
    "a-member-named-out-of-the-archive": (
        _traversing_member,
        "holds an array its header does not name: '../../escaped'",
    ),
    "a-forged-vocabulary-size": (
        _forged_vocabulary_size,
        "was tokenized with another vocabulary than this recipe's backbone (1000000 word "
        "pieces; the backbone's 144)",
    ),
    "an-older-format": (
        _old_format,
        "made by an older bertkit (features format 1; this one reads 2); featurize again",
    ),
}


@pytest.mark.parametrize("damage", DAMAGES, ids=list(DAMAGES))
def test_a_damaged_features_file_is_refused_in_one_line(made, damage):
    change, message = DAMAGES[damage]
    arrays, header = contents(made / "features.npz")
    change(arrays, header)
    write(made / f"{damage}.npz", arrays, header)
    refused(made, f"{damage}.npz", message)


def test_the_first_bad_row_is_the_row_of_the_bad_value(made):
    arrays, header = contents(made / "features.npz")
    offsets = arrays["train/token_ids/offsets"]
    assert offsets[2] <= 30 < offsets[3]  # so value 30 is row 2's, as the message says


def test_the_valid_file_trains_to_the_loss_of_its_data(made, trained_loss):
    result = run_bertkit("finetune", "r.yaml", "--output", "data-run", cwd=made)
    assert result.returncode == 0, result.stderr
    assert final_loss(made / "data-run") == pytest.approx(trained_loss, rel=1e-5)


# ---- portability
def test_a_file_made_in_one_folder_trains_in_another(made, trained_loss, tmp_path):
    elsewhere = tmp_path / "elsewhere" / "deeper"
    elsewhere.mkdir(parents=True)
    for name in ("r.yaml", "features.npz"):
        shutil.copy(made / name, elsewhere / name)
    shutil.copytree(made / "ckpt", elsewhere / "ckpt")  # the data files stay behind
    result = run_bertkit("finetune", "r.yaml", "--features", "features.npz", cwd=elsewhere)
    assert result.returncode == 0, result.stderr
    assert "data.train (train.tsv) is not here: training on the features file's own rows" in (
        result.stdout
    )
    assert final_loss(elsewhere / "run") == pytest.approx(trained_loss, rel=1e-5)
    header = contents(made / "features.npz")[1]
    assert str(made) not in json.dumps(header)  # no path of the machine that made it
    assert header["data_files"]["train"]["path"] == "train.tsv"


def test_present_data_that_differs_is_refused_naming_the_file(made, tmp_path):
    other = make_folder(tmp_path / "other", data=False)
    shutil.copy(made / "features.npz", other / "features.npz")
    write_sentiment_tsv(other / "train.tsv", 16, seed=5)  # not the data it was made from
    shutil.copy(made / "dev.tsv", other / "dev.tsv")
    refused(
        other,
        "features.npz",
        f"was made from other data: data.train {other / 'train.tsv'} is not the file it was "
        "featurized from (its size or sha256 differs)",
    )


def test_another_checkpoint_vocabulary_is_refused(made, tmp_path):
    other = tmp_path / "vocab"
    shutil.copytree(made, other, ignore=shutil.ignore_patterns("*run*", "ckpt"))
    vocabulary = [*tiny_vocabulary(), "zebra"]
    write_tiny_checkpoint(other / "ckpt", num_layers=1, hidden_size=16, vocabulary=vocabulary)
    refused(other, "features.npz", "was tokenized with another vocabulary than this recipe's")


# ---- random single-field damage never gives a traceback
def _corrupt(rng, arrays: dict, header: dict, raw: bytes) -> bytes | None:
    """One random damage: a dtype, a shape, a value out of range, or a byte of the zip."""
    kind = rng.integers(4)
    if kind == 3:
        damaged = bytearray(raw)
        damaged[rng.integers(len(damaged))] ^= 1 << int(rng.integers(8))
        return bytes(damaged)
    name = sorted(arrays)[rng.integers(len(arrays))]
    array = arrays[name]
    if kind == 0:
        dtype = rng.choice(["float32", "int8", "uint64", "bool", "U3", ">i4", "complex64"])
        arrays[name] = array.astype(dtype)
    elif kind == 1:
        arrays[name] = [array[:-1], array[None], np.concatenate([array, array[:1]])][
            rng.integers(3)
        ]
    elif array.size:
        array = array.copy()
        value = [-(2**31), -2, 2**20, 2**31 - 1][rng.integers(4)]
        array.reshape(-1)[rng.integers(array.size)] = np.asarray(value).astype(array.dtype)
        arrays[name] = array
    return None


def test_random_single_damage_loads_or_is_one_user_error(made, tmp_path):
    rng = np.random.default_rng(55)
    raw = (made / "features.npz").read_bytes()
    outcomes = {"loaded": 0, "refused": 0}
    for case in range(40):
        arrays, header = contents(made / "features.npz")
        damaged = _corrupt(rng, arrays, header, raw)
        path = tmp_path / f"case{case}.npz"
        if damaged is None:
            write(path, arrays, header)
        else:
            path.write_bytes(damaged)
        try:
            read_feature_file(path, example_type=TextExample)
            outcomes["loaded"] += 1
        except UserError as error:
            assert str(error).startswith(f"{path}: ") and "\n" not in str(error)
            outcomes["refused"] += 1
    assert outcomes["refused"] > 20, outcomes


def test_a_damaged_member_is_named_and_not_unpickled(made, tmp_path):
    arrays, header = contents(made / "features.npz")
    arrays["train/labels"] = np.array([{"x": 1}] * 16, dtype=object)
    buffer = io.BytesIO()
    np.savez(buffer, header=np.frombuffer(json.dumps(header).encode(), np.uint8), **arrays)
    (tmp_path / "objects.npz").write_bytes(buffer.getvalue())
    with pytest.raises(UserError, match="train/labels holds Python objects; not a bertkit"):
        read_feature_file(tmp_path / "objects.npz")


# ---- featurize never destroys a file
def test_featurize_refuses_to_replace_a_file_that_is_not_its_features(made):
    notes = made / "notes.txt"
    notes.write_text("my notes\n")
    result = run_bertkit("featurize", "r.yaml", "--out", "notes.txt", cwd=made)
    assert result.returncode == 2
    assert result.stderr == (
        "bertkit: error: notes.txt: exists (not a features file); pass --overwrite to replace it\n"
    )
    assert notes.read_text() == "my notes\n"
    (made / "a-folder").mkdir(exist_ok=True)
    result = run_bertkit("featurize", "r.yaml", "--out", "a-folder", cwd=made)
    assert result.stderr == (
        "bertkit: error: a-folder: is a folder; name the features file to write (--out FILE)\n"
    )
    result = run_bertkit("featurize", "r.yaml", "--out", "notes.txt", "--overwrite", cwd=made)
    assert result.returncode == 0, result.stderr
    assert zipfile.is_zipfile(notes)


def test_featurize_replaces_its_own_features_file_atomically(made, monkeypatch):
    target = made / "again.npz"
    shutil.copy(made / "features.npz", target)
    result = run_bertkit("featurize", "r.yaml", "--out", "again.npz", cwd=made)  # the rerun
    assert result.returncode == 0, result.stderr
    before = target.read_bytes()

    def disk_full(handle, arrays):
        handle.write(b"PK\x03\x04 half a file")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(feature_file_archive, "save_arrays", disk_full)
    result = run_bertkit("featurize", "r.yaml", "--out", "again.npz", cwd=made)
    assert result.returncode == 2
    assert result.stderr == (
        "bertkit: error: again.npz: could not write the features file: No space left on "
        "device; the older file is left as it was\n"
    )
    assert target.read_bytes() == before
    assert not list(made.glob(".again.npz.*"))  # no temporary file left


# ---- the schema, written down once
def test_the_reference_page_describes_every_member_column_and_field():
    page = DOCS.read_text()
    for name in [m.pattern for m in MEMBERS] + list(COLUMNS) + list(HEADER_FIELDS):
        assert f"`{name}`" in page, name
    for state_field in STATE_FIELDS:
        assert f"`{state_field.name}`" in page, state_field.name


def test_the_ignored_label_is_the_tagging_tasks():
    from bertkit_tasks.tagging.preprocessor import IGNORED

    assert IGNORED_LABEL == IGNORED


# ---- every built-in task's file passes the checks and reads back as it was written
def _tagging_data(folder: Path) -> dict:
    sentences = ["john NN B-PER\nvisited NN O\nparis NN B-LOC", "acme NN B-ORG\nworks NN O"]
    for name in ("train.txt", "dev.txt"):
        (folder / name).write_text("\n\n".join(sentences * 4) + "\n")
    return {"train": "train.txt", "validation": "dev.txt"}


def _mlm_data(folder: Path) -> dict:
    document = "john visited paris .\nthe film was very good .\nit was quite funny ."
    (folder / "corpus.txt").write_text("\n\n".join([document] * 60) + "\n")
    return {"train": "corpus.txt"}


def _span_qa_data(folder: Path) -> dict:
    from tests.test_span_qa import qa_lines, write_lines

    write_lines(folder / "train.jsonl", qa_lines(12, seed=1))
    write_lines(folder / "dev.jsonl", qa_lines(6, seed=2))
    return {"train": "train.jsonl", "validation": "dev.jsonl"}


def _regression_data(folder: Path) -> dict:
    from tests.test_regression import write_scored_tsv

    write_scored_tsv(folder / "train.tsv", 12, seed=0)
    write_scored_tsv(folder / "dev.tsv", 6, seed=1)
    return {"train": "train.tsv", "validation": "dev.tsv", "text": "sentence", "label": "score"}


def _multi_label_data(folder: Path) -> dict:
    rows = ["text\tlabels", "a good film\tjoy,love", "a dull meal\tanger", "so so\tjoy"]
    for name in ("train.tsv", "dev.tsv"):
        (folder / name).write_text("\n".join(rows * 3) + "\n")
    return {"train": "train.tsv", "validation": "dev.tsv"}


def _multiple_choice_data(folder: Path) -> dict:
    from tests.test_multiple_choice import CSQA_KEYS, questions, write_questions

    write_questions(folder / "train.jsonl", questions(12))
    write_questions(folder / "dev.jsonl", questions(6, seed=1))
    return {"train": "train.jsonl", "validation": "dev.jsonl", **CSQA_KEYS}


def _long_document_data(folder: Path) -> dict:
    from tests.test_long_documents import write_documents

    write_documents(folder / "train.tsv", 12)
    write_documents(folder / "dev.tsv", 6, seed=1)
    return {"train": "train.tsv", "validation": "dev.tsv"}


@pytest.mark.parametrize(
    "task, data, options",
    [
        ("tagging", _tagging_data, {"class_weights": "balanced"}),
        ("mlm", _mlm_data, {}),
        ("span_qa", _span_qa_data, {"version": "2.0", "max_query_length": 8, "doc_stride": 8}),
        ("regression", _regression_data, {}),
        ("multi_label", _multi_label_data, {}),
        ("multiple_choice", _multiple_choice_data, {}),
        ("classification", _long_document_data, {"long_text": "windows", "window_stride": 4}),
    ],
)
def test_every_tasks_features_file_reads_back_as_written(tmp_path, task, data, options):
    from bertkit.recipes.recipe import load_recipe
    from bertkit.training.task_data import TaskData
    from bertkit.training.trainer import featurize

    write_tiny_checkpoint(tmp_path / "ckpt", num_layers=1, hidden_size=16, intermediate_size=32)
    files = data(tmp_path)
    spec = {
        "schema": 1,
        "task": {"name": task, **options},
        # windows: 14 pieces every 4 over texts of 17-21, 2-3 rows a validation example
        "backbone": {
            "preset": str(tmp_path / "ckpt"),
            "sequence_length": 16 if "long_text" in options else 32,
        },
        "data": {
            name: str(tmp_path / value) if name in ("train", "validation") else value
            for name, value in files.items()
        },
        "output_dir": str(tmp_path / "run"),
    }
    featurize(spec, tmp_path / "f.npz")
    stored = read_feature_file(tmp_path / "f.npz")
    made = TaskData.read(load_recipe(spec))
    pairs = [(stored.train, made.train_features)]
    if stored.validation is not None:  # kept where decoding needs only the rows (MLM)
        pairs.append((stored.validation, made.validation_features))
    if task in ("tagging", "mlm", "span_qa"):
        assert len(pairs) == (2 if task == "mlm" else 1)
    if "long_text" in options:  # kept, with several rows an example
        assert len(stored.validation) > len(set(stored.validation.example_index.tolist()))
    for got, written in pairs:
        for name, column in written.columns.items():
            rows = got.columns[name]
            assert len(rows) == len(column) and all(map(np.array_equal, rows, column)), name
        assert np.array_equal(got.example_index, written.example_index)
        assert got.pad_values == written.pad_values


def test_regression_and_multiple_choice_state_fields_are_checked():
    from bertkit.training.feature_file_checks import check_state

    with_labels = {"train": {"columns": {"token_ids": "sequence", "labels": "scalar"}}}
    assert check_state({"num_choices": 3}, with_labels, "f.npz") == 3  # answers below 3
    for state, message in [
        ({"num_choices": 1}, "description.state.num_choices is 1; expected 2 or more"),
        ({"num_choices": "3"}, "description.state.num_choices is '3'; expected 2 or more"),
        ({"target_mean": 0.0, "target_std": 0.0}, "description.state.target_std is 0.0"),
        ({"target_mean": float("nan"), "target_std": 1.0}, "target_mean is not a finite"),
    ]:
        with pytest.raises(UserError, match=re.escape(message)):
            check_state(state, {"train": {"columns": {"token_ids": "sequence"}}}, "f.npz")
