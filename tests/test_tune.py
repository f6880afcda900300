"""`bertkit tune`: Optuna trials as run directories, pruning, several workers, kill -9.

One study (the `workers` fixture) serves several tests, because every trial costs
seconds: two `bertkit tune` processes share its SQLite storage, one of them is
killed with kill -9 in the middle of a trial and started again, and together they
must finish exactly the requested 4 trials.
"""

import json
import os
import signal
import subprocess
import sys
import time
import types

import optuna
import pytest
import yaml

from bertkit import cli, tuning
from bertkit.run_dir import RunDirectory
from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint

TRIALS = 4


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tune")
    write_tiny_checkpoint(folder / "tiny")
    write_sentiment_tsv(folder / "train.tsv", 64)
    write_sentiment_tsv(folder / "dev.tsv", 16, seed=1)
    return folder


def write_recipe(folder, name, **search):
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "schema": 1, "task": "classification",
        "backbone": {"preset": "tiny", "sequence_length": 32},
        "data": {"train": "train.tsv", "validation": "dev.tsv", "text": "sentence"},
        "training": {"epochs": 2, "batch_size": 16},
        "output_dir": name,
        "search": {"training.learning_rate": {"low": 1e-4, "high": 1e-2, "log": True},
                   **search}}))
    return path


def start_worker(recipe):
    return subprocess.Popen([sys.executable, "-m", "bertkit.cli", "tune", str(recipe),
                             "--heartbeat", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def trial_of(process, study_folder):
    """The trial folder a worker process is writing (its `.lock` names the process)."""
    for lock in study_folder.glob("trial-*/.lock"):
        if f"pid {process.pid} " in lock.read_text():
            return lock.parent
    return None


def kill_after_first_epoch(process, study_folder):
    deadline = time.time() + 180
    while time.time() < deadline and process.poll() is None:
        trial = trial_of(process, study_folder)
        metrics = trial and trial / "metrics.json"
        if metrics and metrics.exists() and json.loads(metrics.read_text())["epochs"]:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
            return trial
        time.sleep(0.1)
    raise AssertionError("the worker ended before it could be killed mid-trial")


@pytest.fixture(scope="module")
def workers(files):
    recipe = write_recipe(files, "shared", trials=TRIALS, pruner="none")
    first, second = start_worker(recipe), start_worker(recipe)
    killed_trial = kill_after_first_epoch(first, files / "shared.study")
    restarted = start_worker(recipe)
    outputs = [p.communicate(timeout=300)[0] for p in (second, restarted)]
    assert [second.returncode, restarted.returncode] == [0, 0], "\n".join(outputs)
    study = optuna.load_study(study_name="shared",
                              storage=f"sqlite:///{files / 'shared.study' / 'study.db'}")
    return study, files / "shared.study", killed_trial, {first.pid, second.pid, restarted.pid}


def complete_trials(study):
    return [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]


def test_workers_together_finish_exactly_the_requested_trials(workers):
    study, _, _, pids = workers
    done = complete_trials(study)
    assert len(done) == TRIALS
    ran_by = {int(t.user_attrs["worker"].rsplit(":", 1)[1]) for t in done}
    assert len(ran_by) >= 2 and ran_by <= pids
    assert len({t.user_attrs["run_dir"] for t in done}) == TRIALS


def test_a_trial_killed_with_kill_9_is_failed_and_run_again(workers):
    study, folder, killed_trial, _ = workers
    (failed,) = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL
                 and not t.user_attrs.get("surplus")]  # a worker stepping back, see tuning
    assert failed.user_attrs["run_dir"] == str(killed_trial)
    (retry,) = [t for t in complete_trials(study) if t.params == failed.params]
    assert retry.number > failed.number
    assert RunDirectory(killed_trial).status() == "running"  # as the kill left it


def test_the_best_trial_has_the_best_metric_and_trials_are_complete_runs(workers):
    study, folder, _, _ = workers
    accuracy = {}
    for trial in complete_trials(study):
        run = RunDirectory(trial.user_attrs["run_dir"])
        assert run.status() == "finished" and (run.saved_model_dir / "saved_model.pb").exists()
        assert yaml.safe_load(run.recipe_file.read_text())["training"]["learning_rate"] == (
            trial.params["training.learning_rate"])
        accuracy[trial.number] = json.loads(run.metrics_file.read_text())[
            "final"]["validation"]["accuracy"]
        assert trial.value == accuracy[trial.number]
    assert study.best_value == max(accuracy.values())
    assert (folder / "best").resolve() == RunDirectory(study.best_trial.user_attrs["run_dir"]).path


def test_the_report_names_the_best_trial_and_shows_the_plots(workers):
    study, folder, _, _ = workers
    report = (folder / "report.md").read_text()
    best = study.best_trial
    assert f"## Best trial: {best.number}" in report
    assert f"`trial-{best.number:04d}/`" in report and "saved_model/" in report
    assert f"Trials: {TRIALS} complete, 1 fail" in report
    for png in ("optimization_history.png", "param_importances.png"):
        assert f"]({png})" in report and (folder / png).stat().st_size > 1000


def test_pruning_stops_a_trial_whose_metric_falls_behind(files, capsys):
    recipe = write_recipe(files, "pruned", trials=3, pruner_startup_trials=2)
    base = tuning.load_search_recipe(recipe)
    place = tuning.StudyPlace.of(base)
    study = tuning.open_study(place, base, None, create=True)
    rate = optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)
    for _ in range(2):  # two earlier trials far ahead at every epoch
        study.add_trial(optuna.trial.create_trial(
            params={"training.learning_rate": 1e-3}, distributions={"training.learning_rate": rate},
            value=2.0, intermediate_values={1: 2.0, 2: 2.0}))
    objective = tuning.Objective(recipe, [], base, place.folder, target=3, verbose=0)
    tuning.run_trials(study, objective, deadline=None)
    trial = study.trials[-1]
    assert trial.state == optuna.trial.TrialState.PRUNED and trial.last_step == 1
    run = RunDirectory(trial.user_attrs["run_dir"])
    assert json.loads(run.run_file.read_text())["pruned_after_epoch"] == 1
    assert len(json.loads(run.metrics_file.read_text())["epochs"]) == 1  # of 2
    assert run.status() == "finished" and run.saved_model_dir.is_dir()
    assert "trial 2 pruned after epoch 1" in capsys.readouterr().out
    tuning.report(recipe)
    assert "| 2 | pruned |" in (place.folder / "report.md").read_text()


def test_a_trial_started_beyond_the_requested_number_steps_back(files, tmp_path):
    recipe = write_recipe(files, "surplus", trials=2)
    base = tuning.load_search_recipe(recipe)
    study = optuna.create_study()
    first, _running, third = study.ask(), study.ask(), study.ask()  # three workers at once
    study.tell(first, 0.5)
    objective = tuning.Objective(recipe, [], base, tmp_path, target=2)
    with pytest.raises(tuning.SurplusTrial, match="trial 2 is not needed"):
        objective(third)
    assert third.user_attrs == {"surplus": True} and not list(tmp_path.iterdir())


class ScriptedTrial:
    """An Optuna trial whose pruner says prune at every epoch."""

    def __init__(self):
        self.reported = []

    def report(self, value, step):
        self.reported.append((step, value))

    def should_prune(self):
        return True


@pytest.mark.parametrize("epoch, stops", [(0, True), (1, False)])
def test_the_last_epoch_is_reported_but_never_pruned(epoch, stops):
    from bertkit.callbacks import ReportToTrial

    trial = ScriptedTrial()
    callback = ReportToTrial(trial, "val_accuracy")
    callback.set_params({"epochs": 2})
    callback.set_model(types.SimpleNamespace(stop_training=False))
    callback.on_epoch_end(epoch, {"val_accuracy": 0.5, "loss": 0.7})
    assert trial.reported == [(epoch + 1, 0.5)]
    assert callback.model.stop_training is stops
    assert callback.pruned_after == (1 if stops else None)


def test_without_optuna_tune_says_how_to_install_it(files, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "optuna", None)  # `import optuna` raises ImportError
    assert cli.main(["tune", str(write_recipe(files, "no_optuna"))]) == 2
    assert capsys.readouterr().err == (
        'bertkit: error: hyperparameter search needs Optuna: pip install "bertkit[tune]"\n')


@pytest.mark.parametrize("args, message", [
    (["--storage", "nosuchdb://x"], "nosuchdb://x: cannot open the storage"),
    (["--report"], "errors.study: no study here; run 'bertkit tune' first"),
])
def test_tune_user_errors_are_one_line(files, capsys, args, message):
    recipe = write_recipe(files, "errors")
    assert cli.main(["tune", str(recipe), *args]) == 2
    error = capsys.readouterr().err
    assert error.startswith("bertkit: error: ") and message in error and error.count("\n") == 1


def test_a_recipe_without_search_section_is_one_line(files, capsys):
    recipe = files / "plain.yaml"
    recipe.write_text("schema: 1\ntask: classification\nbackbone: {preset: tiny}\n"
                      "data: {train: train.tsv}\n")
    assert cli.main(["tune", str(recipe)]) == 2
    assert capsys.readouterr().err.startswith(
        f"bertkit: error: {recipe}: has no 'search' section; add one")
