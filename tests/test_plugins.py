"""Third-party task plugins: installed as their own distribution, found by entry point."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bertkit.testing import run_bertkit, run_task_contract_test, write_tiny_checkpoint

EXAMPLE = Path(__file__).parent.parent / "examples" / "bertkit-regression"


def bertkit_cli(args, site, **kwargs):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "bertkit.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        **kwargs,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The docs' example plugin (docs/plugins.md) installed as a separate distribution, plus a broken one."""
    site = tmp_path_factory.mktemp("site")
    source = shutil.copytree(EXAMPLE, tmp_path_factory.mktemp("src") / EXAMPLE.name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-compile",
            "--target",
            str(site),
            str(source),
        ],
        check=True,
        capture_output=True,
    )  # a copy: building writes into the source
    broken = site / "broken_plugin-1.0.dist-info"
    broken.mkdir()
    (broken / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (broken / "entry_points.txt").write_text("[bertkit.tasks]\nbroken = broken_plugin:Task\n")
    (site / "broken_plugin.py").write_text("raise ImportError('needs a missing library')\n")
    twice = site / "twice_plugin-1.0.dist-info"  # a built-in task's name, declared again
    twice.mkdir()
    (twice / "METADATA").write_text("Metadata-Version: 2.1\nName: twice-plugin\nVersion: 1.0\n")
    (twice / "entry_points.txt").write_text("[bertkit.tasks]\nmlm = twice_plugin:Task\n")
    return site


def test_tasks_lists_plugins_and_reports_a_broken_one(site):
    result = bertkit_cli(["tasks"], site)
    assert result.returncode == 0, result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines()}
    assert "[bertkit-regression 0.1.0]" in lines["text_score"]
    assert "classification" in lines
    assert lines["broken"] == (
        "broken           FAILED TO LOAD (broken_plugin:Task, from "
        "broken-plugin 1.0): ImportError: needs a missing library"
    )


def test_a_task_name_two_distributions_declare_is_refused_for_both(site, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("schema: 1\ntask: mlm\nbackbone: {preset: x}\ndata: {train: t.txt}\n")
    result = bertkit_cli(["check", str(recipe)], site)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert f"{recipe}:2: task: task 'mlm' is declared twice (" in result.stderr
    assert "twice_plugin:Task from twice-plugin 1.0" in result.stderr
    assert result.stderr.endswith("uninstall one of them\n")
    listed = bertkit_cli(["tasks"], site).stdout
    assert "task 'mlm' is declared twice" in listed


def test_broken_plugin_is_a_one_line_user_error(site, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("schema: 1\ntask: broken\nbackbone: {preset: x}\ndata: {train: t.tsv}\n")
    result = bertkit_cli(["check", str(recipe)], site)
    assert result.returncode == 2
    assert result.stderr == (
        f"bertkit: error: {recipe}:2: task: task plugin 'broken' "
        "(broken_plugin:Task, from broken-plugin 1.0) failed to import: "
        "ImportError: needs a missing library\n"
    )


def test_example_plugin_trains_and_predicts_from_the_command_line(site, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(site))  # the entry point is found on sys.path
    write_tiny_checkpoint(tmp_path / "ckpt")
    rows = ["text\tscore"] + [f"{'good ' * (i % 4)}film\t{i % 4}" for i in range(64)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n")
    (tmp_path / "r.yaml").write_text(
        yaml.safe_dump(
            {
                "schema": 1,
                "task": "text_score",
                "backbone": {"preset": "./ckpt", "sequence_length": 16},
                "data": {"train": "train.tsv", "validation": "train.tsv"},
                "training": {"epochs": 3, "batch_size": 8, "learning_rate": 3e-3},
                "export": {"saved_model": False},  # the contract test exports the plugin
                "output_dir": "run",
            }
        )
    )
    result = run_bertkit("finetune", tmp_path / "r.yaml")
    assert result.returncode == 0, result.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["monitor"] == "val_mse"
    assert metrics["epochs"][-1]["val_mse"] < metrics["epochs"][0]["val_mse"]
    predicted = run_bertkit("predict", tmp_path / "run", input="good good film\n")
    assert isinstance(json.loads(predicted.stdout)["score"], float)


def test_example_plugin_passes_the_contract_test(site, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(site))  # the entry point is found on sys.path
    rows = ["text\tscore"] + [f"{'good ' * (i % 4)}film\t{i % 4}" for i in range(32)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n")
    run_task_contract_test(
        "text_score",
        tmp_path / "train.tsv",
        directory=tmp_path,
        inputs=["good good film", "film"],
        bad_input=42,
    )


def test_plugin_page_shows_the_example_plugin_verbatim():
    page = (EXAMPLE.parent.parent / "docs" / "plugins.md").read_text()
    for name in ("bertkit_regression.py", "pyproject.toml"):
        assert (EXAMPLE / name).read_text() in page, name
