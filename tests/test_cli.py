"""The CLI: user errors are one line on stderr and exit status 2, never a traceback."""

import subprocess
import sys

import pytest


def bertkit(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "bertkit.cli", *args], capture_output=True,
                          text=True, cwd=cwd)


@pytest.mark.parametrize("args, message", [
    (["finetune", "missing.yaml"], "bertkit: error: missing.yaml: file not found"),
    (["check", "r.yaml", "--set", "training.epochs"],
     "bertkit: error: --set: expected KEY=VALUE, got 'training.epochs'"),
    (["check", "r.yaml", "--set", "training.batch_size=-1"],
     "bertkit: error: --set: training.batch_size: must be at least 1, got -1"),
    (["check", "r.yaml", "--set", "task=tagginng"],
     "bertkit: error: --set: task: unknown task 'tagginng'; did you mean 'tagging'?"),
    (["evaluate", "nowhere"], "bertkit: error: nowhere: run directory not found"),
])
def test_user_errors_exit_2_with_one_line(tmp_path, args, message):
    (tmp_path / "r.yaml").write_text("schema: 1\ntask: classification\nbackbone: {preset: x}\n"
                                     "data: {train: t.tsv}\n")
    result = bertkit(*args, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


def test_help_on_every_command():
    for command in ("finetune", "featurize", "check", "schema", "tasks", "evaluate", "predict",
                    "export", "tune"):
        result = bertkit(command, "--help")
        assert result.returncode == 0 and "usage: bertkit " + command in result.stdout


def test_schema_is_json():
    import json

    result = bertkit("schema")
    assert json.loads(result.stdout)["title"] == "bertkit recipe"
