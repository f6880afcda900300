"""Features files and run directories come from elsewhere: they run no code, read no file
outside the run and write through no link (recipes are trusted; these are not)."""

import json
import subprocess
import sys

import numpy as np
import pytest
import yaml

from bertkit.errors import UserError
from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint
from bertkit.training.feature_file import read_feature_file
from bertkit.training.trainer import featurize
from bertkit_tasks.classification.task import TextExample
from bertkit_tasks.mlm.task import Document


@pytest.fixture(scope="module")
def featurized(tmp_path_factory):
    folder = tmp_path_factory.mktemp("features")
    write_tiny_checkpoint(folder / "ckpt")
    write_sentiment_tsv(folder / "train.tsv", 16, seed=0)
    write_sentiment_tsv(folder / "dev.tsv", 8, seed=1)
    (folder / "r.yaml").write_text(
        yaml.safe_dump(
            {
                "schema": 1,
                "task": "classification",
                "backbone": {"preset": "./ckpt", "sequence_length": 32},
                "data": {"train": "train.tsv", "validation": "dev.tsv", "text": "sentence"},
                "training": {"epochs": 1, "batch_size": 8},
                "export": {"saved_model": False},
                "output_dir": "run",
            }
        )
    )
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
        header["validation_examples"] = {"type": "os:system", "items": [{"command": "touch PWNED"}]}

    _rewrite_header(featurized / "features.npz", featurized / "evil.npz", evil)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertkit.cli",
            "finetune",
            "r.yaml",
            "--features",
            "evil.npz",
            "--set",
            "output_dir=evil-run",
        ],
        cwd=featurized,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip() == (
        "bertkit: error: evil.npz: validation examples of type "
        "'os:system'; the recipe's task reads "
        "bertkit_tasks.classification.task:TextExample"
    )
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


@pytest.mark.parametrize(
    "items, message",
    [
        ([{"text": "a", "__init__": "x"}], "validation example 1 is not a TextExample"),
        (["text"], "validation example 1 is not a TextExample"),
        ([{"text_pair": "b"}], "validation example 1: .*missing"),
    ],
)
def test_malformed_stored_examples_are_one_line(featurized, tmp_path, items, message):
    def change(header):
        header["validation_examples"]["items"] = items

    _rewrite_header(featurized / "features.npz", tmp_path / "bad.npz", change)
    with pytest.raises(UserError, match=message):
        read_feature_file(tmp_path / "bad.npz", example_type=TextExample)


def test_a_damaged_header_is_one_line(featurized, tmp_path):
    _rewrite_header(
        featurized / "features.npz", tmp_path / "bad.npz", lambda header: header.pop("train")
    )
    with pytest.raises(UserError, match="bad.npz: header: train is missing; featurize again"):
        read_feature_file(tmp_path / "bad.npz")


# ---- run directories from elsewhere


@pytest.fixture(scope="module")
def trained(featurized):
    """A finished tiny run (`run/`) next to its recipe and data."""
    import bertkit

    bertkit.finetune(featurized / "r.yaml", output_dir=featurized / "run", verbose=0)
    return featurized / "run"


@pytest.fixture
def foreign_run(trained, tmp_path):
    """A copy of the run whose `model/task.json` `edit` changes (so not written here)."""
    import shutil

    shutil.copytree(trained, tmp_path / "foreign", ignore=shutil.ignore_patterns(".lock"))

    def edit(**data):
        task_file = tmp_path / "foreign" / "model" / "task.json"
        description = json.loads(task_file.read_text())
        description["data"].update(data)
        task_file.write_text(json.dumps(description))
        return tmp_path / "foreign"

    return edit


def evaluate(*args):
    from bertkit import cli

    return cli.main(["evaluate", *map(str, args)])


def test_a_foreign_run_cannot_name_a_file_to_read(foreign_run, capsys):
    run = foreign_run(validation="/etc/passwd")
    assert evaluate(run) == 2
    out, err = capsys.readouterr()
    task_file = run / "model" / "task.json"
    assert err == (
        f"bertkit: error: {task_file}: data.validation: leads outside the run "
        "directory (to /etc/passwd); a run directory from elsewhere does not choose "
        "files to read; pass --data FILE\n"
    )
    assert "root:" not in out + err  # the first line of /etc/passwd was printed before
    assert not (run / "evaluation").exists()


def test_a_foreign_runs_relative_paths_resolve_against_the_run(
    foreign_run, trained, capsys, monkeypatch, tmp_path
):
    import shutil

    assert evaluate(foreign_run(validation="../../etc/passwd")) == 2
    assert "leads outside the run directory" in capsys.readouterr().err
    run = foreign_run(validation="data/dev.tsv")
    (run / "data").mkdir()
    shutil.copy(trained.parent / "dev.tsv", run / "data" / "dev.tsv")
    monkeypatch.chdir(tmp_path)  # not the run: relative names are the run's own
    assert evaluate(run) == 0
    assert capsys.readouterr().out.startswith("accuracy: ")


def test_a_run_written_here_reads_its_recipes_files(trained, capsys):
    assert evaluate(trained) == 0
    assert capsys.readouterr().out.startswith("accuracy: ")
    assert json.loads((trained / "evaluation" / "metrics.json").read_text())["data"] == (
        "validation"
    )


def test_evaluate_replaces_a_link_in_the_run_with_its_own_folder(trained, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns(".lock", "evaluation"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run / "evaluation").symlink_to(elsewhere)
    assert evaluate(run) == 0
    capsys.readouterr()
    assert list(elsewhere.iterdir()) == []
    assert not (run / "evaluation").is_symlink()
    assert (run / "evaluation" / "metrics.json").is_file()


def test_a_model_file_linking_out_of_the_run_is_refused(trained, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns(".lock"))
    (run / "model" / "vocab.txt").unlink()
    (run / "model" / "vocab.txt").symlink_to("/etc/passwd")
    assert evaluate(run) == 2
    assert capsys.readouterr().err == (
        f"bertkit: error: {run / 'model' / 'vocab.txt'}: leads outside the run directory (to "
        "/etc/passwd); a run directory from elsewhere does not choose files to read\n"
    )
