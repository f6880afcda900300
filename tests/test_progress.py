"""Progress on every long step (issue 20): lines in logs, per-step records, streaming predict."""

import json
import re
import sys

import pytest
import yaml

from bertkit.progress import Cadence, CountProgress
from bertkit.testing import run_bertkit, write_sentiment_tsv, write_tiny_checkpoint
from bertkit.training.step_callbacks import TrainingProgress

LINE = re.compile(
    r"^epoch (\d+)/2  step (\d+)/(\d+) \(\d+%\)  loss \d+\.\d{4}  lr \S+  "
    r"\d+\.\d seq/s  eta \d+:\d\d$"
)


def bertkit(*args, cwd=None, input=None):
    return run_bertkit(*args, cwd=cwd, input=input)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished tiny run of 2 epochs x 20 steps, trained by the CLI with stdout a file."""
    tmp_path = tmp_path_factory.mktemp("progress")
    write_tiny_checkpoint(tmp_path / "ckpt", num_layers=1, hidden_size=16, intermediate_size=32)
    write_sentiment_tsv(tmp_path / "train.tsv", 80, seed=0)
    write_sentiment_tsv(tmp_path / "dev.tsv", 12, seed=1)
    (tmp_path / "r.yaml").write_text(
        yaml.safe_dump(
            {
                "schema": 1,
                "task": "classification",
                "backbone": {"preset": "ckpt", "sequence_length": 16},
                "data": {"train": "train.tsv", "validation": "dev.tsv", "text": "sentence"},
                "training": {"epochs": 2, "batch_size": 4, "learning_rate": 1e-3},
                "export": {"saved_model": False},
                "output_dir": "run",
            }
        )
    )
    result = bertkit("finetune", "r.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return tmp_path, result


def test_finetune_to_a_log_prints_a_line_per_tenth_of_an_epoch(run):
    _, result = run
    lines = [LINE.match(line) for line in result.stdout.splitlines()]
    steps = [(int(m[1]), int(m[2])) for m in lines if m]
    assert steps == [(epoch, step) for epoch in (1, 2) for step in range(2, 21, 2)]
    assert {int(m[3]) for m in lines if m} == {20}
    assert "epoch 1: evaluating on the validation split" in result.stdout


def test_finetune_says_what_it_does_and_where_the_run_is(run):
    tmp_path, result = run
    assert f"loading the backbone {tmp_path / 'ckpt'}" in result.stdout
    assert "featurizing 80 training and 12 validation examples" in result.stdout
    assert result.stdout.splitlines()[-1].startswith(f"run written to {tmp_path / 'run'}")


def test_the_loss_and_learning_rate_are_recorded_per_step(run):
    tmp_path, _ = run
    steps = json.loads((tmp_path / "run" / "steps.json").read_text())["steps"]
    assert [s["step"] for s in steps] == list(range(1, 41))  # 20 steps an epoch: every step
    assert steps[-1]["progress"] == 2.0 and steps[0]["epoch"] == 1
    rates = [s["learning_rate"] for s in steps]
    assert max(rates) == pytest.approx(1e-3) and rates[-1] < rates[10]  # warmup, then decay


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_line_every_30_seconds_when_tenths_are_slow(capsys):
    clock = _Clock()
    progress = TrainingProgress(steps_per_epoch=1000, epochs=1, sequences_per_step=32, clock=clock)

    class Model:
        class optimizer:
            learning_rate = 1e-5

    progress.set_model(Model)
    progress.on_epoch_begin(0)
    for step in range(1, 60):
        clock.now = step * 10.0  # 10 s a step: 30 s come long before a tenth (100 steps)
        progress.on_train_batch_end(step - 1, {"loss": 1.0})
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[3] for line in lines[:3]] == ["3/1000", "6/1000", "9/1000"]
    assert "320 seq/s" not in lines[0] and "3.2 seq/s" in lines[0]
    assert "eta 2:46:10" in lines[0]


def test_cadence_is_a_tenth_or_30_seconds():
    clock = _Clock()
    cadence = Cadence(20, clock=clock)
    assert [step for step in range(1, 21) if cadence.due(step)] == list(range(2, 21, 2))


def test_count_progress_on_a_log(capsys):
    progress = CountProgress("predict", 50, stream=sys.stderr)
    for done in range(5, 51, 5):
        progress.update(done)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 10 and lines[-1].startswith("predict 50/50 (100%)")


def test_the_run_has_a_report_with_the_task_section_and_a_model_card(run):
    tmp_path, _ = run
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| 1 (best) |" in report or "| 2 (best) |" in report
    assert "## Per class" in report and "![confusion matrix](confusion_matrix.png)" in report
    assert "(40 points, in `steps.json`)" in report
    card = (tmp_path / "run" / "README.md").read_text()
    assert "| train | `train.tsv` | 80 |" in card and "| validation | `dev.tsv` | 12 |" in card
    for heading in (
        "## Base model",
        "## Training recipe",
        "## Metrics",
        "## Intended use",
        "## Limits",
    ):
        assert heading in card
    for name in ("learning_curve.png", "confusion_matrix.png", "misclassified.tsv"):
        assert (tmp_path / "run" / name).stat().st_size > 0
    header = (tmp_path / "run" / "misclassified.tsv").read_text().splitlines()[0]
    assert header == "text\ttext_pair\tgold\tpredicted\tscore"


# ---- predict and evaluate: what users of transformers and spaCy reach for


def test_predict_reads_a_column_with_top_k_and_progress_on_stderr(run):
    tmp_path, _ = run
    write_sentiment_tsv(tmp_path / "many.tsv", 100, seed=5)
    result = bertkit(
        "predict",
        "run",
        "--input",
        "many.tsv",
        "--column",
        "sentence",
        "--top-k",
        "2",
        "--batch-size",
        "8",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    predictions = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(predictions) == 100  # neither the header nor the gold label is predicted
    for p in predictions:
        assert [t["label"] for t in p["top_k"]][0] == p["label"] and len(p["top_k"]) == 2
        assert p["top_k"][0]["score"] >= p["top_k"][1]["score"]
    progress = result.stderr.splitlines()
    assert progress[-1].startswith("predict 100/100 (100%)") and len(progress) <= 13


def test_predict_pair_column_on_a_single_text_model_is_one_line(run):
    tmp_path, _ = run
    rows = [{"a": "good film", "b": "fine"}, {"a": "", "b": "x"}]
    (tmp_path / "pairs.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    result = bertkit(
        "predict",
        "run",
        "--input",
        "pairs.jsonl",
        "--column",
        "a",
        "--pair-column",
        "b",
        cwd=tmp_path,
    )
    assert result.returncode == 2 and result.stderr == (
        "bertkit: error: this model takes single texts: --pair-column does not apply\n"
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--column", "text"], "dev.tsv:2: missing column 'text' (columns: sentence, label)"),
        (["--pair-column", "label"], "--pair-column needs --column"),
        (["--output", "dev.tsv"], "dev.tsv: exists; pass --overwrite to replace it"),
    ],
)
def test_predict_option_errors_are_one_line(run, args, message):
    tmp_path, _ = run
    result = bertkit("predict", "run", "--input", "dev.tsv", *args, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr == f"bertkit: error: {message}\n"


def test_predict_column_on_stdin_needs_a_format(run):
    tmp_path, _ = run
    result = bertkit("predict", "run", "--column", "sentence", cwd=tmp_path, input="sentence\n")
    assert result.returncode == 2
    assert result.stderr == "bertkit: error: --column on stdin needs --format tsv, csv or jsonl\n"


def test_predict_output_file_and_overwrite(run):
    tmp_path, _ = run
    args = ["predict", "run", "--input", "dev.tsv", "--column", "sentence", "--output", "o.jsonl"]
    assert bertkit(*args, cwd=tmp_path).returncode == 0
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 12
    assert bertkit(*args, cwd=tmp_path).returncode == 2
    assert bertkit(*args, "--overwrite", cwd=tmp_path).returncode == 0
    assert not list(tmp_path.glob(".o.jsonl*"))


def test_predict_stream_yields_batches_in_order(run):
    import bertkit as api

    tmp_path, _ = run
    model = api.load(tmp_path / "run")
    texts = ["good film", "dull meal", None, "a lovely cast", "grim"]
    done = []
    streamed = list(
        model.predict_stream(texts, batch_size=2, errors="report", progress=done.append)
    )
    assert done == [2, 4, 5]
    assert streamed[2] == {"error": "input 3: empty input"}
    expected = model.predict(texts, errors="report")
    assert [p.get("label") for p in streamed] == [p.get("label") for p in expected]


def test_evaluate_writes_a_report_confusion_matrix_and_errors(run):
    tmp_path, _ = run
    result = bertkit("evaluate", "run", "--predictions-dir", "eval", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("accuracy: ")
    report = (tmp_path / "eval" / "report.md").read_text()
    assert report.startswith("# Evaluation on `") and "12 examples." in report
    assert "| label | precision | recall | F1 | support |" in report
    for name in ("metrics.json", "confusion_matrix.png", "misclassified.tsv"):
        assert (tmp_path / "eval" / name).exists(), name
