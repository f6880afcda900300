"""Regression end to end: recipe -> fit -> run directory -> predict -> SavedModel, the
targets' statistics kept in the model, and one-line errors for bad targets and inputs."""

import json
import random

import numpy as np
import pytest

import bertkit
from bertkit.errors import UserError
from bertkit.testing import (
    run_bertkit,
    run_task_contract_test,
    sentiment_sentences,
    serve_in_fresh_process,
    write_tiny_checkpoint,
)

TEXTS = [
    "The film was great.",
    "A dull and boring meal.",
    "Really lovely cast, funny story.",
    "Weak plot, grim ending.",
]


def write_scored_tsv(path, count: int, seed: int = 0):
    """`sentence\\tscore` rows: a positive sentence scores 3.5-5, a negative one 0-1.5,
    on a scale whose mean and spread the model must learn (not 0 and 1)."""
    rng = random.Random(seed)
    rows = ["sentence\tscore"]
    for sentence, label in sentiment_sentences(count, seed):
        low = 3.5 if label == "positive" else 0.0
        rows.append(f"{sentence}\t{low + 1.5 * rng.random():.3f}")
    path.write_text("\n".join(rows) + "\n")
    return path


def recipe(tmp_path, **changes):
    spec = {
        "schema": 1,
        "task": "regression",
        "backbone": {"preset": str(tmp_path / "ckpt"), "sequence_length": 48},
        "data": {
            "train": str(tmp_path / "train.tsv"),
            "validation": str(tmp_path / "dev.tsv"),
            "text": "sentence",
            "label": "score",
        },
        "training": {"epochs": 1, "batch_size": 16},
    }
    for section, values in changes.items():
        merge = isinstance(values, dict) and isinstance(spec[section], dict)
        spec[section] = {**spec[section], **values} if merge else values
    return spec


@pytest.fixture(scope="module")
def contract(tmp_path_factory):
    """The contract test, whose run (6 epochs on 240 rows) the other tests here read."""
    tmp_path = tmp_path_factory.mktemp("regression")
    write_scored_tsv(tmp_path / "train.tsv", 240, seed=0)
    write_scored_tsv(tmp_path / "dev.tsv", 60, seed=1)
    return tmp_path, run_task_contract_test(
        "regression",
        tmp_path / "train.tsv",
        data={"text": "sentence", "label": "score", "validation": str(tmp_path / "dev.tsv")},
        training={"epochs": 6, "batch_size": 16},
        sequence_length=48,
        directory=tmp_path,
        inputs=TEXTS,
        bad_input={"score": 1},
    )


def test_learns_the_targets_in_their_own_units(contract):
    tmp_path, result = contract
    scores = [p["score"] for p in result["predictions"]]
    assert scores[0] > 2.5 > scores[1] and scores[2] > 2.5 > scores[3], scores
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["monitor"] == "val_spearman"
    final = metrics["final"]["validation"]
    assert set(final) == {"spearman", "pearson", "mse", "mae"}
    # the order within a class is noise: knowing the class alone gives Spearman ~0.8
    assert final["spearman"] >= 0.7 and final["pearson"] >= 0.9, final
    assert final["mae"] < 1.0  # the scale is 0-5: a model stuck at the mean errs by ~2.2
    state = json.loads((tmp_path / "run" / "model" / "task.json").read_text())["state"]
    lines = (tmp_path / "train.tsv").read_text().splitlines()[1:]
    targets = [float(line.split("\t")[1]) for line in lines]
    assert state["target_mean"] == pytest.approx(np.mean(targets))
    assert state["target_std"] == pytest.approx(np.std(targets))


def test_the_saved_model_answers_in_the_targets_units(contract):
    _, result = contract  # the contract test served `TEXTS` in a fresh process
    expected = [p["score"] for p in result["predictions"]]
    np.testing.assert_allclose(result["served"]["score"], expected, atol=1e-4)


def test_the_report_and_the_cli(contract):
    tmp_path, result = contract
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## Errors by gold range" in report and "## The 10 largest errors" in report
    assert (tmp_path / "run" / "predictions.png").exists()
    predicted = run_bertkit("predict", tmp_path / "run", input="\n".join(TEXTS[:2]))
    assert predicted.returncode == 0, predicted.stderr
    scores = [json.loads(line)["score"] for line in predicted.stdout.splitlines()]
    np.testing.assert_allclose(scores, [p["score"] for p in result["predictions"][:2]], atol=1e-4)
    evaluated = run_bertkit("evaluate", tmp_path / "run")
    assert evaluated.returncode == 0 and evaluated.stdout.startswith("spearman: ")


def test_text_pairs_without_normalized_targets(tmp_path):
    write_tiny_checkpoint(tmp_path / "ckpt")
    rows = [
        {"a": f"the film was {w}", "b": f"it is {v}", "sim": 4.0 if w == v else 1}
        for w in ("good", "bad", "fine")
        for v in ("good", "bad", "fine")
    ] * 3
    for name in ("train.jsonl", "dev.jsonl"):
        (tmp_path / name).write_text("\n".join(json.dumps(r) for r in rows))
    spec = recipe(
        tmp_path,
        task={"name": "regression", "normalize_targets": False},
        data={
            "train": str(tmp_path / "train.jsonl"),
            "validation": str(tmp_path / "dev.jsonl"),
            "text": "a",
            "text_pair": "b",
            "label": "sim",
        },
    )
    model = bertkit.finetune(spec, output_dir=tmp_path / "run", verbose=0)
    assert model.task.state == {"target_mean": 0.0, "target_std": 1.0}
    pairs = [("the film was good", "it is good"), ("a meal", "it is bad")]
    expected = [p["score"] for p in model.predict(pairs)]
    served = serve_in_fresh_process(
        tmp_path / "run" / "saved_model",
        {"text": [p[0] for p in pairs], "text_pair": [p[1] for p in pairs]},
    )
    np.testing.assert_allclose(served["score"], expected, atol=1e-4)
    with pytest.raises(UserError, match="this model reads text pairs"):
        model.predict(["one text"])


@pytest.mark.parametrize(
    "cell, message",
    [
        ("high", "train.tsv:3: score: expected a number as the target, got 'high'"),
        ("nan", "train.tsv:3: score: expected a number as the target, got 'nan'"),
    ],
)
def test_a_non_numeric_target_is_one_line_exit_2(tmp_path, cell, message):
    write_tiny_checkpoint(tmp_path / "ckpt")
    (tmp_path / "train.tsv").write_text(f"sentence\tscore\ngood\t1.5\nbad\t{cell}\n")
    (tmp_path / "dev.tsv").write_text("sentence\tscore\ngood\t1\n")
    (tmp_path / "r.yaml").write_text(json.dumps(recipe(tmp_path)))
    result = run_bertkit("finetune", tmp_path / "r.yaml", "--output", tmp_path / "run")
    assert result.returncode == 2 and result.stderr.strip().endswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_targets_that_are_all_one_value_are_refused(tmp_path):
    write_tiny_checkpoint(tmp_path / "ckpt")
    (tmp_path / "train.tsv").write_text("sentence\tscore\ngood\t2\nbad\t2.0\n")
    (tmp_path / "dev.tsv").write_text("sentence\tscore\ngood\t1\n")
    with pytest.raises(UserError, match="score: every training target is 2: there is nothing"):
        bertkit.finetune(recipe(tmp_path), output_dir=tmp_path / "run", verbose=0)
