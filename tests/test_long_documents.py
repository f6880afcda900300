"""Long documents in classification (`task.long_text: windows`): each window a row, the
document's logits combined from its windows', the same in `predict` and the SavedModel; and
one-line errors for a document over `max_windows`, text pairs and a stride too long."""

import json
import random

import numpy as np
import pytest

import bertkit
from bertkit.errors import UserError
from bertkit.testing import (
    run_bertkit,
    run_task_contract_test,
    serve_in_fresh_process,
    write_tiny_checkpoint,
)
from bertkit.testing.tiny import FILLER, NEGATIVE, POSITIVE

SEQUENCE_LENGTH = 16  # windows of 14 word pieces


def late_cue_documents(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """(document, label): 16-20 filler words, then the one word that gives the label, so
    that a model reading only the first 14 word pieces cannot know it."""
    rng = random.Random(seed)
    documents = []
    for i in range(count):
        label = "positive" if i % 2 == 0 else "negative"
        words = [rng.choice(FILLER[:20]) for _ in range(rng.randint(16, 20))]
        words.append(rng.choice(POSITIVE if label == "positive" else NEGATIVE))
        documents.append((" ".join(words), label))
    return documents


def write_documents(path, count: int, seed: int = 0):
    rows = ["text\tlabel"] + [f"{text}\t{label}" for text, label in late_cue_documents(count, seed)]
    path.write_text("\n".join(rows) + "\n")
    return path


def recipe(tmp_path, **task):
    return {
        "schema": 1,
        "task": {"name": "classification", **task},
        "backbone": {"preset": str(tmp_path / "ckpt"), "sequence_length": SEQUENCE_LENGTH},
        "data": {"train": str(tmp_path / "train.tsv"), "validation": str(tmp_path / "dev.tsv")},
        "training": {"epochs": 12, "batch_size": 16, "learning_rate": 1e-3},
    }


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("long_documents")
    write_tiny_checkpoint(tmp_path / "ckpt")
    write_documents(tmp_path / "train.tsv", 160, seed=0)
    write_documents(tmp_path / "dev.tsv", 40, seed=1)
    return tmp_path


def test_the_contract_with_windows(tmp_path):
    write_documents(tmp_path / "train.tsv", 48)
    texts = [text for text, _ in late_cue_documents(3, seed=5)] + ["good"]
    result = run_task_contract_test(
        "classification",
        tmp_path / "train.tsv",
        task_options={"long_text": "windows", "window_stride": 5, "window_aggregation": "max"},
        sequence_length=SEQUENCE_LENGTH,
        directory=tmp_path,
        inputs=texts,
        bad_input={"sentence": "no text key"},
    )
    assert {"token_ids", "segment_ids", "example_index"} <= set(result["preprocessor"])
    features = json.loads((tmp_path / "run" / "model" / "task.json").read_text())
    assert features["options"]["long_text"] == "windows"


def validation_accuracy(run_dir) -> float:
    return json.loads((run_dir / "metrics.json").read_text())["final"]["validation"]["accuracy"]


def test_windows_read_what_truncation_cuts_off(documents):
    spec = recipe(documents, long_text="windows")
    bertkit.finetune(spec, output_dir=documents / "windows", verbose=0)
    accuracy = validation_accuracy(documents / "windows")
    assert accuracy >= 0.85, accuracy  # 0.925 when written; the windows without the cue are noise
    bertkit.finetune(recipe(documents), output_dir=documents / "truncate", verbose=0)
    # the cue is past the first 14 pieces: truncation leaves nothing to learn from
    assert validation_accuracy(documents / "truncate") <= 0.7


def test_predict_and_the_saved_model_combine_the_windows(documents):
    spec = recipe(documents, long_text="windows", window_stride=4, max_windows=5)
    spec["training"]["epochs"] = 2
    model = bertkit.finetune(spec, output_dir=documents / "served", verbose=0)
    texts = [text for text, _ in late_cue_documents(4, seed=7)] + ["a good film"]
    expected = model.predict(texts)
    predicted = run_bertkit("predict", documents / "served", input="\n".join(texts))
    assert predicted.returncode == 0, predicted.stderr
    got = [json.loads(line) for line in predicted.stdout.splitlines()]
    assert [p["label"] for p in got] == [p["label"] for p in expected]
    np.testing.assert_allclose([p["score"] for p in got], [p["score"] for p in expected], atol=1e-4)
    rows = model.task.featurize([model.task.parse_input(t) for t in texts], training=False)
    # 17-21 words of one piece each: 2-3 windows of 14 pieces every 4; "a good film": one
    counts = np.bincount(rows.example_index)
    assert counts[-1] == 1 and (counts[:-1] >= 2).all(), counts
    # 40 pieces need 8 windows: that input alone is refused, in Python and on the command line
    too_long = " ".join(["film"] * 40)
    with pytest.raises(UserError, match="the text needs 8 windows .* task.max_windows = 5"):
        model.predict([too_long])
    mixed = run_bertkit("predict", documents / "served", input=f"{texts[0]}\n{too_long}")
    answers = [json.loads(line) for line in mixed.stdout.splitlines()]
    assert "label" in answers[0] and "task.max_windows = 5" in answers[1]["error"], answers
    served = serve_in_fresh_process(documents / "served" / "saved_model", {"text": texts})
    assert served["label"] == [p["label"] for p in expected]
    np.testing.assert_allclose(served["score"], [p["score"] for p in expected], atol=1e-4)
    with pytest.raises(AssertionError, match="more windows than task.max_windows = 5"):
        serve_in_fresh_process(documents / "served" / "saved_model", {"text": [too_long]})


def test_a_document_over_max_windows_is_one_line_exit_2(documents, tmp_path):
    (tmp_path / "r.yaml").write_text(
        json.dumps(recipe(documents, long_text="windows", max_windows=1))
    )
    result = run_bertkit("finetune", tmp_path / "r.yaml", "--output", tmp_path / "run")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].endswith(
        "dev.tsv:2: text: the text needs 2 windows of 14 word pieces, more than "
        "task.max_windows = 1"
    ), lines
    assert not (tmp_path / "run" / "model").exists()


def test_windows_refuse_text_pairs_and_a_stride_past_the_window(documents):
    pairs = recipe(documents, long_text="windows")
    pairs["data"]["text_pair"] = "label"
    with pytest.raises(UserError, match="task.long_text: windows read single texts"):
        bertkit.finetune(pairs, output_dir=documents / "pairs", verbose=0)
    stride = recipe(documents, long_text="windows", window_stride=15)
    with pytest.raises(UserError, match="task.window_stride: must be at most"):
        bertkit.finetune(stride, output_dir=documents / "stride", verbose=0)
    unwindowed = recipe(documents, max_windows=3)
    with pytest.raises(UserError, match="task.max_windows: applies to long_text: windows only"):
        bertkit.finetune(unwindowed, output_dir=documents / "unwindowed", verbose=0)


def test_the_long_documents_recipe_reads_windows():
    from pathlib import Path

    from bertkit.recipes.recipe import load_recipe

    recipe = load_recipe(Path(__file__).parents[1] / "recipes" / "long_documents.yaml")
    assert recipe.task == "classification"
    options = recipe.task_options
    assert (options.long_text, options.window_aggregation, options.max_windows) == (
        "windows",
        "mean",
        64,
    )
