"""Tests for the span_qa task: windows, decoding by hand, v2.0 training, SavedModel parity."""

import json
import random
from pathlib import Path

import numpy as np
import pytest

import bertkit
from bertkit.model.tokenizer import WordPieceTokenizer
from bertkit.recipes.recipe import load_recipe
from bertkit.testing import (
    FILLER,
    POSITIVE,
    check_preprocessor,
    run_task_contract_test,
    serve_in_fresh_process,
    tiny_vocabulary,
)
from bertkit_tasks.span_qa import SpanQAOptions, SpanQATask
from bertkit_tasks.span_qa.span_decoding import answer_tokens
from bertkit_tasks.span_qa.squad import QAExample

WORDS = [w for w in FILLER if w not in ("what", "is", "it", ".")] + ["Zoë", "café", "Renée"]
QUESTION = "what is it ?"
SEQUENCE_LENGTH = 32  # windows of 25 context pieces after [CLS] what is it ? [SEP]


def qa_lines(count, seed, *, impossible_every=3):
    """JSON lines whose answer is the context's one POSITIVE word; some have none (v2.0)."""
    rng = random.Random(seed)
    lines = []
    for i in range(count):
        words = rng.choices(WORDS, k=rng.choice([4, 8, 12, 40]))  # 40: several windows
        answers = {"text": [], "answer_start": []}
        if i % impossible_every:
            at = rng.randrange(len(words) + 1)
            words.insert(at, rng.choice(POSITIVE))
            answers = {"text": [words[at]], "answer_start": [len(" ".join(words[:at] + [""]))]}
        lines.append(
            {"id": f"q{i}", "question": QUESTION, "context": " ".join(words), "answers": answers}
        )
    return lines


def write_lines(path, lines):
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    return path


def make_task(version="1.1", sequence_length=16, **options):
    tokenizer = WordPieceTokenizer(tiny_vocabulary(), lowercase=True)
    return SpanQATask(SpanQAOptions(version=version, **options), None, tokenizer, sequence_length)


def test_accented_context_targets_and_hand_made_decode():
    task = make_task(sequence_length=32, max_query_length=4)
    context = "Zoë and Renée visited John Smith in London."
    example = QAExample("q", "who did ?", context, ("John Smith",), (context.index("John"),), False)
    features = task.featurize([example], training=False)
    pieces = [task.tokenizer.vocabulary[i] for i in features.columns["token_ids"][0]]
    start, end = features.columns["start_positions"][0], features.columns["end_positions"][0]
    assert (pieces[start], pieces[end]) == ("john", "smith")
    logits = np.zeros((len(pieces), 2), np.float32)
    logits[start, 0], logits[end, 1] = 5.0, 4.0
    (prediction,) = task.decode([example], features, {"logits": [logits]})
    assert prediction == {"answer": "John Smith", "start": 22, "end": 32, "score": 9.0}


def test_long_context_windows_target_the_answer_where_it_is():
    task = make_task(max_query_length=4, doc_stride=4)  # 16 - len([CLS] who ? [SEP] [SEP]) = 11
    context = " ".join(["the film"] * 8 + ["John Smith"] + ["a show"] * 4)  # 26 pieces
    example = QAExample("q", "who ?", context, ("Smith",), (context.index("Smith"),), False)
    features = task.featurize([example], training=False)
    assert len(features) == 5 and features.example_index.tolist() == [0] * 5
    assert max(features.lengths()) <= 16
    targets = list(
        zip(features.columns["start_positions"], features.columns["end_positions"], strict=True)
    )
    assert targets == [(0, 0), (0, 0), (13, 13), (9, 9), (5, 5)]  # "smith": context piece 17
    # Windows 2-4 hold "smith"; only window 3 (most context) may start an answer there.
    logits = [np.zeros((n, 2), np.float32) for n in features.lengths()]
    logits[3][9], logits[4][5] = 3.0, 10.0
    (prediction,) = task.decode([example], features, {"logits": logits})
    assert (prediction["answer"], prediction["score"]) == ("Smith", 6.0)


@pytest.mark.parametrize("sequence_length, doc_stride", [(16, 3), (16, 1), (24, 9)])
def test_featurize_and_serve_cut_the_same_windows(sequence_length, doc_stride):
    """Rows and candidate masks: questions of 1 to 10 words (cut at 8 pieces), contexts
    of 1 to 40 words, several windows each (an empty one is no input `parse_input` takes;
    the SavedModel's answer to one is checked below)."""
    rng = random.Random(sequence_length + doc_stride)
    questions = [" ".join(rng.choices(WORDS, k=rng.randint(1, 10))) for _ in range(30)]
    contexts = [" ".join(rng.choices(WORDS, k=rng.randint(1, 40))) for _ in range(30)]
    task = make_task(sequence_length=sequence_length, max_query_length=8, doc_stride=doc_stride)
    inputs = [{"question": q, "context": c} for q, c in zip(questions, contexts, strict=True)]
    compared = check_preprocessor(task, inputs, {"question": questions, "context": contexts})
    assert compared == ["token_ids", "segment_ids", "example_index", "starts_ok", "ends_ok"]


def test_answer_tokens_overlap_the_answer_characters():
    context = "Zoë and Renée met"
    example = QAExample("q", "who ?", context, ("ë and Re",), (2,), False)
    starts, ends = np.array([0, 4, 8, 14]), np.array([3, 7, 13, 17])  # zoe and renee met
    assert answer_tokens(example, starts, ends) == (0, 2)
    assert answer_tokens(QAExample("q", "?", context, (), (), True), starts, ends) is None


def test_v1_rejects_unanswerable_questions(tmp_path):
    path = write_lines(tmp_path / "dev.jsonl", qa_lines(3, seed=0))
    with pytest.raises(bertkit.UserError, match="has no answer.*task.version: '2.0'"):
        make_task().read(str(path))


@pytest.mark.parametrize("name", ["squad", "squad_v2"])
def test_recipes_load(name):
    recipe = load_recipe(Path(__file__).parents[1] / "recipes" / f"{name}.yaml")
    assert recipe.task == "span_qa"
    assert recipe.task_options.version == ("2.0" if name == "squad_v2" else "1.1")


@pytest.fixture(scope="module")
def contract(tmp_path_factory):
    """The task's contract test, whose run (SQuAD 2.0 style, 3 epochs, a validation split)
    the other tests here read: one training and export for all."""
    folder = tmp_path_factory.mktemp("span_qa")
    contexts = [line["context"] for line in qa_lines(2, seed=4)]
    return folder, run_task_contract_test(
        "span_qa",
        write_lines(folder / "train.jsonl", qa_lines(240, seed=1)),
        directory=folder,
        sequence_length=SEQUENCE_LENGTH,
        task_options={"version": "2.0", "max_query_length": 8, "doc_stride": 8},
        data={"validation": str(write_lines(folder / "dev.jsonl", qa_lines(60, seed=2)))},
        training={
            "epochs": 3,
            "batch_size": 16,
            "warmup_ratio": 0.0,
            "bucket_lengths": [SEQUENCE_LENGTH],  # one shape: one trace
        },
        inputs=[{"question": QUESTION, "context": context} for context in contexts],
        serving_inputs={"question": [QUESTION] * 2, "context": contexts},
        bad_input={"question": QUESTION},
    )


@pytest.fixture(scope="module")
def run(contract):
    return contract[0]


def test_passes_the_contract_test(contract):
    _, result = contract
    assert {"starts_ok", "ends_ok"} <= set(result["preprocessor"])


def test_learns_answers_and_no_answers(run):
    metrics = json.loads((run / "run" / "metrics.json").read_text())
    epochs = metrics["epochs"]
    assert epochs[-1]["loss"] < epochs[0]["loss"]
    final = metrics["final"]["validation"]
    assert {"exact", "f1", "HasAns_f1", "NoAns_f1", "best_f1", "best_f1_thresh"} <= set(final)
    assert final["metric"] == "squad"  # task.metric auto on English contexts
    assert final["f1"] > 70 and final["best_f1"] > 70
    state = json.loads((run / "run" / "model" / "task.json").read_text())["state"]
    assert state["null_score_threshold"] >= final["best_f1_thresh"]  # tuned: margin above it


def test_final_metrics_describe_the_calibrated_model(run, tmp_path):
    final = json.loads((run / "run" / "metrics.json").read_text())["final"]["validation"]
    model = bertkit.load(run / "run")
    metrics = model.evaluate(run / "dev.jsonl", predictions_dir=tmp_path)
    assert metrics["f1"] == pytest.approx(final["f1"]) and metrics["exact"] == final["exact"]
    for name in ("predictions.json", "null_odds.json"):  # evaluate writes what finetune did
        assert json.loads((tmp_path / name).read_text()) == pytest.approx(
            json.loads((run / "run" / name).read_text()), abs=1e-4
        )


def test_predict_matches_the_evaluation_path(run):
    model = bertkit.load(run / "run")
    dev = [json.loads(line) for line in (run / "dev.jsonl").read_text().splitlines()]
    predictions = model.predict([{"question": d["question"], "context": d["context"]} for d in dev])
    official = json.loads((run / "run" / "predictions.json").read_text())
    assert [p["answer"] for p in predictions] == [official[d["id"]] for d in dev]
    for d, p in zip(dev, predictions, strict=True):
        assert d["context"][p["start"] : p["end"]] == p["answer"]
    (pair,) = model.predict([(QUESTION, dev[1]["context"])])  # alone: other batch shapes
    assert pair == pytest.approx(predictions[1], abs=1e-4)
    (with_n_best,) = model.predict([{**dev[1], "n_best": True}])
    assert with_n_best["n_best"][0]["answer"] == predictions[1]["best_span"]
    traced = model.task.tokenizer.traced_calls.traced_names()  # the calls after the first
    assert any(name.startswith("decode_answer_spans") for name in traced), traced


def test_saved_model_in_a_fresh_process_matches_predict(run):
    dev = [json.loads(line) for line in (run / "dev.jsonl").read_text().splitlines()][:12]
    long_context = " ".join(["Renée"] + ["the film"] * 30 + ["lovely", "café"])  # 4 windows
    inputs = {
        "question": [d["question"] for d in dev] + [QUESTION, QUESTION, ""],
        "context": [d["context"] for d in dev] + [long_context, "", "Zoë"],
    }
    served = serve_in_fresh_process(run / "run" / "saved_model", inputs)
    # `predict` refuses an empty question or context; the SavedModel answers them all
    pairs = list(zip(inputs["question"], inputs["context"], strict=True))
    expected = bertkit.load(run / "run").predict(pairs[:-2])
    assert len(served["answer"]) == len(pairs)
    assert [served[key][-2] for key in ("answer", "start", "end")] == ["", -1, -1]  # no context
    served = {key: values[:-2] for key, values in served.items()}
    assert served["answer"] == [p["answer"] for p in expected]
    assert served["start"] == [p["start"] for p in expected]
    assert served["end"] == [p["end"] for p in expected]
    np.testing.assert_allclose(served["score"], [p["score"] for p in expected], atol=1e-4)
    np.testing.assert_allclose(
        served["null_score_diff"], [p["null_score_diff"] for p in expected], atol=1e-4
    )


def test_saved_model_refuses_bad_shapes_and_answers_an_empty_batch(run):
    from bertkit.testing import assert_serving_refuses_bad_shapes

    assert_serving_refuses_bad_shapes(run / "run" / "saved_model", ["question", "context"])


@pytest.mark.parametrize("first_span, threshold", [("Ada", -0.75), ("wrote", "below all")])
def test_calibrated_threshold_reproduces_the_best_f1(first_span, threshold):
    # q1 has an answer; q2 and q3 have none. With q1's best span right, answering q1 alone
    # is best (threshold between q1's and q2's differences). With it wrong, answering no
    # question is best: the official search then reports its starting threshold 0.0,
    # which would answer q1 and q2; the calibrated threshold must answer none.
    examples = [
        QAExample("q1", "Who?", "Ada wrote it.", ("Ada",), (0,), False),
        QAExample("q2", "Who?", "Ada wrote it.", (), (), True),
        QAExample("q3", "Who?", "Ada wrote it.", (), (), True),
    ]
    diffs = [-1.0, -0.5, 2.0]
    predictions = [
        {"answer": "", "best_span": span, "null_score_diff": diff}
        for span, diff in zip([first_span, "Ada", "it"], diffs, strict=True)
    ]
    tuned = make_task(version="2.0").calibrate(examples, predictions)["null_score_threshold"]
    if threshold == "below all":
        assert tuned < min(diffs)
    else:
        assert tuned == pytest.approx(threshold)
