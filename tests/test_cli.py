"""The CLI: user errors are one line on stderr and exit status 2, never a traceback.

The commands run in this process (`run_bertkit`); the `bertkit` process itself (its exit,
its start-up output, pipes, signals) is tested in test_hardening.py and test_preemption.py.
"""

import json

import pytest

from bertkit.testing import run_bertkit


def bertkit(*args, cwd=None):
    return run_bertkit(*args, cwd=cwd)


@pytest.mark.parametrize(
    "args, message",
    [
        (["finetune", "missing.yaml"], "bertkit: error: missing.yaml: file not found"),
        (
            ["check", "r.yaml", "--set", "training.epochs"],
            "bertkit: error: --set: expected KEY=VALUE, got 'training.epochs'",
        ),
        (
            ["check", "r.yaml", "--set", "training.batch_size=-1"],
            "bertkit: error: --set: training.batch_size: must be at least 1, got -1",
        ),
        (
            ["check", "r.yaml", "--set", "task=tagginng"],
            "bertkit: error: --set: task: unknown task 'tagginng'; did you mean 'tagging'?",
        ),
        (["evaluate", "nowhere"], "bertkit: error: nowhere: run directory not found"),
    ],
)
def test_user_errors_exit_2_with_one_line(tmp_path, args, message):
    (tmp_path / "r.yaml").write_text(
        "schema: 1\ntask: classification\nbackbone: {preset: x}\ndata: {train: t.tsv}\n"
    )
    result = bertkit(*args, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


def test_help_on_every_command():
    for command in (
        "finetune",
        "featurize",
        "check",
        "schema",
        "tasks",
        "evaluate",
        "predict",
        "embed",
        "export",
        "tune",
    ):
        result = bertkit(command, "--help")
        assert result.returncode == 0 and "usage: bertkit " + command in result.stdout


def test_schema_is_json():
    result = bertkit("schema")
    assert json.loads(result.stdout)["title"] == "bertkit recipe"


def fake_run(folder, task):
    """A run directory naming `task` whose weights file is empty: any load of the model
    fails, so an answer about the task's options comes before the model loads."""
    (folder / "run" / "model").mkdir(parents=True)
    (folder / "run" / "model" / "task.json").write_text(json.dumps({"task": task}))
    (folder / "run" / "model" / "model.weights.h5").write_bytes(b"")
    return folder / "run"


@pytest.mark.parametrize(
    "task, args, message",
    [
        (
            "tagging",
            ["RUN", "--top-k", "3"],
            "unknown option --top-k for a tagging model; its task's predict options: none",
        ),
        (
            "classification",
            ["--frob", "1", "RUN"],  # a task's flag may come before RUN_DIR
            "unknown option --frob for a classification model; its task's predict options: --top-k K",
        ),
        (
            "classification",
            ["RUN", "--top-k", "0"],
            "argument --top-k: expected a whole number of at least 1, got '0'",
        ),
    ],
)
def test_predict_options_come_from_the_runs_task(tmp_path, task, args, message):
    run = str(fake_run(tmp_path, task))
    result = bertkit("predict", *[run if arg == "RUN" else arg for arg in args])
    assert result.returncode == 2
    assert result.stderr == f"bertkit: error: {message}\n"


def test_tasks_lists_each_tasks_predict_options():
    lines = {line.split()[0]: line for line in bertkit("tasks").stdout.splitlines()}
    assert lines["classification"].endswith("]  predict: --top-k K")
    assert "predict:" not in lines["tagging"]
