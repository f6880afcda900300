"""Hardening of exports and of predict's output file (issue 51): a full disk is one line
naming the file and leaves nothing half-written; a rerun after kill -9 in the export or
the int8 gate leaves no staging folders; finetune says what the int8 gate measured; an
unfinished run is not exported as int8.

A full disk is injected (no small file system in CI): safetensors' writer, TensorFlow's
SavedModel writer or the output file raise what they raise on a real full disk.
"""

import errno
import io
import json
import os
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

from bertkit.cli import main
from bertkit.errors import UserError
from bertkit.run_dir import FINISHED, RUNNING, RunDirectory
from bertkit.serving import quantize
from bertkit.serving.staging import finished_run, stale_staging_folders
from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint
from tests.test_transformers_export import write_run

NO_SPACE = "No space left on device"
ROOT = Path(__file__).resolve().parent.parent  # the checkout, for the child processes


def hidden_leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# ---- 1. export --format transformers onto a full disk


def _full_disk_in_safetensors(monkeypatch):
    """safetensors' writer as on a full disk: part of the file written, then its error."""
    import safetensors.numpy
    from safetensors import SafetensorError

    def full(tensors, filename, metadata=None):
        with open(filename, "wb") as file:
            file.write(b"\0" * 100)
        raise SafetensorError(f"Error while serializing: I/O error: {NO_SPACE} (os error 28)")

    monkeypatch.setattr(safetensors.numpy, "serialize_file", full)


def _full_disk_in_config_json(monkeypatch):
    """The disk fills up at config.json: `open` names the file, as the OS reports it."""
    from bertkit.model import hf_files

    def full(path, value):
        raise OSError(errno.ENOSPC, NO_SPACE, str(path))

    monkeypatch.setattr(hf_files, "write_json", full)
    import bertkit.serving.transformers_export as transformers_export

    monkeypatch.setattr(transformers_export, "write_json", full)


@pytest.mark.parametrize(
    "fault, file",
    [(_full_disk_in_safetensors, "model.safetensors"), (_full_disk_in_config_json, "config.json")],
)
def test_transformers_export_onto_a_full_disk_is_one_line_naming_the_file(
    tmp_path, monkeypatch, capsys, fault, file
):
    run_dir, _, _ = write_run(tmp_path, "classification")
    exports = tmp_path / "exports"
    (exports / "hf").mkdir(parents=True)  # an empty folder the export may take
    fault(monkeypatch)
    code = main(["export", str(run_dir), "--out", str(exports / "hf"), "--format", "transformers"])
    assert code == 2
    assert capsys.readouterr().err == (
        f"bertkit: error: {exports / 'hf'}: cannot write the transformers folder: "
        f"{file}: {NO_SPACE}\n"
    )
    assert list((exports / "hf").iterdir()) == [] and hidden_leftovers(exports) == []


def test_a_safetensors_error_that_is_no_os_error_is_not_reworded(tmp_path, monkeypatch):
    """A bug's error stays a traceback: only what the disk said becomes a user's line."""
    import safetensors.numpy
    from safetensors import SafetensorError

    def broken(tensors, filename, metadata=None):
        raise SafetensorError("Error while serializing: shape mismatch")

    run_dir, _, _ = write_run(tmp_path, "classification")
    monkeypatch.setattr(safetensors.numpy, "serialize_file", broken)
    with pytest.raises(SafetensorError, match="shape mismatch"):
        main(["export", str(run_dir), "--out", str(tmp_path / "hf"), "--format", "transformers"])
    assert hidden_leftovers(tmp_path) == []


# ---- 2. predict --output onto a full disk


class _FullDiskFile(io.StringIO):
    """An output file on a disk with room for `room` characters: a write past them, or
    the close that flushes them (`at`), fails as a full disk does."""

    def __init__(self, at: str, room: int = 200):
        super().__init__()
        self.at, self.room = at, room

    def write(self, text):
        if self.at == "write" and self.tell() + len(text) > self.room:
            raise OSError(errno.ENOSPC, NO_SPACE)
        return super().write(text)

    def close(self):
        if self.at == "close" and not self.closed:
            super().close()
            raise OSError(errno.ENOSPC, NO_SPACE)
        super().close()


@pytest.mark.parametrize("at", ["write", "close"])
def test_predict_output_onto_a_full_disk_names_the_file_and_keeps_the_old_one(
    tmp_path, monkeypatch, capsys, at
):
    from bertkit.cli import output

    run_dir, _, _ = write_run(tmp_path, "classification")
    inputs = tmp_path / "in.txt"
    inputs.write_text("".join(f"a good film number {i}\n" for i in range(40)))
    out = tmp_path / "out" / "predictions.jsonl"
    out.parent.mkdir()
    out.write_text("the earlier predictions\n")
    real_open = open

    def opened(path, mode="r", **kwargs):
        if str(path).endswith(".partial"):
            real_open(path, mode, **kwargs).close()  # the temporary exists, as on a disk
            return _FullDiskFile(at)
        return real_open(path, mode, **kwargs)

    monkeypatch.setattr(output, "open", opened, raising=False)
    arguments = ["predict", str(run_dir), "--input", str(inputs), "--output", str(out)]
    assert main([*arguments, "--overwrite"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"bertkit: error: {out}: cannot write the file: {NO_SPACE}"
    )
    assert out.read_text() == "the earlier predictions\n"
    assert sorted(p.name for p in out.parent.iterdir()) == ["predictions.jsonl"]


def test_predict_output_in_a_folder_it_cannot_write_names_the_file(tmp_path, monkeypatch):
    from bertkit.cli import output

    def denied(path, mode="r", **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(output, "open", denied, raising=False)
    with pytest.raises(UserError) as error, output.atomic_output(tmp_path / "p.jsonl"):
        pass
    assert str(error.value) == f"{tmp_path / 'p.jsonl'}: cannot write the file: Permission denied"


# ---- 3 and 4. kill -9 in the int8 gate; finetune's line on the gate


@pytest.fixture(scope="module")
def killed_then_rerun(tmp_path_factory):
    """A run with an int8 export killed (SIGKILL) in the gate's measurements, with the
    staging folder a kill in the float export leaves added, then run again (stdout kept)."""
    tmp = tmp_path_factory.mktemp("killed")
    write_tiny_checkpoint(tmp / "ckpt", num_layers=1, hidden_size=16, intermediate_size=32)
    write_sentiment_tsv(tmp / "train.tsv", 32, seed=0)
    write_sentiment_tsv(tmp / "dev.tsv", 8, seed=1)
    recipe = tmp / "r.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "schema": 1,
                "task": "classification",
                "backbone": {"preset": str(tmp / "ckpt"), "sequence_length": 16},
                "data": {
                    "train": str(tmp / "train.tsv"),
                    "validation": str(tmp / "dev.tsv"),
                    "text": "sentence",
                },
                "training": {"epochs": 1, "batch_size": 8, "learning_rate": 1e-3},
                # 8 examples: one flipped answer is 12.5 points; the gate is to pass here
                "export": {"quantize": "int8", "max_metric_drop": 100},
                "output_dir": str(tmp / "run"),
            }
        )
    )
    killer = (
        "import os, signal, sys\n"
        "from bertkit.serving import quantize\n"
        "quantize.latency_p50_ms = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
        "from bertkit.cli import main\n"
        "sys.exit(main(['finetune', sys.argv[1]]))\n"
    )
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    environment = {**os.environ, "PYTHONPATH": path, "TF_CPP_MIN_LOG_LEVEL": "3"}
    killed = subprocess.run(
        [sys.executable, "-c", killer, str(recipe)], env=environment, capture_output=True
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    run = tmp / "run"
    left = {
        "int8": stale_staging_folders(run / "saved_model_int8"),  # the kill's own
        "metrics": (run / "metrics.json").read_bytes(),
        "weights": (run / "model" / "model.weights.h5").read_bytes(),
    }
    float_staging = run / ".saved_model.0123abcd.partial"  # as a kill in the float export
    (float_staging / "variables").mkdir(parents=True)
    (float_staging / "saved_model.pb").write_bytes(b"\0" * 10)
    (run / ".saved_model_int8.89abcdef.int8").mkdir()  # the int8 gate's former name
    (run / ".saved_model.notes").write_text("the user's")  # not a staging folder
    rerun = subprocess.run(
        [sys.executable, "-m", "bertkit.cli", "finetune", str(recipe)],
        env=environment,
        capture_output=True,
        text=True,
    )
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    return run, left, rerun


def test_a_rerun_after_kill_9_in_the_int8_gate_leaves_no_staging_folders(killed_then_rerun):
    run, left, _ = killed_then_rerun
    assert [p.name.endswith(".partial") for p in left["int8"]] == [True]
    assert RunDirectory(run).status() == FINISHED
    assert stale_staging_folders(run / "saved_model") == []
    assert stale_staging_folders(run / "saved_model_int8") == []
    assert [name for name in hidden_leftovers(run) if name != ".lock"] == [".saved_model.notes"]
    assert (run / ".saved_model.notes").read_text() == "the user's"
    # resumed after training, bit-exact
    assert (run / "metrics.json").read_bytes() == left["metrics"]
    assert (run / "model" / "model.weights.h5").read_bytes() == left["weights"]
    assert (run / "saved_model" / "saved_model.pb").is_file()
    assert (run / "saved_model_int8" / "saved_model.pb").is_file()


def test_finetune_prints_the_int8_gate_figures_and_folder(killed_then_rerun):
    run, _, rerun = killed_then_rerun
    record = json.loads((run / quantize.RECORD_FILE).read_text())
    before, after = (100 * record[name]["accuracy"] for name in ("float", "int8"))
    changed = quantize.points_changed(record["drop_points"])
    assert (
        f"int8 export passed the gate: validation accuracy {before:.2f} (float) -> "
        f"{after:.2f} (int8), {changed}, within the budget of 100; wrote "
        f"{run / 'saved_model_int8'}\n"
    ) in rerun.stdout


@pytest.mark.parametrize(
    "drop, words",
    [(0.4, "0.40 points lost"), (-2.5, "+2.50 points gained"), (0, "0.00 points lost")],
)
def test_the_gate_says_points_gained_for_a_gain(tmp_path, drop, words):
    record = {
        "monitor": "accuracy",
        "budget_points": 0.5,
        "drop_points": drop,
        "float": {"accuracy": 0.85, "size_bytes": 4e6, "latency_p50_ms": 2.0},
        "int8": {"accuracy": 0.85 - drop / 100, "size_bytes": 1e6, "latency_p50_ms": 1.0},
    }
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "bertkit.json").write_text(json.dumps({"quantization": record}))
    assert quantize.describe(tmp_path).splitlines()[-1] == (
        f"{words}, within the budget of 0.5: passed"
    )
    task = types.SimpleNamespace(monitor_points=100)
    assert f"(int8), {words}, within the budget of 0.5; wrote {tmp_path}" in (
        quantize.gate_line(task, tmp_path)
    )


def test_a_refused_gate_names_a_loss_as_lost():
    task = types.SimpleNamespace(monitor="accuracy", mode="max", monitor_points=100)
    with pytest.raises(UserError, match=r"85.00 \(float\) -> 80.00 \(int8\), 5.00 points lost"):
        quantize.check_quality(task, 0.85, 0.80, 0.5)
    quantize.check_quality(task, 0.80, 0.85, 0.5)  # a gain passes


# ---- 5 and 6. an unfinished run; a folder the int8 export cannot write


def test_int8_export_of_an_unfinished_run_is_refused_as_transformers_is(tmp_path, capsys):
    run_dir, _, _ = write_run(tmp_path, "classification", status=RUNNING)
    message = (
        f"bertkit: error: {run_dir}: holds no finished run (run.json: running); "
        "export a run that bertkit finetune has finished\n"
    )
    for extra in (["--quantize", "int8"], ["--format", "transformers"], []):
        assert main(["export", str(run_dir), "--out", str(tmp_path / "out"), *extra]) == 2
        assert capsys.readouterr().err == message
    assert not (tmp_path / "out").exists()


def test_a_run_killed_in_its_finish_step_may_be_exported_as_float_only(tmp_path):
    """`finetune` exports a JAX run from a TensorFlow child process before it marks the
    run finished: a trained run is exported as float (its weights are final)."""
    run_dir, _, _ = write_run(tmp_path, "classification", status=RUNNING)
    RunDirectory(run_dir).set_status(RUNNING, trained=True)
    assert finished_run(run_dir, trained_will_do=True).path == run_dir
    with pytest.raises(UserError, match="holds no finished run"):
        finished_run(run_dir)


def test_int8_export_into_a_read_only_folder_fails_before_the_gate(
    killed_then_rerun, tmp_path, monkeypatch, capsys
):
    from bertkit.serving.finetuned import FineTunedModel

    run, _, _ = killed_then_rerun

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    def scored(self, *args, **kwargs):
        raise AssertionError("the gate scored a model it cannot write")

    monkeypatch.setattr(Path, "mkdir", read_only)
    monkeypatch.setattr(FineTunedModel, "evaluate", scored)
    out = tmp_path / "int8"
    assert main(["export", str(run), "--out", str(out), "--quantize", "int8"]) == 2
    assert capsys.readouterr().err == (
        f"bertkit: error: {out}: cannot write the SavedModel: Read-only file system\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_int8_export_onto_a_full_disk_names_the_folder_asked_for(
    killed_then_rerun, tmp_path, monkeypatch, capsys
):
    import tensorflow as tf

    run, _, _ = killed_then_rerun
    real_save = tf.saved_model.save

    def full(module, path, **kwargs):  # TensorFlow's own error for a full disk
        real_save(module, path, **kwargs)
        raise tf.errors.ResourceExhaustedError(None, None, f"{path}/saved_model.pb; {NO_SPACE}")

    monkeypatch.setattr(tf.saved_model, "save", full)
    out = tmp_path / "exports" / "int8"
    assert main(["export", str(run), "--out", str(out), "--quantize", "int8"]) == 2
    assert capsys.readouterr().err == (
        f"bertkit: error: {out}: cannot write the SavedModel: {NO_SPACE}\n"
    )
    assert list((tmp_path / "exports").iterdir()) == []


# ---- 6. export paths: a file among the parents, links, a folder it cannot write


@pytest.mark.parametrize("format", ["savedmodel", "transformers"])
def test_an_export_path_under_a_file_or_a_broken_link_is_refused(tmp_path, capsys, format):
    run_dir, _, _ = write_run(tmp_path, "classification")
    (tmp_path / "afile").write_text("x")
    (tmp_path / "broken").symlink_to(tmp_path / "nowhere")
    for out, message in [
        ("afile/model", f"{tmp_path / 'afile'}: exists and is not a folder; choose another"),
        ("broken", f"{tmp_path / 'broken'}: export path is a broken link; choose another"),
    ]:
        arguments = ["export", str(run_dir), "--out", str(tmp_path / out), "--format", format]
        assert main(arguments) == 2
        assert capsys.readouterr().err.startswith(f"bertkit: error: {message}")
    assert (tmp_path / "afile").read_text() == "x" and not (tmp_path / "nowhere").exists()


def test_an_export_through_a_link_to_an_empty_folder_fills_the_folder(tmp_path, capsys):
    run_dir, _, _ = write_run(tmp_path, "classification")
    (tmp_path / "folder").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "folder")
    arguments = ["export", str(run_dir), "--out", str(tmp_path / "link")]
    assert main([*arguments, "--format", "transformers"]) == 0
    assert (tmp_path / "link").is_symlink()
    assert (tmp_path / "folder" / "model.safetensors").is_file()
    assert hidden_leftovers(tmp_path) == []


def test_transformers_export_into_a_read_only_folder_is_one_line(tmp_path, monkeypatch, capsys):
    run_dir, _, _ = write_run(tmp_path, "classification")

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)
    out = tmp_path / "exports" / "hf"
    assert main(["export", str(run_dir), "--out", str(out), "--format", "transformers"]) == 2
    assert capsys.readouterr().err == (
        f"bertkit: error: {out}: cannot write the transformers folder: Read-only file system\n"
    )
    assert not (tmp_path / "exports").exists()


def test_a_failed_export_in_a_tensorflow_process_is_one_error_line(tmp_path):
    """After a JAX run: the child's error, not `bertkit: error:` twice."""
    from bertkit.serving.export import export_in_tensorflow_process

    run_dir, _, _ = write_run(tmp_path, "classification")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("x")
    with pytest.raises(UserError) as error:
        export_in_tensorflow_process(run_dir, tmp_path / "taken")
    assert str(error.value) == (
        f"{run_dir}: SavedModel export in a TensorFlow process failed: "
        f"{tmp_path / 'taken'}: export folder exists and is not empty; choose another"
    )


def test_an_empty_folder_the_user_made_keeps_its_mode(tmp_path):
    run_dir, _, _ = write_run(tmp_path, "classification")
    (tmp_path / "shared").mkdir()
    os.chmod(tmp_path / "shared", 0o770)  # a group's folder, whatever the umask
    arguments = ["export", str(run_dir), "--out", str(tmp_path / "shared")]
    assert main([*arguments, "--format", "transformers"]) == 0
    assert (tmp_path / "shared").stat().st_mode & 0o7777 == 0o770
    assert (tmp_path / "shared" / "config.json").is_file()
