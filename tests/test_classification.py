"""Classification end to end: recipe -> fit -> run directory -> predict -> SavedModel."""

import json

import numpy as np
import pytest

import bertkit
from bertkit.errors import UserError
from bertkit.testing import (
    run_bertkit,
    run_task_contract_test,
    serve_in_fresh_process,
    write_sentiment_tsv,
    write_tiny_checkpoint,
)

TEXTS = [
    "The film was great.",
    "A dull and boring meal.",
    "Really lovely cast, funny story.",
    "Weak plot, grim ending.",
]


def recipe(tmp_path, **data):
    return {
        "schema": 1,
        "task": "classification",
        "backbone": {"preset": str(tmp_path / "ckpt"), "sequence_length": 48},
        "data": {
            "train": str(tmp_path / "train.tsv"),
            "validation": str(tmp_path / "dev.tsv"),
            "text": "sentence",
            **data,
        },
        "training": {"epochs": 4, "batch_size": 16, "learning_rate": 3e-3},
    }


@pytest.fixture(scope="module")
def contract(tmp_path_factory):
    """The task's contract test, whose run (6 epochs on 240 rows, a validation split) the
    other tests here read: one training and export for all."""
    tmp_path = tmp_path_factory.mktemp("classification")
    write_sentiment_tsv(tmp_path / "train.tsv", 240, seed=0)
    write_sentiment_tsv(tmp_path / "dev.tsv", 60, seed=1)
    return tmp_path, run_task_contract_test(
        "classification",
        tmp_path / "train.tsv",
        data={"text": "sentence", "validation": str(tmp_path / "dev.tsv")},
        training={"epochs": 6, "batch_size": 16},
        sequence_length=48,
        directory=tmp_path,
        inputs=TEXTS,
        bad_input={"label": 1},
    )


@pytest.fixture(scope="module")
def run(contract):
    """(its folder, the trained model's predictions of `TEXTS`)."""
    tmp_path, result = contract
    return tmp_path, result["predictions"]


def test_passes_the_contract_test(contract):
    _, result = contract
    assert [p["label"] for p in result["predictions"]] == ["positive", "negative"] * 2


def test_learns_and_writes_the_run_directory(run):
    tmp_path, _ = run
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["monitor"] == "val_accuracy" and len(metrics["epochs"]) == 6
    assert metrics["epochs"][-1]["loss"] < metrics["epochs"][0]["loss"]
    final = metrics["final"]["validation"]
    assert final["accuracy"] >= 0.8 and set(final) == {"accuracy", "macro_f1", "mcc"}
    best = max(e["val_accuracy"] for e in metrics["epochs"])
    assert final["accuracy"] == pytest.approx(best)  # the best epoch's weights were kept
    for name in (
        "recipe.yaml",
        "report.md",
        "learning_curve.png",
        "run.json",
        "logs",
        "saved_model/saved_model.pb",
        "model/model.weights.h5",
        "model/vocab.txt",
    ):
        assert (tmp_path / "run" / name).exists(), name
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "finished"


def test_the_kept_model_file_has_no_optimizer_state(run):
    tmp_path, _ = run
    import h5py

    with h5py.File(tmp_path / "run" / "model" / "model.weights.h5", "r") as weights:
        assert "optimizer" not in weights and "layers" in weights
    assert not (tmp_path / "run" / "checkpoint").exists()  # training's backup is removed


def test_tensorboard_logs_the_recorded_steps(run):
    tmp_path, _ = run
    from tensorboard.backend.event_processing.event_accumulator import TENSORS, EventAccumulator

    logs = EventAccumulator(
        str(tmp_path / "run" / "logs" / "train"), size_guidance={TENSORS: 0}
    ).Reload()  # 0: every event, no sample
    records = json.loads((tmp_path / "run" / "steps.json").read_text())["steps"]
    steps = [event.step for event in logs.Tensors("batch_loss")]
    assert steps and steps == [record["step"] for record in records]
    assert [e.step for e in logs.Tensors("batch_learning_rate")] == steps


def test_loaded_model_predicts_like_the_trained_one(run):
    tmp_path, trained = run
    loaded = bertkit.load(tmp_path / "run")
    predictions = loaded.predict(TEXTS)
    assert [p["label"] for p in predictions] == [p["label"] for p in trained]
    assert [p["label"] for p in predictions] == ["positive", "negative", "positive", "negative"]
    assert all(abs(sum(p["probabilities"].values()) - 1) < 1e-6 for p in predictions)
    assert loaded.evaluate()["accuracy"] >= 0.8


def test_saved_model_in_a_fresh_process_matches_predict(contract):
    _, result = contract  # the contract test served `TEXTS` in a fresh process
    served, expected = result["served"], result["predictions"]
    assert served["label"] == [p["label"] for p in expected]
    np.testing.assert_allclose(
        served["probabilities"], [list(p["probabilities"].values()) for p in expected], atol=1e-5
    )
    assert served["label_names"][0] == ["negative", "positive"]


def test_cli_predict_evaluate_and_no_overwrite(run):
    tmp_path, _ = run
    predicted = run_bertkit("predict", tmp_path / "run", input="\n".join(TEXTS))
    assert predicted.returncode == 0, predicted.stderr
    assert [json.loads(line)["label"] for line in predicted.stdout.splitlines()] == [
        "positive",
        "negative",
        "positive",
        "negative",
    ]
    evaluated = run_bertkit("evaluate", tmp_path / "run")
    assert evaluated.returncode == 0, evaluated.stderr
    assert evaluated.stdout.startswith("accuracy: ")
    saved = json.loads((tmp_path / "run" / "evaluation" / "metrics.json").read_text())
    printed = evaluated.stdout.split()[1]
    assert f"{saved['metrics']['accuracy']:.4f}" == printed
    exported = run_bertkit("export", tmp_path / "run", "--out", tmp_path / "exported")
    assert exported.returncode == 0, exported.stderr
    assert serve_in_fresh_process(tmp_path / "exported", {"text": TEXTS[:1]})["label"] == [
        "positive"
    ]
    again = run_bertkit("export", tmp_path / "run", "--out", tmp_path / "exported")
    assert again.returncode == 2 and "export folder exists and is not empty" in again.stderr
    (tmp_path / "r.yaml").write_text(
        json.dumps({**recipe(tmp_path), "output_dir": str(tmp_path / "run")})
    )
    before = (tmp_path / "run" / "model" / "model.weights.h5").read_bytes()
    refused = run_bertkit("finetune", tmp_path / "r.yaml")
    assert refused.returncode == 2
    assert refused.stderr.strip().endswith(
        "holds a finished run; pass --overwrite "
        "(overwrite=True) to replace it, or choose another "
        "output folder"
    )
    assert len(refused.stderr.strip().splitlines()) == 1
    assert (tmp_path / "run" / "model" / "model.weights.h5").read_bytes() == before


def test_sentence_pairs_from_jsonl_with_listed_labels(tmp_path):
    write_tiny_checkpoint(tmp_path / "ckpt")
    rows = [
        {
            "premise": f"the film was {w}",
            "hypothesis": f"it is {w}",
            "label": "yes" if i % 2 else "no",
        }
        for i, w in enumerate(["good", "bad"] * 12)
    ]
    for name in ("train.jsonl", "dev.jsonl"):
        (tmp_path / name).write_text("\n".join(json.dumps(r) for r in rows))
    spec = recipe(tmp_path, text="premise", text_pair="hypothesis")
    spec["data"].update(train=str(tmp_path / "train.jsonl"), validation=str(tmp_path / "dev.jsonl"))
    spec["task"] = {"name": "classification", "labels": ["yes", "no", "maybe"]}
    spec["training"]["epochs"] = 1
    model = bertkit.finetune(spec, output_dir=tmp_path / "run", verbose=0)
    pairs = [("the film was good", "it is good"), ("a meal", "it is bad")]
    expected = model.predict(pairs)
    assert list(expected[0]["probabilities"]) == ["yes", "no", "maybe"]
    served = serve_in_fresh_process(
        tmp_path / "run" / "saved_model",
        {"text": [p[0] for p in pairs], "text_pair": [p[1] for p in pairs]},
    )
    assert served["label"] == [p["label"] for p in expected]
    np.testing.assert_allclose(served["score"], [p["score"] for p in expected], atol=1e-5)


def test_data_errors_name_file_and_line(tmp_path):
    write_tiny_checkpoint(tmp_path / "ckpt")  # the files exist: their content is wrong
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\n")
    (tmp_path / "train.tsv").write_text("sentence\tlabel\ngood film\tpositive\nbad\n")
    spec = recipe(tmp_path)
    with pytest.raises(
        UserError,
        match=r"train.tsv:3: expected 2 fields \(sentence, label\), "
        r"found 1",
    ):
        bertkit.finetune(spec, output_dir=tmp_path / "run", verbose=0)
    assert not (tmp_path / "run").exists()  # no half-made run directory is left behind
    (tmp_path / "train.tsv").write_text("text\tlabel\ngood film\tpositive\n")
    with pytest.raises(
        UserError,
        match=r"train.tsv:2: sentence: missing column 'sentence' "
        r"\(columns: text, label\)",
    ):
        bertkit.finetune(spec, output_dir=tmp_path / "run2", verbose=0)
    (tmp_path / "train.tsv").write_text(
        "sentence\tlabel\ngood film\tpositive\nbad film\tnegative\n"
    )
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\ngood film\tpositive\nok\tmeh\n")
    with pytest.raises(
        UserError,
        match=r"dev.tsv:3: label: unknown label 'meh'; the model "
        r"knows: negative, positive",
    ):
        bertkit.finetune(spec, output_dir=tmp_path / "run3", verbose=0)


def test_csv_files_with_quoted_commas(tmp_path):
    from bertkit.tabular import read_rows

    (tmp_path / "d.csv").write_text('text,label\n"good, warm film",pos\nbad,neg\n')
    assert list(read_rows(tmp_path / "d.csv", "csv", ["text", "label"])) == [
        (2, {"text": "good, warm film", "label": "pos"}),
        (3, {"text": "bad", "label": "neg"}),
    ]
