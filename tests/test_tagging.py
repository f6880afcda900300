"""Tagging: IOB1 data converted, windows over long sentences, offsets, SavedModel parity."""

import dataclasses
import json
import random
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

import bertkit
from bertkit.errors import UserError
from bertkit.model.tokenizer import WordPieceTokenizer
from bertkit.serving.inference import predict_examples
from bertkit.testing import (
    check_preprocessor,
    run_task_contract_test,
    serve_in_fresh_process,
    tiny_vocabulary,
)
from bertkit_tasks.tagging import TaggingData, TaggingOptions, TaggingTask
from bertkit_tasks.tagging.preprocessor import TaggingPreprocessor

SEQUENCE_LENGTH = 32
OTHER = [
    "the",
    "a",
    "film",
    "was",
    "very",
    "and",
    "it",
    "this",
    "visited",
    "works",
    "for",
    "who",
    "at",
    "of",
    "ok",
    ".",
]
PEOPLE, CITIES = ["john", "smith", "bob", "ann"], ["paris", "london", "rome", "oslo"]


def sentence(rng: random.Random) -> list[tuple[str, str]]:
    """(word, IOB1 tag) pairs: a name after "mr" is PER, a city after "in" is LOC."""
    words = [(w, "O") for w in rng.sample(OTHER, rng.randint(2, 6))]
    for cue, names, type_ in (("mr", PEOPLE, "PER"), ("in", CITIES, "LOC")):
        at = rng.randint(0, len(words))
        words[at:at] = [(cue, "O"), (rng.choice(names), f"I-{type_}")]
    if rng.random() < 0.3:
        words += [("acme", "I-ORG"), ("corp", "I-ORG")]
    return words


def write_conll(path, count: int, seed: int) -> None:
    rng = random.Random(seed)
    lines = ["-DOCSTART- -X- O", ""]
    for _ in range(count):
        lines += [f"{word} NN {tag}" for word, tag in sentence(rng)] + [""]
    path.write_text("\n".join(lines))


def same_entities(predictions, served):
    """The contract test's comparison: the SavedModel's entities are `predict`'s."""
    for i, prediction in enumerate(predictions):
        got = [
            (
                served["entity_type"][i][j],
                served["entity_text"][i][j],
                served["entity_start"][i][j],
                served["entity_end"][i][j],
            )
            for j in range(served["entity_count"][i])
        ]
        assert got == [(e["type"], e["text"], e["start"], e["end"]) for e in prediction["entities"]]
    assert any(prediction["entities"] for prediction in predictions)


@pytest.fixture(scope="module")
def contract(tmp_path_factory):
    """The task's contract test, whose run (learned from IOB1 data, windows of stride 10,
    a validation split) the other tests here read: one training and export for all."""
    tmp = tmp_path_factory.mktemp("tagging")
    write_conll(tmp / "train.txt", 200, seed=0)
    write_conll(tmp / "dev.txt", 40, seed=1)
    return tmp, run_task_contract_test(
        "tagging",
        tmp / "train.txt",
        task_options={"window_stride": 10},
        data={"validation": str(tmp / "dev.txt"), "scheme": "iob1"},
        training={"epochs": 5, "batch_size": 16},
        sequence_length=SEQUENCE_LENGTH,
        directory=tmp,
        compare=same_entities,
        bad_input=7,
        inputs=["Mr Smith visited Paris.", "mr ann in rome and acme corp"],
    )


@pytest.fixture(scope="module")
def run(contract):
    tmp, _ = contract
    return tmp, bertkit.load(tmp / "run")


def test_passes_the_contract_test(contract):
    _, result = contract
    assert "read_at" in result["preprocessor"]  # featurize's and serve's windows agree


def test_report_has_per_type_scores_and_the_wrong_entities(run):
    tmp, _ = run
    report = (tmp / "run" / "report.md").read_text()
    metrics = json.loads((tmp / "run" / "metrics.json").read_text())["final"]["validation"]
    assert "## Per entity type" in report and "## Most common confusions" in report
    for name, scores in metrics["per_type"].items():  # one row per type, from the final metrics
        assert f"| {name} |" in report and f"{scores['f1']:.4f}" in report
    wrong = (tmp / "run" / "wrong_entities.txt").read_text()
    sentences_with_errors = wrong.count("  errors:    ")
    assert f"{sentences_with_errors} of 40 sentences have a wrong entity" in report
    if sentences_with_errors:
        assert "  gold:      [" in wrong or "  predicted: [" in wrong


def long_words(count: int) -> list[str]:
    rng, words = random.Random(7), []
    while len(words) < count:
        words += [word for word, _ in sentence(rng)]
    return words


def test_learns_iob1_data_converted_to_iob2(run):
    tmp, model = run
    assert model.task.labels == ["O", "B-LOC", "B-ORG", "I-ORG", "B-PER"]  # file: I- only
    metrics = json.loads((tmp / "run" / "metrics.json").read_text())
    assert metrics["epochs"][-1]["loss"] < metrics["epochs"][0]["loss"]
    final = metrics["final"]["validation"]
    assert final["f1"] > 0.6 and set(final["per_type"]) >= {"LOC", "PER"}
    assert "PER: precision" in model.task.format_metrics(model.evaluate())
    (tmp / "bad.txt").write_text("John NN I-PER\nlives NN E-PER\n")
    with pytest.raises(UserError, match=r"bad.txt:2: word 2: 'E-PER' does not belong"):
        model.task.read(str(tmp / "bad.txt"))


def test_long_sentence_is_windowed_and_no_word_dropped(run):
    tmp, model = run
    task = model.task
    words = long_words(3 * SEQUENCE_LENGTH) + ["mr", "\x07", "smith"]  # \x07: no word pieces
    features = task.featurize([task.parse_input(words)], training=False)
    assert len(features) > 3 and features.lengths().max() <= SEQUENCE_LENGTH
    rows, positions = features.extras["read_at"][0].T  # each word's first piece, in its window
    pieces = task.tokenizer.tokenize_words(tf.ragged.constant([words])).to_list()[0]
    assert [features.columns["token_ids"][r][p] for r, p in zip(rows, positions, strict=True)] == [
        p[0] if p else task.tokenizer.unk_id for p in pieces
    ]
    [prediction] = model.predict([words])
    assert len(prediction["tags"]) == len(words) and prediction["tags"][-1] == "B-PER"
    assert max(e["start"] for e in prediction["entities"]) > 2 * SEQUENCE_LENGTH
    # the evaluation path (tagged sentences read from a file) decodes the same way
    (tmp / "long.txt").write_text("\n".join(f"{word} O" for word in words))
    examples = task.read(str(tmp / "long.txt"))
    assert predict_examples(task, model.model, examples, 8, model.buckets) == [prediction]


@pytest.mark.parametrize(
    "decoding, tags, entities",
    [
        ("argmax", ["B-LOC", "I-PER", "O"], [("LOC", 0, 1), ("PER", 1, 2)]),
        ("constrained", ["B-PER", "I-PER", "O"], [("PER", 0, 2)]),
    ],
)
def test_decoding_option(run, decoding, tags, entities):
    _, model = run
    task = TaggingTask(
        dataclasses.replace(model.task.options, decoding=decoding),
        model.task.data,
        model.task.tokenizer,
        SEQUENCE_LENGTH,
        model.task.state,
    )
    labels = task.labels  # O B-LOC B-ORG I-ORG B-PER; the model has no I-PER: give it one
    task.state["labels"] = labels = [*labels, "I-PER"]
    examples = [task.parse_input(["john", "smith", "."])]
    features = task.featurize(examples, training=False)
    rows, positions = features.extras["read_at"][0].T
    word_probabilities = [
        {"B-LOC": 0.5, "B-PER": 0.4, "O": 0.1},  # argmax: B-LOC I-PER
        {"I-PER": 0.5, "B-PER": 0.2, "O": 0.3},
        {"O": 1.0},
    ]
    logits = [np.full((len(ids), len(labels)), -30.0) for ids in features.columns["token_ids"]]
    for row, position, probabilities in zip(rows, positions, word_probabilities, strict=True):
        for tag, probability in probabilities.items():
            logits[row][position, labels.index(tag)] = np.log(probability)
    [prediction] = task.decode(examples, features, {"logits": logits})
    assert prediction["tags"] == tags
    assert [(e["type"], e["start"], e["end"]) for e in prediction["entities"]] == entities


def tagging_task(sequence_length: int, stride: int | None) -> TaggingTask:
    tokenizer = WordPieceTokenizer(tiny_vocabulary(), lowercase=True)
    return TaggingTask(
        TaggingOptions(window_stride=stride),
        TaggingData(),
        tokenizer,
        sequence_length,
        {"labels": ["O"]},
    )


@pytest.mark.parametrize("sequence_length, stride", [(8, 1), (8, 6), (12, 5), (16, None)])
def test_featurize_and_serve_cut_the_same_windows(sequence_length, stride):
    rng = random.Random(sequence_length)
    choices = ["paris", "unbelievably", "qzxwvk", "x", "\x07", "smith", "a-b", "Zoë’s"]
    # at least one word: an empty text is no input `parse_input` takes (the SavedModel's
    # answer to one is checked below)
    texts = [" ".join(rng.choices(choices, k=rng.randint(1, 30))) for _ in range(6)]
    assert check_preprocessor(tagging_task(sequence_length, stride), texts) == [
        "token_ids",
        "segment_ids",
        "example_index",
        "read_at",
    ]


def test_the_preprocessor_check_names_where_the_paths_disagree():
    task = tagging_task(12, 5)
    other_stride = TaggingPreprocessor(task.tokenizer, 12, window_stride=4)
    task.preprocessor = lambda: SimpleNamespace(
        featurize=task._preprocessor.featurize, serve=other_stride.serve
    )
    text = " ".join(["paris"] * 12)
    with pytest.raises(
        AssertionError,
        match=r"disagree on 'token_ids' at item 2 \(of 3 from "
        r"featurize, 3 from serve\), from input 'paris",
    ):
        check_preprocessor(task, ["smith", text])


def test_raw_text_entities_have_character_offsets(run):
    _, model = run
    words = long_words(40)
    text = "Zoë’s café — " + " ".join(words) + " and Mr Smith in Paris."
    [prediction] = model.predict([text])
    assert prediction["entities"], prediction
    for entity in prediction["entities"]:
        assert entity["text"] == text[entity["start"] : entity["end"]]
        assert 0 < entity["score"] <= 1
    smith = text.index("Smith")
    assert ("PER", smith, smith + 5) in {
        (e["type"], e["start"], e["end"]) for e in prediction["entities"]
    }
    [as_words] = model.predict([words])  # the same words, pre-split
    [as_text] = model.predict([" ".join(words)])
    assert [(e["type"], e["text"]) for e in as_words["entities"]] == [
        (e["type"], e["text"]) for e in as_text["entities"]
    ]
    traced = model.task.tokenizer.traced_calls.traced_names()  # the calls after the first
    assert any(name.startswith("decode_tags") for name in traced), traced


def test_saved_model_in_a_fresh_process_matches_predict(run):
    tmp, model = run
    texts = ["Mr Smith visited Paris.", "", "Zoë’s café in Rome, mr Ann", " ".join(long_words(100))]
    out = serve_in_fresh_process(tmp / "run" / "saved_model", {"text": texts})
    out = {name.removeprefix("entity_"): value for name, value in out.items()}
    keys = ["text", "type", "start", "end", "score"]
    exported = [
        [{key: out[key][i][j] for key in keys} for j in range(out["count"][i])]
        for i in range(len(texts))
    ]
    assert out["count"][1] == 0  # `predict` refuses the empty text; the SavedModel finds nothing
    exported.pop(1)
    expected = [p["entities"] for p in model.predict(texts[:1] + texts[2:])]
    assert sum(map(len, expected)) >= 3
    for got, want in zip(exported, expected, strict=True):
        assert [{**e, "score": 0} for e in got] == [{**e, "score": 0} for e in want]
        np.testing.assert_allclose([e["score"] for e in got], [e["score"] for e in want], atol=1e-4)


def test_saved_model_refuses_bad_shapes_and_answers_an_empty_batch(run):
    from bertkit.testing import assert_serving_refuses_bad_shapes

    tmp, _ = run
    assert_serving_refuses_bad_shapes(tmp / "run" / "saved_model", ["text"])
