"""Features files and run directories come from elsewhere: they run no code, read no file
outside the run and write through no link (recipes are trusted; these are not)."""

import json
import subprocess
import sys

import numpy as np
import pytest
import yaml

from bertkit.errors import UserError
from bertkit.feature_file import read_feature_file
from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint
from bertkit.training import featurize
from bertkit_tasks.classification.task import TextExample
from bertkit_tasks.mlm.task import Document


@pytest.fixture(scope="module")
def featurized(tmp_path_factory):
    folder = tmp_path_factory.mktemp("features")
    write_tiny_checkpoint(folder / "ckpt")
    write_sentiment_tsv(folder / "train.tsv", 16, seed=0)
    write_sentiment_tsv(folder / "dev.tsv", 8, seed=1)
    (folder / "r.yaml").write_text(yaml.safe_dump({
        "schema": 1, "task": "classification",
        "backbone": {"preset": "./ckpt", "sequence_length": 32},
        "data": {"train": "train.tsv", "validation": "dev.tsv", "text": "sentence"},
        "training": {"epochs": 1, "batch_size": 8}, "output_dir": "run"}))
    featurize(folder / "r.yaml", folder / "features.npz")
    return folder


def _rewrite_header(source, target, change) -> None:
    with np.load(source, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    header = json.loads(bytes(arrays["header"]).decode())
    change(header)
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    with open(target, "wb") as handle:
        np.savez(handle, **arrays)


def test_stored_examples_come_back_as_the_tasks_type(featurized):
    stored = read_feature_file(featurized / "features.npz", example_type=TextExample)
    assert len(stored.validation_examples) == 8
    assert all(type(e) is TextExample for e in stored.validation_examples)
    assert read_feature_file(featurized / "features.npz").validation_examples is None


def test_a_features_file_naming_a_function_runs_nothing(featurized):
    def evil(header):
        header["validation_examples"] = {"type": "os:system",
                                         "items": [{"command": "touch PWNED"}]}

    _rewrite_header(featurized / "features.npz", featurized / "evil.npz", evil)
    result = subprocess.run([sys.executable, "-m", "bertkit.cli", "finetune", "r.yaml",
                             "--features", "evil.npz", "--set", "output_dir=evil-run"],
                            cwd=featurized, capture_output=True, text=True)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip() == ("bertkit: error: evil.npz: validation examples of type "
                                     "'os:system'; the recipe's task reads "
                                     "bertkit_tasks.classification.task:TextExample")
    assert not (featurized / "PWNED").exists()
    assert not (featurized / "evil-run").exists()


def test_another_tasks_example_type_is_refused(featurized):
    def other(header):
        header["validation_examples"]["type"] = "bertkit_tasks.mlm.task:Document"

    _rewrite_header(featurized / "features.npz", featurized / "other.npz", other)
    with pytest.raises(UserError, match="type 'bertkit_tasks.mlm.task:Document'; the recipe's"):
        read_feature_file(featurized / "other.npz", example_type=TextExample)
    with pytest.raises(UserError, match="validation example 1 is not a Document"):
        read_feature_file(featurized / "other.npz", example_type=Document)


@pytest.mark.parametrize("items, message", [
    ([{"text": "a", "__init__": "x"}], "validation example 1 is not a TextExample"),
    (["text"], "validation example 1 is not a TextExample"),
    ([{"text_pair": "b"}], "validation example 1: .*missing"),
])
def test_malformed_stored_examples_are_one_line(featurized, tmp_path, items, message):
    def change(header):
        header["validation_examples"]["items"] = items

    _rewrite_header(featurized / "features.npz", tmp_path / "bad.npz", change)
    with pytest.raises(UserError, match=message):
        read_feature_file(tmp_path / "bad.npz", example_type=TextExample)


def test_a_damaged_header_is_one_line(featurized, tmp_path):
    _rewrite_header(featurized / "features.npz", tmp_path / "bad.npz",
                    lambda header: header.pop("train"))
    with pytest.raises(UserError, match="bad.npz: damaged features file"):
        read_feature_file(tmp_path / "bad.npz")
