"""int8 export behind the quality gate (bertkit/serving/quantize.py): the recipe's
`export.quantize` writes an int8 SavedModel that answers in a fresh process as the
quantized Keras model does; `bertkit export --quantize int8` refuses, in one line and
writing nothing, a model that loses more than its budget; bad options are one line."""

import json

import numpy as np
import pytest

import bertkit
from bertkit.cli import main
from bertkit.errors import UserError
from bertkit.recipes.recipe import load_recipe
from bertkit.registry import load_task
from bertkit.serving import quantize
from bertkit.testing import serve_in_fresh_process, write_sentiment_tsv, write_tiny_checkpoint

TEXTS = ["a warm , funny film", "the plot was dull and cold", "good", "really awful ending"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("int8")
    write_tiny_checkpoint(tmp / "ckpt")
    write_sentiment_tsv(tmp / "train.tsv", 160, seed=0)
    write_sentiment_tsv(tmp / "dev.tsv", 40, seed=1)
    recipe = {
        "schema": 1,
        "task": "classification",
        "backbone": {"preset": str(tmp / "ckpt"), "sequence_length": 16},
        "data": {
            "train": str(tmp / "train.tsv"),
            "validation": str(tmp / "dev.tsv"),
            "text": "sentence",
        },
        "training": {"epochs": 6, "batch_size": 16, "learning_rate": 3e-3, "jit_compile": False},
        "export": {"quantize": "int8", "saved_model": False},  # int8 only
        "output_dir": str(tmp / "run"),
    }
    bertkit.finetune(load_recipe(recipe), verbose=0)
    return tmp / "run"


def test_recipe_export_writes_an_int8_saved_model_within_budget(run):
    record = json.loads((run / "saved_model_int8/assets/bertkit.json").read_text())["quantization"]
    in_run = json.loads((run / quantize.RECORD_FILE).read_text())
    assert in_run == {**record, "saved_model": str(run / "saved_model_int8")}
    assert record["monitor"] == "accuracy" and record["budget_points"] == 0.5
    assert record["float"]["accuracy"] >= 0.7  # a model that learned: flipped, it loses
    assert record["drop_points"] <= 0.5 and record["latency_requests"] == 200
    assert record["int8"]["size_bytes"] > 0 and record["int8"]["latency_p50_ms"] > 0
    assert record["float"]["size_bytes"] > 0 and record["float"]["latency_p50_ms"] > 0
    assert not (run / "saved_model").exists()  # the gate measured a float export of its own
    assert "points lost" in quantize.describe(run / "saved_model_int8")

    int8 = quantize.quantized(bertkit.load(run))
    served = serve_in_fresh_process(run / "saved_model_int8", {"text": TEXTS})
    predicted = int8.predict(TEXTS)
    assert served["label"] == [p["label"] for p in predicted]
    expected = [[p["probabilities"][name] for name in int8.task.labels] for p in predicted]
    np.testing.assert_allclose(served["probabilities"], expected, atol=1e-5)


def test_export_refuses_in_one_line_an_int8_model_over_budget(run, tmp_path, capsys, monkeypatch):
    quantized = quantize.quantized

    def losing(finetuned, mode="int8"):
        """The int8 model with its logits negated: with two classes, every answer flips."""
        model = quantized(finetuned, mode)
        head = model.model.get_layer("classifier")
        head.kernel_scale.assign(-head.kernel_scale)
        head.bias.assign(-head.bias)
        return model

    monkeypatch.setattr(quantize, "quantized", losing)
    out = tmp_path / "int8"
    assert main(["export", str(run), "--out", str(out), "--quantize", "int8"]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1, error
    assert "int8 export refused: validation accuracy " in error
    assert "(float) -> " in error and "over the budget of 0.5" in error
    assert list(tmp_path.iterdir()) == []  # nothing written, no staging folder left


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--quantize", "int4"], "invalid choice: 'int4'"),
        (["--quantize", "int8", "--max-drop", "-1"], "at least 0, got '-1'"),
        (["--quantize", "int8", "--max-drop", "nan"], "at least 0, got 'nan'"),
        (["--max-drop", "1"], "--max-drop applies to --quantize int8 only"),
    ],
)
def test_bad_quantize_options_are_one_line(arguments, message, tmp_path, capsys):
    out = tmp_path / "out"
    try:
        status = main(["export", str(tmp_path / "no-run"), "--out", str(out), *arguments])
    except SystemExit as exit:  # argparse's own errors
        status = exit.code
    error = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and message in error[-1] and not out.exists()


def test_budgets_are_points_of_each_task_monitor():
    classification, span_qa, mlm = map(load_task, ("classification", "span_qa", "mlm"))
    assert quantize.quality_budget(classification) == 0.5
    assert quantize.quality_budget(span_qa) == 1.0 and quantize.quality_budget(span_qa, 3) == 3
    assert quantize.metric_drop(classification, 0.91, 0.9) == pytest.approx(1.0)
    assert quantize.metric_drop(span_qa, 88.0, 87.5) == pytest.approx(0.5)
    quantize.check_quality(span_qa, 88.0, 87.5, 1.0)
    with pytest.raises(UserError, match=r"f1 88.00 \(float\) -> 86.00 \(int8\), 2.00 points"):
        quantize.check_quality(span_qa, 88.0, 86.0, 1.0)
    with pytest.raises(UserError, match="the mlm task offers no int8 export"):
        quantize.quality_budget(mlm)


def test_recipe_export_section_is_checked():
    recipe = {
        "schema": 1,
        "task": "mlm",
        "backbone": {"preset": "bert_tiny_en_uncased"},
        "data": {"train": "corpus.txt"},
    }
    with pytest.raises(UserError, match="export.quantize: the mlm task offers no int8 export"):
        load_recipe({**recipe, "export": {"quantize": "int8"}})
    with pytest.raises(UserError, match="export.max_metric_drop: must be at least 0.0"):
        load_recipe({**recipe, "task": "tagging", "export": {"max_metric_drop": -1}})
    with pytest.raises(UserError, match="export.saved_model: "):
        load_recipe({**recipe, "task": "tagging", "export": {"saved_model": "no"}})
