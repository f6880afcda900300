"""Hardening (issue 20): nothing lost, every bad input one line and exit status 2."""

import json
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import yaml

from bertkit.testing import run_bertkit, write_sentiment_tsv, write_tiny_checkpoint


def bertkit(*args, cwd=None, input=None):
    return run_bertkit(*args, cwd=cwd, input=input)


def one_line_error(result, message):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr, result.stderr


def write_recipe(tmp_path, name="r.yaml", **training):
    path = tmp_path / name
    path.write_text(
        yaml.safe_dump(
            {
                "schema": 1,
                "task": "classification",
                "backbone": {"preset": "ckpt", "sequence_length": 16},
                "data": {"train": "train.tsv", "validation": "dev.tsv", "text": "sentence"},
                "training": {"epochs": 1, "batch_size": 8, "learning_rate": 1e-3, **training},
                "output_dir": "run",
            }
        )
    )
    return path


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A folder with a finished tiny run (`run/`), its recipe, data and checkpoint."""
    tmp_path = tmp_path_factory.mktemp("hardening")
    write_tiny_checkpoint(tmp_path / "ckpt", num_layers=1, hidden_size=16, intermediate_size=32)
    write_sentiment_tsv(tmp_path / "train.tsv", 32, seed=0)
    write_sentiment_tsv(tmp_path / "dev.tsv", 8, seed=1)
    result = bertkit("finetune", str(write_recipe(tmp_path)), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return tmp_path


def snapshot(folder):
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


# ---- 1. --overwrite replaces a run only when the new one can start


def test_overwrite_with_a_missing_training_file_keeps_the_old_run(finished):
    before = snapshot(finished / "run")
    result = bertkit(
        "finetune",
        str(write_recipe(finished)),
        "--overwrite",
        "--set",
        "data.train=missing.tsv",
        cwd=finished,
    )
    one_line_error(result, "data.train: file not found")
    assert snapshot(finished / "run") == before


def test_overwrite_with_a_missing_preset_keeps_the_old_run(finished):
    before = snapshot(finished / "run")
    result = bertkit(
        "finetune",
        str(write_recipe(finished)),
        "--overwrite",
        "--set",
        f"backbone.preset={finished / 'nope'}",
        cwd=finished,
    )
    one_line_error(result, "backbone.preset: preset folder not found")
    assert snapshot(finished / "run") == before


def test_overwrite_failing_after_the_move_restores_the_old_run(finished):
    before = snapshot(finished / "run")
    (finished / "bad.tsv").write_text("wrong\theader\nx\ty\n")
    result = bertkit(
        "finetune",
        str(write_recipe(finished)),
        "--overwrite",
        "--set",
        "data.train=bad.tsv",
        cwd=finished,
    )
    one_line_error(result, "bad.tsv")
    assert snapshot(finished / "run") == before
    assert not (finished / ".run.replaced").exists()


def test_overwrite_refuses_a_foreign_folder_holding_a_run_json(finished):
    foreign = finished / "foreign"
    foreign.mkdir()
    (foreign / "run.json").write_text('{"name": "my other tool"}')
    (foreign / "notes.txt").write_text("precious")
    result = bertkit(
        "finetune",
        str(write_recipe(finished)),
        "--overwrite",
        "--output",
        str(foreign),
        cwd=finished,
    )
    one_line_error(result, "not a bertkit run directory")
    assert (foreign / "notes.txt").read_text() == "precious"


# ---- 2. a kill after training finishes the run without training again


def test_killed_during_export_the_rerun_trains_no_epoch_again(tmp_path, monkeypatch):
    import keras

    import bertkit
    from bertkit.training import run_steps

    write_tiny_checkpoint(tmp_path / "ckpt", num_layers=1, hidden_size=16, intermediate_size=32)
    write_sentiment_tsv(tmp_path / "train.tsv", 32, seed=0)
    write_sentiment_tsv(tmp_path / "dev.tsv", 8, seed=1)
    recipe = write_recipe(tmp_path, epochs=2)

    def killed(run, finetuned, export=None):
        raise SystemExit("killed during export")

    monkeypatch.setattr(run_steps, "export_run", killed)
    with pytest.raises(SystemExit):
        bertkit.finetune(recipe, verbose=0)
    metrics_file = tmp_path / "run" / "metrics.json"
    after_kill = json.loads(metrics_file.read_text())
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "running"
    monkeypatch.undo()

    def no_training(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(keras.Model, "fit", no_training)
    bertkit.finetune(recipe, verbose=0)
    rerun = json.loads(metrics_file.read_text())
    assert [e["epoch"] for e in rerun["epochs"]] == [1, 2]
    assert rerun == after_kill
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "finished"
    assert (tmp_path / "run" / "saved_model" / "saved_model.pb").exists()


# ---- 3. a diverging run stops with one line; no NaN in recipes or in predict's JSON


def test_a_diverging_run_stops_with_one_line_and_keeps_its_checkpoint(finished):
    result = bertkit(
        "finetune",
        str(
            write_recipe(finished, "diverge.yaml", epochs=3, learning_rate=1e6, max_grad_norm=None)
        ),
        "--output",
        "diverged",
        cwd=finished,
    )
    one_line_error(result, "training.learning_rate: training diverged: the loss is nan")
    assert "lower the learning rate (now 1e+06)" in result.stderr
    run = finished / "diverged"
    if run.exists():  # diverged after an epoch: that epoch's checkpoint is kept
        assert json.loads((run / "run.json").read_text())["status"] == "running"
        assert not (run / "saved_model").exists()


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "1e400"])
def test_recipe_numbers_must_be_finite(finished, value):
    result = bertkit(
        "check",
        str(write_recipe(finished)),
        "--set",
        f"training.learning_rate={value}",
        cwd=finished,
    )
    one_line_error(result, "training.learning_rate: expected a finite number")


def test_predict_prints_null_for_nan_scores(finished, tmp_path):
    import shutil

    import h5py
    import numpy as np

    run = tmp_path / "nan_run"
    shutil.copytree(finished / "run", run)
    with h5py.File(run / "model" / "model.weights.h5", "r+") as weights:

        def poison(name, item):
            if isinstance(item, h5py.Dataset) and item.dtype.kind == "f":
                item[...] = np.nan

        weights.visititems(poison)
    result = bertkit("predict", str(run), input="a good film\n")
    assert result.returncode == 0, result.stderr

    def refuse(constant):
        raise ValueError(f"invalid JSON constant {constant}")

    prediction = json.loads(result.stdout, parse_constant=refuse)
    assert prediction["score"] is None


# ---- 4. one finetune at a time per run directory


def test_a_second_finetune_on_a_locked_run_names_the_holder(finished):
    import os

    from bertkit.run_dir import RunDirectory

    before = snapshot(finished / "run")
    with RunDirectory(finished / "run").lock():
        result = bertkit("finetune", str(write_recipe(finished)), "--overwrite", cwd=finished)
    one_line_error(result, f"run: in use by bertkit finetune (pid {os.getpid()} on ")
    assert "started 20" in result.stderr
    assert snapshot(finished / "run") == before


# ---- 5. predict: one output per input line, every bad input named


def test_predict_gives_one_output_per_input_line(finished):
    lines = [
        "a good film",
        "",
        '{"text": "ok", "text_pair": 7}',
        '{"text": "\\ud800"}',
        "   ",
        "a dull film",
    ]
    result = bertkit("predict", str(finished / "run"), input="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr
    outputs = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(outputs) == len(lines)
    assert "label" in outputs[0] and "label" in outputs[5]
    assert outputs[1] == {"error": "input 2: empty input"}
    assert outputs[2] == {  # a single-text model
        "error": "input 3: this model reads single texts: expected a text or an object "
        "with 'sentence', got a pair {'text': 'ok', 'text_pair': 7}"
    }
    assert outputs[3] == {"error": "input 4: 'text' is not valid Unicode (a lone surrogate)"}
    assert outputs[4] == {"error": "input 5: empty input"}


def test_predict_refuses_input_that_is_not_utf8_text(finished, tmp_path):
    (tmp_path / "in.txt").write_bytes(b"good\nna\xefve caf\xe9\n")
    one_line_error(
        bertkit("predict", str(finished / "run"), "--input", "in.txt", cwd=tmp_path),
        "in.txt:2: not UTF-8 text (byte 7)",
    )


def test_predict_refuses_a_folder_as_input(finished, tmp_path):
    one_line_error(
        bertkit("predict", str(finished / "run"), "--input", str(tmp_path)),
        "is a directory, expected a file",
    )


def test_predict_refuses_binary_stdin(finished):
    result = bertkit("predict", str(finished / "run"), input=b"\xff\xfe\x00x")
    one_line_error(result, "<stdin>:1: not UTF-8 text (byte 0)")


def test_python_predict_takes_a_string_as_one_input(finished):
    import bertkit as api
    from bertkit.errors import UserError

    model = api.load(finished / "run")
    assert len(model.predict("hello world")) == 1
    assert model.predict("hello world") == model.predict(["hello world"])
    with pytest.raises(UserError, match="input 2: empty input"):
        model.predict(["fine", None])
    assert model.predict(["fine", None], errors="report")[1] == {"error": "input 2: empty input"}


# ---- 6. the SavedModel refuses bad shapes and answers an empty batch (classification;
# the other tasks' tests call the same helper)


def test_saved_model_refuses_bad_shapes_and_answers_an_empty_batch(finished):
    from bertkit.testing import assert_serving_refuses_bad_shapes

    assert_serving_refuses_bad_shapes(finished / "run" / "saved_model", ["text"])


def test_export_verification_catches_a_saved_model_that_answers_differently(finished):
    import tensorflow as tf

    import bertkit
    from bertkit.serving.export import answers, checked_serve, verify_saved_model

    saved = finished / "run" / "saved_model"  # finetune exported and verified it
    other = bertkit.load(finished / "run")
    rng = np.random.default_rng(0)
    for weight in other.model.trainable_weights[-2:]:  # the head: other answers
        weight.assign(weight + rng.normal(size=weight.shape).astype("float32"))
    serve = tf.function(checked_serve(other.task, other.model, ["text"]))
    signature = serve.get_concrete_function(tf.TensorSpec(None, tf.string, name="text"))
    with pytest.raises(RuntimeError, match="answers differently"):
        verify_saved_model(saved, answers(signature, ["text"]))


# ---- 7. YAML bombs and bad --set values

BILLION_LAUGHS = """\
schema: 1
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def test_a_yaml_alias_bomb_is_refused_at_once_in_bounded_memory(tmp_path):
    import resource
    import time

    from bertkit.errors import UserError
    from bertkit.recipes.recipe import load_recipe

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BILLION_LAUGHS)
    started = time.perf_counter()
    with pytest.raises(UserError, match="bomb.yaml:2: invalid YAML: anchors and aliases"):
        load_recipe(bomb)
    assert time.perf_counter() - started < 1.0

    def two_gigabytes():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    result = subprocess.run(
        [sys.executable, "-m", "bertkit.cli", "check", str(bomb)],
        capture_output=True,
        text=True,
        preexec_fn=two_gigabytes,
        timeout=60,
    )
    one_line_error(result, "anchors and aliases (&name, *name) are not allowed in recipes")


def test_a_recipe_over_a_megabyte_is_refused(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("schema: 1\n" + "# padding\n" * 110_000)
    one_line_error(
        bertkit("check", str(big)), "big.yaml: is 1,100,010 bytes; a recipe is at most 1,000,000"
    )


@pytest.mark.parametrize(
    "value, message",
    [
        ("[1", "--set: training.epochs: invalid YAML: expected ',' or ']'"),
        ("*a", "--set: training.epochs: invalid YAML: anchors and aliases"),
        (
            '!!python/object/apply:os.system ["true"]',
            "--set: training.epochs: unsupported YAML tag 'tag:yaml.org,2002:python/object/apply",
        ),
    ],
)
def test_set_values_that_are_not_plain_yaml(tmp_path, value, message):
    result = bertkit(
        "check", str(write_recipe(tmp_path)), "--set", f"training.epochs={value}", cwd=tmp_path
    )
    one_line_error(result, message)


# ---- 9. run files follow the user's umask


def test_run_files_follow_the_umask(finished, tmp_path):
    import os
    import stat

    from bertkit.run_dir import write_json

    mask = os.umask(0o027)
    try:
        write_json(tmp_path / "x.json", {"a": 1})
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "x.json").stat().st_mode) == 0o640
    for name in ("run.json", "metrics.json", "model/task.json"):
        assert stat.S_IMODE((finished / "run" / name).stat().st_mode) == 0o666 & ~mask, name


# ---- 11. --version


def test_version():
    import bertkit as api

    result = bertkit("--version")
    assert result.returncode == 0 and result.stdout == f"bertkit {api.__version__}\n"


# ---- 10. check answers "will this run start?"; absurd values and one-class data refused


def test_check_reports_a_missing_data_file_without_tensorflow(finished):
    result = bertkit(
        "check", str(write_recipe(finished)), "--set", "data.validation=nope.tsv", cwd=finished
    )
    one_line_error(result, "data.validation: file not found: ")


def test_check_reports_a_missing_preset_folder(finished):
    result = bertkit(
        "check",
        str(write_recipe(finished)),
        "--set",
        f"backbone.preset={finished / 'gone'}",
        cwd=finished,
    )
    one_line_error(result, f"backbone.preset: preset folder not found: {finished / 'gone'}")


def test_check_passes_a_recipe_whose_files_exist(finished):
    result = bertkit("check", str(write_recipe(finished)), cwd=finished)
    assert result.returncode == 0 and "name: classification" in result.stdout


@pytest.mark.parametrize(
    "value, message",
    [
        ("100000000000000000000", "training.epochs: must be at most 10000"),
        ("1e20", "training.epochs: expected an integer, got 1e+20"),
    ],
)
def test_absurd_epochs_are_refused(finished, value, message):
    result = bertkit(
        "check", str(write_recipe(finished)), "--set", f"training.epochs={value}", cwd=finished
    )
    one_line_error(result, message)


def test_a_single_class_training_set_is_refused(finished, tmp_path):
    (tmp_path / "one.tsv").write_text("sentence\tlabel\n" + "a good film\tpositive\n" * 8)
    result = bertkit(
        "finetune",
        str(write_recipe(finished)),
        "--set",
        f"data.train={tmp_path / 'one.tsv'}",
        "--set",
        "data.validation=null",
        "--output",
        str(tmp_path / "one_run"),
        cwd=finished,
    )
    one_line_error(result, "one.tsv: the training data has only one label (positive)")
    assert not (tmp_path / "one_run").exists()


# ---- 8. files in the way, files that cannot be written, corrupt files


def test_finetune_output_that_is_a_file(finished, tmp_path):
    (tmp_path / "afile").write_text("mine")
    result = bertkit(
        "finetune", str(write_recipe(finished)), "--output", str(tmp_path / "afile"), cwd=finished
    )
    one_line_error(result, "afile: output path exists and is not a folder")
    assert (tmp_path / "afile").read_text() == "mine"


def test_export_out_that_is_a_file(finished, tmp_path):
    (tmp_path / "afile").write_text("mine")
    result = bertkit("export", str(finished / "run"), "--out", str(tmp_path / "afile"))
    one_line_error(result, "afile: export path exists and is not a folder; choose another")
    assert (tmp_path / "afile").read_text() == "mine"


def test_finetune_output_in_a_folder_the_user_cannot_write(finished, tmp_path):
    import os

    if os.geteuid() == 0:
        pytest.skip("root writes to any folder")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    result = bertkit(
        "finetune", str(write_recipe(finished)), "--output", str(locked / "run"), cwd=finished
    )
    one_line_error(result, "run: Permission denied")


def test_evaluate_on_a_read_only_run_prints_then_warns(finished, monkeypatch, capsys):
    from bertkit import cli, run_dir

    def read_only(path, value):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(run_dir, "write_json", read_only)
    assert cli.main(["evaluate", str(finished / "run")]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("accuracy: ")
    assert err == (
        f"bertkit: warning: results not saved in {finished / 'run' / 'evaluation'}: "
        "Permission denied\n"
    )


@pytest.mark.parametrize(
    "damage, message",
    [
        ("config", "backbone.preset: cannot read '"),
        ("safetensors", "backbone.preset: cannot read the weights in '"),
        (
            "shapes",
            "config.json does not match the weights: embeddings.word_embeddings.weight has "
            "shape (144, 16); config.json's vocab_size and hidden_size make it (144, 32)",
        ),
    ],
)
def test_a_corrupt_preset_is_one_line_and_leaves_no_run(finished, tmp_path, damage, message):
    import shutil

    preset = tmp_path / "preset"
    shutil.copytree(finished / "ckpt", preset)
    if damage == "config":
        (preset / "config.json").write_text('{"model_type": "bert", "hidden_size": ')
    elif damage == "shapes":
        config = json.loads((preset / "config.json").read_text())
        (preset / "config.json").write_text(json.dumps({**config, "hidden_size": 32}))
    else:
        weights = preset / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])
    result = bertkit(
        "finetune",
        str(write_recipe(finished)),
        "--set",
        f"backbone.preset={preset}",
        "--output",
        str(tmp_path / "new"),
        cwd=finished,
    )
    one_line_error(result, message)
    assert not (tmp_path / "new").exists()


def test_a_truncated_run_weights_file_is_one_line(finished, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished / "run", run)
    weights = run / "model" / "model.weights.h5"
    weights.write_bytes(weights.read_bytes()[:5000])
    one_line_error(
        bertkit("predict", str(run), input="a good film\n"),
        "model.weights.h5: cannot read the model weights (truncated or corrupt file?)",
    )


def test_a_folder_that_cannot_be_made_is_one_line_even_for_root(
    finished, tmp_path, monkeypatch, capsys
):
    from pathlib import Path

    from bertkit import cli

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", denied)
    monkeypatch.chdir(finished)
    status = cli.main(["finetune", str(write_recipe(finished)), "--output", str(tmp_path / "new")])
    assert status == 2
    assert capsys.readouterr().err == f"bertkit: error: {tmp_path / 'new'}: Permission denied\n"


def test_a_full_disk_is_one_line_and_leaves_the_finished_run(
    finished, tmp_path, monkeypatch, capsys
):
    import errno

    from bertkit import cli, run_dir

    run = finished / "run"
    before = {path: path.read_bytes() for path in run.rglob("*.json")}

    def full(path, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(run_dir, "write_json", full)
    monkeypatch.chdir(finished)
    status = cli.main(["finetune", str(write_recipe(finished)), "--output", str(tmp_path / "new")])
    assert status == 2
    error = capsys.readouterr().err
    assert error.startswith(f"bertkit: error: {tmp_path / 'new'}")
    assert error.endswith(": No space left on device\n") and error.count("\n") == 1
    assert {path: path.read_bytes() for path in run.rglob("*.json")} == before
    assert not (tmp_path / "new").exists()  # run.json could not be written: no half-made run


@pytest.mark.parametrize("where", ["new folders", "empty folder", "overwrite", "resumable"])
def test_an_oserror_before_training_removes_only_what_the_run_made(
    finished, tmp_path, monkeypatch, capsys, where
):
    """Issue 28: only a user error undid a run that stopped before training; a full disk or
    a permission error (here while the data is prepared) left a half-made run directory."""
    import dataclasses
    import errno
    import shutil

    from bertkit import cli
    from bertkit.recipes.recipe import load_recipe
    from bertkit.training import run_steps

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", "somewhere")

    run, flags = tmp_path / "a" / "b" / "run", []
    if where == "empty folder":
        run.mkdir(parents=True)
    elif where == "overwrite":
        shutil.copytree(finished / "run", run)
        flags = ["--overwrite"]
    elif where == "resumable":  # stopped after epoch 1: its checkpoint is the one to resume
        shutil.copytree(finished / "run", run)
        (run / "run.json").write_text('{"status": "running"}')
        recipe = load_recipe(write_recipe(finished))
        (run / "recipe.yaml").write_text(
            dataclasses.replace(recipe, output_dir=str(run.resolve())).to_yaml()
        )  # the same recipe: it resumes
        (run / "checkpoint").mkdir()
        (run / "checkpoint" / "training_metadata.json").write_text('{"epoch": 1}')
    before, folders = snapshot(tmp_path), sorted(p for p in tmp_path.rglob("*") if p.is_dir())
    monkeypatch.setattr(run_steps, "prepare", denied)
    monkeypatch.chdir(finished)
    assert cli.main(["finetune", str(write_recipe(finished)), "--output", str(run), *flags]) == 2
    assert capsys.readouterr().err.endswith("bertkit: error: somewhere: Permission denied\n")
    assert snapshot(tmp_path) == before  # the files that were there, and no others
    assert sorted(p for p in tmp_path.rglob("*") if p.is_dir()) == folders


# ---- issue 28: one line where a traceback was


def test_a_seed_numpy_cannot_take_is_one_line_and_makes_no_run(tmp_path):
    result = bertkit(
        "finetune", str(write_recipe(tmp_path)), "--set", "training.seed=4294967296", cwd=tmp_path
    )
    one_line_error(result, "--set: training.seed: must be at most 4294967295, got 4294967296")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "task, setting, message",
    [
        ("classification", "search.seed=-1", "search.seed: must be at least 0, got -1"),
        (
            "classification",
            "search.seed=4294967296",
            "search.seed: must be at most 4294967295, got 4294967296",
        ),
        ("mlm", "task.seed=-1", "task.seed: must be at least 0, got -1"),
        ("mlm", "task.seed=4294967296", "task.seed: must be at most 4294967295, got 4294967296"),
    ],
)
def test_every_seed_is_bounded_as_training_seed_is(tmp_path, capsys, task, setting, message):
    from bertkit import cli

    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "schema": 1,
                "task": task,
                "backbone": {"preset": "ckpt"},
                "data": {"train": "a.txt"},
                "search": {"training.learning_rate": {"low": 1e-5, "high": 1e-4}},
            }
        )
    )
    assert cli.main(["check", str(recipe), "--set", setting]) == 2
    assert capsys.readouterr().err == f"bertkit: error: --set: {message}\n"


def test_a_5000_digit_number_is_one_line(tmp_path):
    result = bertkit(
        "check", str(write_recipe(tmp_path)), "--set", "training.epochs=" + "9" * 5000, cwd=tmp_path
    )
    one_line_error(result, "--set: training.epochs: a number of 5000 digits is too long to read")


# ---- issue 28: predict, the prediction side (pairs, pipes, NUL bytes, big cells, long inputs)


@pytest.fixture(scope="module")
def pair_run(finished):
    """A tiny text-pair run (premise, hypothesis -> label), RTE's shape, beside `finished`."""
    import bertkit as api

    words = ["good", "bad", "fine", "dull"] * 4
    rows = [
        f"the film was {w}\tit is {w if i % 2 else 'grim'}\t{'yes' if i % 2 else 'no'}"
        for i, w in enumerate(words)
    ]
    (finished / "pairs.tsv").write_text("premise\thypothesis\tlabel\n" + "\n".join(rows) + "\n")
    recipe = yaml.safe_load(write_recipe(finished, "pairs.yaml").read_text())
    recipe["backbone"]["preset"] = str(finished / "ckpt")
    recipe["data"] = {
        "train": str(finished / "pairs.tsv"),
        "validation": str(finished / "pairs.tsv"),
        "text": "premise",
        "text_pair": "hypothesis",
    }
    del recipe["output_dir"]
    api.finetune(recipe, output_dir=finished / "pair_run", verbose=0)
    return finished / "pair_run"


def outputs_of(result):
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


PAIR_ERROR = (
    "this model reads text pairs: expected a [text, text_pair] pair or an object "
    "with 'premise' and 'hypothesis', got 'a single text'"
)


def test_a_pair_model_gives_an_error_object_for_a_plain_text_line(pair_run):
    outputs = outputs_of(bertkit("predict", str(pair_run), input='a single text\n["p", "h"]\n'))
    assert outputs[0] == {"error": f"input 1: {PAIR_ERROR}"}
    assert len(outputs) == 2 and "label" in outputs[1]


def test_python_predict_reports_a_plain_text_given_to_a_pair_model(pair_run):
    import bertkit as api
    from bertkit.errors import UserError

    model = api.load(pair_run)
    outputs = model.predict(["a single text", ["p", "h"]], errors="report")
    assert outputs[0] == {"error": f"input 1: {PAIR_ERROR}"}
    assert outputs[1] == model.predict([["p", "h"]])[0]
    with pytest.raises(UserError, match=r"^input 1: this model reads text pairs"):
        model.predict(["a single text"])


def test_predict_column_without_pair_column_on_a_pair_model(pair_run):
    result = bertkit(
        "predict",
        str(pair_run),
        "--input",
        str(pair_run.parent / "pairs.tsv"),
        "--column",
        "premise",
    )
    one_line_error(
        result,
        "this model takes text pairs: --column needs --pair-column (the column of the second text)",
    )
    assert result.stdout == ""
    result = bertkit(
        "predict",
        str(pair_run),
        "--input",
        str(pair_run.parent / "pairs.tsv"),
        "--column",
        "premise",
        "--pair-column",
        "hypothesis",
    )
    assert len(outputs_of(result)) == 16
    rows = [{"a": "good film", "b": "fine"}, {"a": "", "b": "x"}, {"a": "dull", "b": "bad"}]
    (pair_run.parent / "pairs.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    result = bertkit(
        "predict",
        str(pair_run),
        "--column",
        "a",
        "--pair-column",
        "b",
        "--format",
        "jsonl",
        input=(pair_run.parent / "pairs.jsonl").read_text(),
    )
    outputs = outputs_of(result)
    assert len(outputs) == 3 and outputs[1] == {"error": "input 2: empty input"}
    assert "label" in outputs[0] and "label" in outputs[2]


def start_predict(run):
    return subprocess.Popen(
        [sys.executable, "-m", "bertkit.cli", "predict", str(run)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def line_within(stream, seconds):
    import select

    ready, _, _ = select.select([stream], [], [], seconds)
    assert ready, f"no output line within {seconds} s"
    return stream.readline()


def test_predict_answers_each_line_as_it_arrives_and_exits_quietly_into_a_closed_pipe(finished):
    # `tail -f log | bertkit predict RUN | head -2`: stdin stays open, each line is
    # answered as it comes; then the reader leaves. (One process: each start loads TensorFlow.)
    process = start_predict(finished / "run")
    for text in ("a good film", "a dull film"):
        process.stdin.write(text + "\n")
        process.stdin.flush()
        assert "label" in json.loads(line_within(process.stdout, 120))
    process.stdout.close()
    process.stdin.write("a fine film\n")
    process.stdin.close()
    assert process.wait(60) == 141
    assert process.stderr.read() == ""


def test_a_nul_byte_gives_one_error_object_for_its_line(finished, tmp_path):
    (tmp_path / "in.txt").write_bytes(b"good\n\x00\x01\x02binary\nfine\n")
    for args in (["--input", "in.txt"], []):
        outputs = outputs_of(
            bertkit(
                "predict",
                str(finished / "run"),
                *args,
                cwd=tmp_path,
                input=None if args else "good\n\x00\x01\x02binary\nfine\n",
            )
        )
        assert outputs[1] == {"error": "input 2: a NUL byte (binary data?); expected text"}
        assert len(outputs) == 3 and "label" in outputs[0] and "label" in outputs[2]


@pytest.mark.parametrize("name, separator", [("big.tsv", "\t"), ("big.csv", ",")])
def test_predict_column_with_a_cell_over_128_kib_is_one_line(finished, tmp_path, name, separator):
    rows = ["sentence", "a good film", "a" * 200_000]
    (tmp_path / name).write_text("\n".join(f"{row}{separator}1" for row in rows) + "\n")
    result = bertkit(
        "predict", str(finished / "run"), "--input", name, "--column", "sentence", cwd=tmp_path
    )
    one_line_error(
        result,
        f"{name}:3: sentence: a cell of 200,000 characters, over the limit of 131,072 (128 KiB)",
    )


def test_predict_bounds_the_characters_of_one_input(finished, tmp_path):
    # The tagging SavedModel spent 115 s of CPU on one 600,000-character request.
    (tmp_path / "in.txt").write_text("a good film\n" + "word " * 120_000 + "\n")
    outputs = outputs_of(
        bertkit("predict", str(finished / "run"), "--input", "in.txt", cwd=tmp_path)
    )
    message = "input 2: longer than 100,000 characters (600,000), the limit per input"
    assert outputs[1] == {"error": message} and "label" in outputs[0]
    outputs = outputs_of(
        bertkit(
            "predict",
            str(finished / "run"),
            "--max-input-characters",
            "5",
            input="a good film\nfine\n",
        )
    )
    assert (
        outputs
        == [{"error": "input 1: longer than 5 characters (11), the limit per input"}, outputs[1]]
        and "label" in outputs[1]
    )


def test_python_predict_bounds_the_characters_of_one_input(finished):
    import bertkit as api
    from bertkit.errors import UserError
    from bertkit.files import MAX_INPUT_CHARACTERS

    model = api.load(finished / "run")
    assert MAX_INPUT_CHARACTERS == 100_000
    outputs = model.predict(["fine", "word " * 120_000], errors="report")
    assert outputs[1] == {
        "error": "input 2: longer than 100,000 characters (600,000), the limit per input"
    }
    with pytest.raises(UserError, match=r"^input 1: longer than 8 characters \(10\)"):
        model.predict([["a good", "film"]], max_input_characters=8)


def test_the_saved_model_refuses_a_request_over_its_limits_at_once(finished, tmp_path, capsys):
    """Issue 28: the tagging SavedModel spent 115 s of CPU on one 600,000-character request.
    The signature checks the characters of each input and of the request before it
    tokenizes; `bertkit export` sets both limits and records them in assets/bertkit.json."""
    import time

    import tensorflow as tf
    import tensorflow_text  # noqa: F401 (registers the tokenizer ops)

    from bertkit import cli

    def refused_at_once(serve, texts, message):
        started = time.perf_counter()
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            serve(text=tf.constant(texts))
        return time.perf_counter() - started

    serve = tf.saved_model.load(str(finished / "run" / "saved_model")).signatures["serving_default"]
    assert serve(text=tf.constant(["a good film"]))["label"].shape == (1,)
    seconds = refused_at_once(
        serve,
        ["a good film", "word " * 120_000],
        re.escape(
            "an input (the texts of one row together) is longer than 100,000 characters, the "
            "limit per input of this SavedModel (bertkit export --max-input-characters)"
        ),
    )
    print(f"a 600,000-character request refused in {seconds * 1000:.0f} ms")
    assert seconds < 1
    assert (
        refused_at_once(
            serve,
            ["word " * 19_000] * 11,
            re.escape(
                "the request is longer than 1,000,000 characters (all its texts together), the limit "
                "per request of this SavedModel (bertkit export --max-request-characters)"
            ),
        )
        < 1
    )

    out = tmp_path / "bounded"
    assert (
        cli.main(
            [
                "export",
                str(finished / "run"),
                "--out",
                str(out),
                "--max-input-characters",
                "50",
                "--max-request-characters",
                "80",
            ]
        )
        == 0
    )
    assert json.loads((out / "assets" / "bertkit.json").read_text())["input_limits"] == {
        "max_input_characters": 50,
        "max_request_characters": 80,
    }
    bounded = tf.saved_model.load(str(out)).signatures["serving_default"]
    assert bounded(text=tf.constant(["é" * 50, "a good film"]))["label"].shape == (2,)
    refused_at_once(bounded, ["a good film", "x" * 51], "longer than 50 characters")
    refused_at_once(bounded, ["x" * 45, "y" * 45], "request is longer than 80 characters")
    assert capsys.readouterr().out.endswith(f"exported {out}\n")


def test_export_into_a_full_disk_is_one_line_and_leaves_nothing(
    finished, tmp_path, monkeypatch, capsys
):
    import tensorflow as tf

    from bertkit import cli

    real_save = tf.saved_model.save

    def full(module, path, **kwargs):  # TensorFlow's own error for a full disk
        real_save(module, path, **kwargs)
        raise tf.errors.ResourceExhaustedError(
            None, None, f"{path}/saved_model.pb.tmp0; No space left on device"
        )

    monkeypatch.setattr(tf.saved_model, "save", full)
    out = tmp_path / "exports" / "model"
    assert cli.main(["export", str(finished / "run"), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"bertkit: error: {out}: cannot write the SavedModel: No space left on device\n"
    )
    assert list((tmp_path / "exports").iterdir()) == []


def test_export_into_a_read_only_folder_is_one_line(finished, tmp_path, monkeypatch, capsys):
    import errno
    from pathlib import Path

    from bertkit import cli

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)
    out = tmp_path / "model"
    assert cli.main(["export", str(finished / "run"), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"bertkit: error: {out}: cannot write the SavedModel: Read-only file system\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_export_into_a_folder_the_user_cannot_write(finished, tmp_path):
    import os

    if os.geteuid() == 0:
        pytest.skip("root writes to any folder")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    result = bertkit("export", str(finished / "run"), "--out", str(locked / "model"))
    one_line_error(result, f"{locked / 'model'}: cannot write the SavedModel: Permission denied")
    assert list(locked.iterdir()) == []


def test_export_of_a_run_with_nan_weights_names_the_weights_file(finished, tmp_path):
    import shutil

    import h5py

    run = tmp_path / "nan_run"
    shutil.copytree(finished / "run", run)
    with h5py.File(run / "model" / "model.weights.h5", "r+") as weights:
        weights.visititems(
            lambda name, item: (
                item.__setitem__(Ellipsis, np.nan)
                if isinstance(item, h5py.Dataset) and item.dtype.kind == "f"
                else None
            )
        )
    result = bertkit("export", str(run), "--out", str(tmp_path / "model"))
    one_line_error(
        result,
        f"{run / 'model' / 'model.weights.h5'}: the run's weights are not "
        "finite (NaN or infinity in '",
    )
    assert not (tmp_path / "model").exists()


def _hdf5_disk_full(model, path, **kwargs):  # h5py's error: no errno, HDF5's text
    raise OSError(
        "Unable to synchronously create dataset (file write failed: time = ..., "
        f"filename = '{path}', file descriptor = 5, errno = 28, error message = 'No "
        "space left on device', buf = 0x55, total write size = 8192)"
    )


def _disk_full(model, path, **kwargs):
    import errno

    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize(
    "writer, message",
    [
        (_disk_full, "cannot save the weights: No space left on device"),
        (_hdf5_disk_full, "cannot save the weights: No space left on device"),
        ("statvfs", "not enough free space to save the weights (about 1.1 MB needed, 0.0 MB free)"),
    ],
    ids=["errno", "hdf5 text", "checked before"],
)
def test_a_disk_full_for_the_weights_is_one_line_and_leaves_no_partial_file(
    finished, tmp_path, monkeypatch, capsys, writer, message
):
    import keras

    from bertkit import cli
    from bertkit.training import weights

    def partly(model, path, **kwargs):  # half the file written, then the disk is full
        Path(path).write_bytes(b"\x89HDF" * 1000)
        writer(model, path, **kwargs)

    if writer == "statvfs":
        monkeypatch.setattr(
            weights.os, "statvfs", lambda path: types.SimpleNamespace(f_bavail=10, f_frsize=4096)
        )
    else:
        monkeypatch.setattr(keras.saving, "save_weights", partly)
    monkeypatch.chdir(finished)
    run = tmp_path / "new"
    assert cli.main(["finetune", str(write_recipe(finished)), "--output", str(run)]) == 2
    error = capsys.readouterr().err  # the progress lines, then one line
    assert error.endswith(f"bertkit: error: {run / 'model' / 'model.weights.h5'}: {message}\n")
    assert "Traceback" not in error and "Exception ignored" not in error
    assert not run.exists()  # nothing trained yet: no half-made run, no partial file


def test_a_json_file_the_disk_has_no_room_for_names_itself_and_leaves_no_temporary(
    tmp_path, monkeypatch
):
    import errno

    from bertkit import run_dir

    def full(value, file, **kwargs):
        file.write('{"half": ')
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_dir.json, "dump", full)
    with pytest.raises(OSError) as caught:
        run_dir.write_json(tmp_path / "metrics.json", {"a": 1})
    assert (caught.value.errno, caught.value.filename) == (
        errno.ENOSPC,
        str(tmp_path / "metrics.json"),
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]], ids=["plain", "overwrite"])
def test_a_damaged_run_json_is_named_with_its_line(finished, tmp_path, overwrite):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished / "run", run)
    (run / "run.json").write_text('{\n  "status": "finished",\n  "best_epoch": \n}\n')
    before = snapshot(run)
    result = bertkit(
        "finetune", str(write_recipe(finished)), *overwrite, "--output", str(run), cwd=finished
    )
    one_line_error(result, f"{run / 'run.json'}:4: corrupt run status file: Expecting value")
    assert snapshot(run) == before


def test_after_a_kill_during_overwrite_errors_say_where_the_old_run_is(
    finished, tmp_path, monkeypatch
):
    import os
    import shutil

    from bertkit import run_dir
    from bertkit.errors import UserError

    run = run_dir.RunDirectory(tmp_path / "run")
    shutil.copytree(finished / "run", run.path)
    old = snapshot(run.path)
    moved, replace = [], os.replace

    def killed_after_two(source, target):  # a kill -9 in the middle of the move aside
        if len(moved) == 2:
            raise KeyboardInterrupt
        moved.append(Path(source).name)
        replace(source, target)

    monkeypatch.setattr(run_dir.os, "replace", killed_after_two)
    with pytest.raises(KeyboardInterrupt):
        run.prepare("new recipe", overwrite=True)
    monkeypatch.undo()
    assert moved[0] == "run.json"  # first: what is left is not taken for the new run
    hint = (
        f"the run it replaces is kept in {tmp_path / '.run.replaced'} (an overwrite was "
        "interrupted: run it again to finish it, or move that folder's files back)"
    )
    with pytest.raises(UserError, match=re.escape(hint)), run.lock():  # what finetune does
        pass
    with pytest.raises(UserError, match=re.escape(hint)):
        run.prepare("new recipe", overwrite=True)
    run.restore_replaced()
    assert snapshot(run.path) == old and not run.replaced_dir.exists()


def test_a_kill_while_the_replacement_trains_or_the_old_run_is_deleted(tmp_path):
    from bertkit.errors import UserError
    from bertkit.run_dir import RunDirectory

    run = RunDirectory(tmp_path / "run")
    run.path.mkdir()
    run.recipe_file.write_text("new recipe")
    run.set_status("running")  # the replacement, killed while it trained
    run.replaced_dir.mkdir()
    (run.replaced_dir / "run.json").write_text('{"status": "finished"}')
    with pytest.raises(
        UserError,
        match="of a different recipe; .* the run it replaces is kept "
        f"in {re.escape(str(run.replaced_dir))}",
    ):
        run.prepare("third recipe", overwrite=False)
    run.set_status("finished")  # the replacement finished; killed while deleting the old run
    assert run.prepare("third recipe", overwrite=True) is False
    assert (run.replaced_dir / "recipe.yaml").read_text() == "new recipe"  # kept, not deleted


@pytest.mark.parametrize(
    "preset, message",
    [
        (
            "package:bertkit/no_such_model",
            "backbone.preset: preset folder not found: {bertkit}/"
            "no_such_model (from 'package:bertkit/no_such_model')",
        ),
        (
            "package:no_such_package/model",
            "backbone.preset: no installed Python package "
            "'no_such_package' (from 'package:no_such_package/model')",
        ),
    ],
)
def test_check_refuses_a_package_preset_that_does_not_exist(tmp_path, preset, message):
    import bertkit as api

    write_sentiment_tsv(tmp_path / "train.tsv", 4)
    write_sentiment_tsv(tmp_path / "dev.tsv", 4)
    result = bertkit(
        "check", str(write_recipe(tmp_path)), "--set", f"backbone.preset={preset}", cwd=tmp_path
    )
    one_line_error(result, message.format(bertkit=Path(api.__file__).parent))


def test_check_refuses_preset_choices_that_do_not_exist(finished, tmp_path):
    recipe = write_recipe(finished, "search.yaml")
    recipe.write_text(
        recipe.read_text() + "search:\n  backbone.preset: [ckpt, ./no_ckpt, "
        "'package:bertkit/no_model']\n"
    )
    result = bertkit("check", str(recipe), cwd=finished)
    one_line_error(
        result,
        f"search.yaml:16: search.backbone.preset.1: preset folder not found: "
        f"{finished / 'no_ckpt'}",
    )
    recipe.write_text(recipe.read_text().replace("./no_ckpt, ", ""))
    one_line_error(
        bertkit("check", str(recipe), cwd=finished),
        "search.backbone.preset.1: preset folder not found: ",
    )


def test_a_jax_run_prints_no_tensorflow_start_up_lines(finished):
    import os

    environment = {
        name: value for name, value in os.environ.items() if not name.startswith("TF_")
    }  # as a user's shell has them
    result = subprocess.run(
        [sys.executable, "-m", "bertkit.cli", "predict", str(finished / "run")],
        input="a good film\n",
        capture_output=True,
        text=True,
        env={**environment, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"},
    )
    assert result.returncode == 0, result.stderr
    assert "label" in json.loads(result.stdout)
    assert result.stderr == ""  # not "WARNING: All log messages before absl::InitializeLog()..."


def test_evaluate_on_a_header_only_file_is_one_line(finished, tmp_path):
    (tmp_path / "header.tsv").write_text("sentence\tlabel\n")
    result = bertkit("evaluate", str(finished / "run"), "--data", str(tmp_path / "header.tsv"))
    one_line_error(result, "header.tsv: no examples to evaluate (only a header, or empty)")
