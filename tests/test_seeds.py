"""`training.seeds: N` (bertkit.training.seeds): N ordinary runs, their mean ± sd, one kept
model, failed seeds flagged, resumed at the seed it stopped."""

import json
import os
import statistics

import keras
import pytest

import bertkit
from bertkit.cli import main
from bertkit.errors import UserError
from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint
from bertkit.training import run_steps
from bertkit.training.seeds import failed_seed_line, kept_seed, mean_and_sd
from bertkit_tasks.classification.task import ClassificationTask, TextExample


def recipe(folder, **training):
    return {
        "schema": 1,
        "task": "classification",
        "backbone": {"preset": str(folder / "ckpt"), "sequence_length": 16},
        "data": {
            "train": str(folder / "train.tsv"),
            "validation": str(folder / "dev.tsv"),
            "text": "sentence",
        },
        "training": {"epochs": 1, "batch_size": 8, "learning_rate": 1e-3, "seeds": 2, **training},
        "output_dir": str(folder / "run"),
    }


class CountFits(keras.callbacks.Callback):
    """Counts `fit` calls (one per seed trained); with `stop_at`, a kill -9 stand-in at
    the start of that one."""

    def __init__(self, stop_at=None):
        super().__init__()
        self.fits, self.stop_at = 0, stop_at

    def on_train_begin(self, logs=None):
        self.fits += 1
        if self.fits == self.stop_at:
            raise SystemExit("killed")


def stub_export(run, finetuned, export=None):  # a SavedModel export takes longer than the two seeds
    run.saved_model_dir.mkdir()
    (run.saved_model_dir / "saved_model.pb").write_text("stub")


@pytest.fixture(scope="module")
def seeds_run(tmp_path_factory):
    """Two seeds, killed at the start of the second, then run again to the end; every
    seed flagged by a baseline no model reaches."""
    folder = tmp_path_factory.mktemp("seeds")
    write_tiny_checkpoint(folder / "ckpt", num_layers=1, hidden_size=16, intermediate_size=32)
    write_sentiment_tsv(folder / "train.tsv", 32, seed=0)
    write_sentiment_tsv(folder / "dev.tsv", 8, seed=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run_steps, "export_run", stub_export)
        patch.setattr(ClassificationTask, "baseline", lambda self, examples: (1.0, "unreachable"))
        with pytest.raises(SystemExit):
            bertkit.finetune(recipe(folder), verbose=0, callbacks=[CountFits(stop_at=2)])
        killed = {
            name: json.loads((folder / "run" / name).read_text())
            for name in ("run.json", "metrics.json")
        }
        rerun = CountFits()
        model = bertkit.finetune(recipe(folder), verbose=0, callbacks=[rerun])
    return folder / "run", killed, rerun.fits, model


def read(run, name):
    return json.loads((run / name).read_text())


def test_a_killed_seeds_run_resumes_at_the_seed_it_stopped(seeds_run):
    run, killed, fits_after_kill, _ = seeds_run
    assert killed["run.json"]["status"] == "running"
    assert [entry["seed"] for entry in killed["metrics.json"]["seeds"]] == [42]
    assert fits_after_kill == 1  # seed 42 had finished: skipped
    assert read(run / "seeds" / "seed-42", "run.json")["status"] == "finished"
    assert read(run, "run.json")["status"] == "finished"
    assert read(run, "run.json")["seeds"] == [42, 43]


def test_the_aggregate_is_the_mean_and_sample_sd_of_the_seeds(seeds_run):
    run = seeds_run[0]
    metrics = read(run, "metrics.json")
    finals = [read(run / "seeds" / f"seed-{seed}", "metrics.json")["final"] for seed in (42, 43)]
    assert [entry["seed"] for entry in metrics["seeds"]] == [42, 43]
    assert metrics["seeds"][1]["validation"] == finals[1]["validation"]
    for name in ("accuracy", "macro_f1"):
        values = [final["validation"][name] for final in finals]
        assert metrics["mean"]["validation"][name] == pytest.approx(statistics.mean(values))
        assert metrics["sd"]["validation"][name] == pytest.approx(
            statistics.stdev(values), abs=1e-6
        )
    accuracy = [final["validation"]["accuracy"] for final in finals]
    worse = 43 if accuracy[0] == accuracy[1] else (42 if accuracy[0] < accuracy[1] else 43)
    assert metrics["kept_seed"] == worse  # the median of two: the worse one


def test_the_kept_seed_is_the_run_s_model(seeds_run):
    run, _, _, model = seeds_run
    kept = run / "seeds" / f"seed-{read(run, 'metrics.json')['kept_seed']}"
    for path in ("model/model.weights.h5", "model/task.json", "saved_model/saved_model.pb"):
        assert (
            os.path.samefile(run / path, kept / path)
            or (run / path).read_bytes() == (kept / path).read_bytes()
        )
    assert model.run.path == run
    assert bertkit.load(run).predict(["What a delight."])[0]["label"] in ("positive", "negative")


def test_failed_seeds_are_flagged_in_one_line(seeds_run, capsys):
    run = seeds_run[0]
    metrics = read(run, "metrics.json")
    assert len(metrics["failed_seeds"]) == 2
    assert metrics["failed_seeds"][0].startswith("seed 42: val_accuracy 0.")
    assert metrics["failed_seeds"][0].endswith(
        " is below the unreachable baseline 1.000; it did not learn"
    )
    report = (run / "report.md").read_text()
    assert "## Mean ± sd over 2 seeds" in report and "| mean ± sd |" in report
    assert metrics["failed_seeds"][1] in report and (run / "learning_curve.png").exists()
    card = (run / "README.md").read_text()
    assert card.startswith("# run: a bertkit classification model (seed 4")
    assert "median of 2 seeds)" in card.splitlines()[0]
    assert "## Seeds" in card and " ± " in card


def test_failed_seed_line_and_baselines():
    assert failed_seed_line(44, 0.5, (0.5, "majority-class"), "accuracy", "max") == (
        "seed 44: val_accuracy 0.500 is at the majority-class baseline 0.500; it did not learn"
    )
    assert failed_seed_line(44, 0.51, (0.5, "majority-class"), "accuracy", "max") is None
    assert failed_seed_line(44, 0.9, None, "accuracy", "max") is None
    examples = [TextExample("a", label=label) for label in ["x", "y", "y", "y"]]
    task = ClassificationTask(ClassificationTask.Options(), ClassificationTask.Data(), None, 8)
    assert task.baseline(examples) == (0.75, "majority-class")
    assert bertkit.Task(None, None, None, 8).baseline(examples) is None


def test_kept_seed_median_or_best_and_mean_sd():
    entries = [{"seed": s, "validation": {"f1": v}} for s, v in [(42, 0.7), (43, 0.9), (44, 0.8)]]
    assert kept_seed(entries, "f1", "max", "median") == 44
    assert kept_seed(entries, "f1", "max", "best") == 43
    assert kept_seed(entries, "loss", "min", "best") == 42  # no such metric: the first
    mean, sd = mean_and_sd(
        [
            {"validation": {"f1": 0.5, "counts": {}}, "test": {"f1": 1.0}},
            {"validation": {"f1": 0.7, "counts": {}}, "test": {"f1": 0.0}},
        ]
    )
    assert mean == {"validation": {"f1": 0.6}, "test": {"f1": 0.5}}
    assert sd["validation"]["f1"] == pytest.approx(0.141421, abs=1e-6)


@pytest.mark.parametrize(
    "training, message",
    [
        ({"seeds": 0}, "training.seeds: must be at least 1, got 0"),
        ({"seeds": 101}, "training.seeds: must be at most 100, got 101"),
        ({"keep_seed": "mean"}, "training.keep_seed: expected one of 'median', 'best', got 'mean'"),
    ],
)
def test_recipe_errors_name_the_key(tmp_path, training, message):
    with pytest.raises(UserError, match=message):
        bertkit.load_recipe(recipe(tmp_path, **training))


def test_seeds_past_the_largest_seed_are_refused(tmp_path):
    from bertkit.training.seeds import seed_values

    training = bertkit.load_recipe(recipe(tmp_path, seed=2**32 - 1)).training
    with pytest.raises(UserError, match="training.seeds: seeds from 4294967295 to 4294967296"):
        seed_values(training)


def test_cli_seeds_overrides_the_recipe(tmp_path, capsys):
    (tmp_path / "r.yaml").write_text(
        "schema: 1\ntask: classification\nbackbone: {preset: x}\ndata: {train: t.tsv}\n"
    )
    assert main(["finetune", str(tmp_path / "r.yaml"), "--seeds", "0"]) == 2
    assert capsys.readouterr().err == (
        "bertkit: error: --set: training.seeds: must be at least 1, got 0\n"
    )


def test_tune_scores_a_seeds_trial_by_its_mean(tmp_path):
    from bertkit.run_dir import RunDirectory
    from bertkit.tuning.tuner import Objective

    (tmp_path / "metrics.json").write_text(
        json.dumps({"seeds": [], "mean": {"validation": {"accuracy": 0.75}}, "sd": {}})
    )
    objective = Objective.__new__(Objective)
    objective.monitor = "accuracy"
    assert objective._final_value(RunDirectory(tmp_path)) == 0.75
