"""`bertkit tune`: Optuna trials as run directories, pruning, several workers, kill -9.

One study (the `workers` fixture) serves several tests, because every trial costs
seconds: two `bertkit tune` processes share its SQLite storage, one of them is
killed with kill -9 in the middle of a trial and started again, and together they
must finish exactly the requested 4 trials.
"""

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import types

import keras
import optuna
import pytest
import yaml

from bertkit import cli
from bertkit.errors import UserError
from bertkit.run_dir import RunDirectory
from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint
from bertkit.tuning import tuner as tuning

TRIALS = 4


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tune")
    write_tiny_checkpoint(folder / "tiny")
    write_sentiment_tsv(folder / "train.tsv", 64)
    write_sentiment_tsv(folder / "dev.tsv", 16, seed=1)
    return folder


CLASSIFICATION_DATA = {"train": "train.tsv", "validation": "dev.tsv", "text": "sentence"}
RATE = {"low": 1e-4, "high": 1e-2, "log": True}


def write_recipe(
    folder,
    name,
    *,
    task="classification",
    data=CLASSIFICATION_DATA,
    epochs=2,
    output_dir=None,
    rate=RATE,
    saved_model=False,  # each trial's export costs seconds; the tests that need one say so
    **search,
):
    path = folder / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "schema": 1,
                "task": task,
                "backbone": {"preset": "tiny", "sequence_length": 32},
                "data": data,
                "training": {"epochs": epochs, "batch_size": 16},
                "export": {"saved_model": saved_model},
                "output_dir": output_dir or name,
                "search": {"training.learning_rate": rate, **search},
            }
        )
    )
    return path


def start_worker(recipe):
    return subprocess.Popen(
        # (a trial is failed when its heartbeat is 6 s old: a live worker on a busy 2-core
        # test machine can miss 2 s, and then the workers go the way of the stalled-worker test)
        [sys.executable, "-m", "bertkit.cli", "tune", str(recipe), "--heartbeat", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


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
    study = optuna.load_study(
        study_name="shared", storage=f"sqlite:///{files / 'shared.study' / 'study.db'}"
    )
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


def failed_trials(study):
    """The failed trials but the surplus ones (a worker stepping back, see tuning)."""
    return [t for t in study.trials if t.state.name == "FAIL" and not t.user_attrs.get("surplus")]


def test_a_trial_killed_with_kill_9_is_failed_and_run_again(workers):
    study, folder, killed_trial, _ = workers
    failed = failed_trials(study)
    (killed,) = [t for t in failed if t.user_attrs["run_dir"] == str(killed_trial)]
    for stopped in failed:  # the killed one, and any whose live worker looked stalled
        (retry,) = [t for t in complete_trials(study) if t.params == stopped.params]
        assert retry.number > stopped.number
        # the retry continued the stopped trial's run (from its checkpoint of epoch 1)
        assert retry.user_attrs["run_dir"] == stopped.user_attrs["run_dir"]
    assert RunDirectory(killed_trial).status() == "finished"


def test_the_best_trial_has_the_best_metric_and_trials_are_complete_runs(workers):
    study, folder, _, _ = workers
    accuracy = {}
    for trial in complete_trials(study):
        run = RunDirectory(trial.user_attrs["run_dir"])
        assert run.status() == "finished" and not run.saved_model_dir.exists()
        assert (
            yaml.safe_load(run.recipe_file.read_text())["training"]["learning_rate"]
            == (trial.params["training.learning_rate"])
        )
        accuracy[trial.number] = json.loads(run.metrics_file.read_text())["final"]["validation"][
            "accuracy"
        ]
        assert trial.value == accuracy[trial.number]
    assert study.best_value == max(accuracy.values())
    assert (folder / "best").resolve() == RunDirectory(study.best_trial.user_attrs["run_dir"]).path


def test_the_report_names_the_best_trial_and_shows_the_plots(workers):
    study, folder, _, _ = workers
    report = (folder / "report.md").read_text()
    best = study.best_trial
    assert f"## Best trial: {best.number}" in report
    run_dir = best.user_attrs["run_dir"]  # (a retry continues the stopped trial's folder)
    assert f"`{os.path.basename(run_dir)}/`" in report
    # no saved_model/ in the trials (export.saved_model: false)
    assert f"`bertkit export {run_dir} --out DIR` writes the model to ship" in report
    assert f"Trials: {TRIALS} complete, {len(failed_trials(study))} fail" in report
    for png in ("optimization_history.png", "param_importances.png"):
        assert f"]({png})" in report and (folder / png).stat().st_size > 1000


def test_pruning_stops_a_trial_whose_metric_falls_behind(files, capsys):
    recipe = write_recipe(files, "pruned", trials=3, pruner_startup_trials=2, saved_model=True)
    base = tuning.load_search_recipe(recipe)
    place = tuning.StudyPlace.of(base)
    study = tuning.open_study(place, base, None, create=True)
    rate = optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)
    for _ in range(2):  # two earlier trials far ahead at every epoch
        study.add_trial(
            optuna.trial.create_trial(
                params={"training.learning_rate": 1e-3},
                distributions={"training.learning_rate": rate},
                value=2.0,
                intermediate_values={1: 2.0, 2: 2.0},
            )
        )
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


def test_a_lora_search_trains_each_trial_with_its_rank(files):
    recipe = write_recipe(
        files, "lora", trials=2, epochs=1, pruner="none", seed=0, **{"training.lora.rank": [2, 4]}
    )
    study = tuning.tune(recipe, verbose=0)
    trials = complete_trials(study)
    assert len(trials) == 2
    for trial in trials:
        run = RunDirectory(trial.user_attrs["run_dir"])
        lora = json.loads((run.path / "model" / "task.json").read_text())["lora"]
        assert lora["rank"] == trial.params["training.lora.rank"]
        assert 0 < lora["trainable_weights"] < lora["weights"]
        assert (run.path / "model" / "lora.weights.h5").is_file()


class SigtermAt(keras.callbacks.Callback):
    """Sends this process SIGTERM as step `step` of the first epoch ends."""

    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if batch + 1 == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_a_preempted_trial_is_queued_again_and_continues_its_run(files, monkeypatch, capsys):
    from bertkit.training import trainer
    from bertkit.training.preemption import Preempted

    recipe = write_recipe(files, "preempted", trials=1, epochs=1)
    finetune = trainer.finetune
    monkeypatch.setattr(
        trainer,
        "finetune",
        lambda *args, callbacks=(), **kwargs: finetune(
            *args, callbacks=[*callbacks, SigtermAt(2)], **kwargs
        ),
    )
    with pytest.raises(Preempted, match="stopped by SIGTERM at epoch 1 step 2"):
        tuning.tune(recipe, verbose=0)
    base = tuning.load_search_recipe(recipe)
    study = tuning.open_study(tuning.StudyPlace.of(base), base, 60, create=False)
    stopped, queued = study.trials
    assert (stopped.state.name, queued.state.name) == ("FAIL", "WAITING")  # no heartbeat wait
    assert queued.params == stopped.params
    run = RunDirectory(stopped.user_attrs["run_dir"])
    assert run.status() == "running"

    monkeypatch.setattr(trainer, "finetune", finetune)
    capsys.readouterr()
    study = tuning.tune(recipe, verbose=0)  # the next `bertkit tune` of the study
    out = capsys.readouterr().out
    assert f"trial 1: continuing the stopped run {run.path}" in out
    (done,) = complete_trials(study)
    assert done.number == 1 and done.user_attrs["run_dir"] == str(run.path)
    assert run.status() == "finished"
    steps = json.loads(run.path.joinpath("steps.json").read_text())["steps"]
    assert [s["step"] for s in steps] == list(range(1, 5))  # 64 rows / 16: steps 3-4 resumed


def test_a_trial_failed_elsewhere_while_its_worker_ran_on_is_trained_once(
    files, monkeypatch, capsys
):
    # A worker stalled past the grace period (swapping, a long compile) while its trial
    # trained: another worker failed the trial and Optuna queued a retry. The stalled worker
    # finishes, Optuna refuses its result, and the retry takes the finished run's result.
    recipe = write_recipe(files, "stalled", trials=1, epochs=1)
    finetune, trained = tuning.Objective._finetune, []

    def finetune_and_be_found_stale(self, trial, values, run):
        trained.append(str(run.path))
        pruned_after = finetune(self, trial, values, run)
        study = trial.study  # what `fail_stale_trials` does in another worker:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        with pytest.warns(optuna.exceptions.ExperimentalWarning):
            retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1)
        retry(study, study.get_trials()[trial.number])
        return pruned_after

    monkeypatch.setattr(tuning.Objective, "_finetune", finetune_and_be_found_stale)
    study = tuning.tune(recipe, verbose=0)
    out = capsys.readouterr().out
    stalled, retry = study.trials
    assert (stalled.state.name, retry.state.name) == ("FAIL", "COMPLETE")
    assert trained == [stalled.user_attrs["run_dir"]] == [retry.user_attrs["run_dir"]]
    accuracy = json.loads(RunDirectory(trained[0]).metrics_file.read_text())["final"]
    assert retry.value == accuracy["validation"]["accuracy"]
    assert (
        "trial 0: another worker found its heartbeat stale and failed it; the trial queued "
        "in its place takes this run's result"
    ) in out
    assert f"trial 1: taking the result of the stopped run {trained[0]}" in out


def test_a_retry_waits_while_the_stopped_run_is_still_in_use(tmp_path, capsys):
    from bertkit.tuning.retries import stopped_run

    run = RunDirectory(tmp_path / "trial-0000")
    run.prepare("schema: 1\n", overwrite=False)
    retry = types.SimpleNamespace(number=1, user_attrs={"run_dir": str(run.path)})
    held, release = threading.Event(), threading.Event()

    def stalled_worker():
        with run.lock():
            held.set()
            release.wait(10)

    worker = threading.Thread(target=stalled_worker)
    worker.start()
    held.wait(10)
    threading.Timer(0.5, release.set).start()
    started = time.monotonic()
    assert stopped_run(retry, poll_seconds=0.05).path == run.path
    assert time.monotonic() - started >= 0.4
    worker.join()
    out = capsys.readouterr().out
    assert (
        f"the stopped run {run.path} is still in use by bertkit finetune (pid {os.getpid()}" in out
    )
    assert f"trial 1: continuing the stopped run {run.path}" in out
    assert stopped_run(types.SimpleNamespace(number=2, user_attrs={})) is None


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
    from bertkit.tuning.pruning import ReportToTrial

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
        'bertkit: error: hyperparameter search needs Optuna: pip install "bertkit[tune]"\n'
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--storage", "nosuchdb://x"], "nosuchdb://x: cannot open the storage"),
        (["--report"], "errors.study: no study here; run 'bertkit tune' first"),
    ],
)
def test_tune_user_errors_are_one_line(files, capsys, args, message):
    recipe = write_recipe(files, "errors")
    assert cli.main(["tune", str(recipe), *args]) == 2
    error = capsys.readouterr().err
    assert error.startswith("bertkit: error: ") and message in error and error.count("\n") == 1


def test_a_recipe_without_search_section_is_one_line(files, capsys):
    recipe = files / "plain.yaml"
    recipe.write_text(
        "schema: 1\ntask: classification\nbackbone: {preset: tiny}\ndata: {train: train.tsv}\n"
    )
    assert cli.main(["tune", str(recipe)]) == 2
    assert capsys.readouterr().err.startswith(
        f"bertkit: error: {recipe}: has no 'search' section; add one"
    )


# ---- a search that would never end, or end wrong (issue 28)

NO_VALIDATION = {"train": "train.tsv", "text": "sentence"}
NO_HELD_OUT = (
    "data.validation: hyperparameter search scores trials on a validation split, and "
    "the {task} task held none out of data.train{detail}; add data.validation"
)


def write_corpus(path, documents):
    path.write_text("\n\n".join(["john visited paris .\nit was quite funny ."] * documents) + "\n")
    return path.name


@pytest.fixture(scope="module")
def without_validation(files):
    """A classification recipe without data.validation; an MLM corpus of 5 documents, of
    which the default `validation_fraction` (0.05) holds out none."""
    mlm_data = {"train": write_corpus(files / "five_documents.txt", 5)}
    return {
        "classification": (write_recipe(files, "no_dev", data=NO_VALIDATION), ""),
        "mlm": (
            write_recipe(files, "no_held_out", task="mlm", data=mlm_data),
            " (5 examples, too few to hold some out)",
        ),
    }


@pytest.mark.parametrize("task", ["classification", "mlm"])
def test_tune_without_a_validation_split_ends_before_the_first_trial(
    without_validation, task, capsys
):
    recipe, detail = without_validation[task]
    started = time.monotonic()
    assert cli.main(["tune", str(recipe)]) == 2
    assert time.monotonic() - started < 10
    assert capsys.readouterr().err == (
        f"bertkit: error: {recipe}: {NO_HELD_OUT.format(task=task, detail=detail)}\n"
    )
    assert not recipe.with_suffix(".study").exists()  # no study, no trial


@pytest.mark.parametrize("task", ["classification", "mlm"])
def test_check_reports_a_search_without_a_validation_split(without_validation, task, capsys):
    recipe, detail = without_validation[task]
    assert cli.main(["check", str(recipe)]) == 2
    assert capsys.readouterr().err == (
        f"bertkit: error: {recipe}: {NO_HELD_OUT.format(task=task, detail=detail)}\n"
    )


def test_check_passes_a_search_with_a_validation_split(files, capsys):
    assert cli.main(["check", str(write_recipe(files, "checked"))]) == 0
    assert "search:" in capsys.readouterr().out


def test_a_trial_that_trains_but_cannot_be_scored_counts_as_a_failure(without_validation, capsys):
    """Such a trial once escaped `run_trials`' "3 trials in a row failed" and the search
    trained forever (`tune` now refuses the recipe first; the objective is given it here)."""
    recipe = without_validation["classification"][0]
    base = tuning.load_search_recipe(recipe)
    study = optuna.create_study(direction="maximize")
    objective = tuning.Objective(
        recipe, ["training.epochs=1"], base, recipe.with_suffix(".trials"), target=5, verbose=0
    )
    study.optimize(objective, n_trials=1, catch=(UserError,))
    message = (
        "data.validation: hyperparameter search scores trials on a validation split, "
        "and this trial's run had none; add data.validation"
    )
    assert str(objective.last_error) == message  # what run_trials counts
    assert study.trials[0].state.name == "FAIL"
    assert study.trials[0].user_attrs["error"] == message
    assert f"trial 0 failed: {message}" in capsys.readouterr().out


@pytest.fixture(scope="module")
def seeded(files):
    """A study with a seeded random sampler, extended by a second `tune` call."""
    recipe = write_recipe(files, "seeded", epochs=1, sampler="random", seed=0, pruner="none")
    tuning.tune(recipe, trials=1, verbose=0)
    study = tuning.tune(recipe, trials=2, verbose=0)
    return recipe, study


def test_a_seeded_study_draws_new_values_when_it_is_run_again(seeded):
    _, study = seeded
    rates = [t.params["training.learning_rate"] for t in complete_trials(study)]
    assert len(rates) == 2 and rates[0] != rates[1]


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_each_opening_of_a_seeded_study_samples_anew_and_reproducibly(files, tmp_path, sampler):
    recipe = write_recipe(files, f"reopened_{sampler}", sampler=sampler, seed=0)
    base = tuning.load_search_recipe(recipe)

    def draws(folder, openings=3):
        rates = []
        for _ in range(openings):  # each opening as a new `tune` call: one trial, then stop
            study = tuning.open_study(tuning.StudyPlace.of(base, folder), base, None, create=True)
            trial = study.ask()
            rates.append(base.search.suggest(trial)["training.learning_rate"])
            study.tell(trial, 0.5)
        return rates

    first = draws(tmp_path / "one")
    assert len(set(first)) == 3 and draws(tmp_path / "two") == first  # same seed, same study


def test_a_study_of_another_task_is_refused(files, seeded, capsys):
    corpus = write_corpus(files / "corpus.txt", 4)
    recipe = write_recipe(
        files, "mlm_search", task="mlm", data={"train": corpus, "validation": corpus}
    )
    folder = seeded[0].with_suffix(".study")
    assert cli.main(["tune", str(recipe), "--study", "seeded", "--output", str(folder)]) == 2
    assert capsys.readouterr().err == (
        f"bertkit: error: {recipe}: study 'seeded' maximizes accuracy of the classification "
        "task, and this recipe minimizes perplexity of the mlm task; start a new study with "
        "--study NAME or --output DIR\n"
    )
    assert len(seeded[1].trials) == len(
        optuna.load_study(study_name="seeded", storage=f"sqlite:///{folder / 'study.db'}").trials
    )


def test_on_a_shared_storage_study_names_differ_by_more_than_the_folder_name(files):
    url = f"sqlite:///{files / 'shared_storage.db'}"
    first, second = (
        tuning.load_search_recipe(write_recipe(files, name, output_dir=f"{name}/model"))
        for name in ("project_a", "project_b")
    )
    names = [tuning.StudyPlace.of(base, storage=url).name for base in (first, second)]
    assert names[0] != names[1] and all(name.startswith("model-") for name in names)
    assert tuning.StudyPlace.of(first, storage=url).name == names[0]  # the same each time
    assert tuning.StudyPlace.of(first, storage=url, study_name="mine").name == "mine"
    assert tuning.StudyPlace.of(first).name == "model"  # its own study.db: as before


@pytest.mark.parametrize(
    "rate, was_now",
    [
        ({"low": 1e-4, "high": 1e-2}, "was 0.0001..0.01 log, now 0.0001..0.01"),
        ([1e-3, 1e-2], "was 0.0001..0.01 log, now [0.001, 0.01]"),
    ],
)
def test_an_edited_search_section_names_the_changed_value(files, seeded, capsys, rate, was_now):
    recipe = write_recipe(files, "seeded_edited", output_dir="seeded", rate=rate)
    assert cli.main(["tune", str(recipe)]) == 2
    assert capsys.readouterr().err == (
        f"bertkit: error: {recipe}: search.training.learning_rate: changed since the study "
        f"began ({was_now}), and Optuna cannot continue the study with it; undo the change, "
        "or start a new study with --study NAME or --output DIR\n"
    )


def test_moved_bounds_continue_the_study(files, seeded):
    recipe = write_recipe(
        files, "seeded_wider", output_dir="seeded", rate={"low": 1e-5, "high": 1e-2, "log": True}
    )
    base = tuning.load_search_recipe(recipe)
    study = tuning.open_study(tuning.StudyPlace.of(base), base, None, create=True)
    assert len(study.trials) == len(seeded[1].trials)


def test_tune_output_naming_a_file_is_refused(files, capsys):
    existing = files / "notes.txt"
    existing.write_text("keep me\n")
    assert cli.main(["tune", str(write_recipe(files, "to_file")), "--output", str(existing)]) == 2
    assert capsys.readouterr().err == (
        f"bertkit: error: {existing}: is a file; the study folder (--output) must be a folder "
        "or new\n"
    )
    assert existing.read_text() == "keep me\n"


def write_foreign_sqlite(path):
    with contextlib.closing(sqlite3.connect(path)) as connection:
        connection.execute("CREATE TABLE notes (text TEXT)")
        connection.execute("INSERT INTO notes VALUES ('keep me')")
        connection.commit()


@pytest.mark.parametrize(
    "write, problem",
    [
        (
            write_foreign_sqlite,
            "is an SQLite database, but no Optuna study storage (its tables: notes)",
        ),
        (
            lambda path: path.write_text("keep me\n"),
            "is not an SQLite database (file is not a database)",
        ),
    ],
)
@pytest.mark.parametrize("report", [False, True])
def test_a_foreign_file_as_study_db_is_refused(files, tmp_path, capsys, write, problem, report):
    database = tmp_path / "study.db"
    write(database)
    before = database.read_bytes()
    args = ["tune", str(write_recipe(files, "foreign")), "--output", str(tmp_path)]
    assert cli.main(args + ["--report"] * report) == 2
    assert capsys.readouterr().err == (
        f"bertkit: error: {database}: {problem}; move it away, or give --output another "
        "folder (or --storage another file)\n"
    )
    assert database.read_bytes() == before and sorted(tmp_path.iterdir()) == [database]
