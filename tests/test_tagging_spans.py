"""Tagging from raw texts with character spans: readers, the word rule, span F1, a run."""

import json
import random

import pytest

import bertkit
from bertkit.errors import UserError
from bertkit.model.tokenizer import WordPieceTokenizer
from bertkit.testing import (
    check_preprocessor,
    run_bertkit,
    run_task_contract_test,
    tiny_vocabulary,
    write_tiny_checkpoint,
)
from bertkit_tasks.tagging import TaggingData, TaggingOptions, TaggingTask
from bertkit_tasks.tagging.conll import TaggedSentence
from bertkit_tasks.tagging.reading import file_format
from bertkit_tasks.tagging.span_eval import evaluate_spans
from bertkit_tasks.tagging.spans import SpanEntity, read_spans

MIXED = ["DOTA2比赛在01:29开始 Riddick", "mr smith 在 paris\u3000ok", "Zoë’s café\u200b 2"]


def write_lines(path, records) -> str:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return str(path)


def entities(sentence):
    return [(e.type, sentence.text[e.start : e.end]) for e in sentence.entities]


# ---------------------------------------------------------------- readers
def test_reads_the_three_forms_and_texts_without_entities(tmp_path):
    text = "叶老桂在DOTA2比赛"
    records = [
        {"text": text, "entities": [{"start": 4, "end": 8, "label": "game"}]},
        {"text": text, "entities": [{"start": 0, "end": 3, "type": "name"}]},  # type: label
        {"text": text, "label": [[4, 9, "game"], [0, 3, "name"]]},  # doccano, end exclusive
        {"text": text, "label": {"name": {"叶老桂": [[0, 2]]}, "game": {"DOTA": [[4, 7]]}}},
        {"text": text, "entities": []},
        {"text": text},
    ]
    sentences = read_spans(write_lines(tmp_path / "train.json", records))
    assert [entities(s) for s in sentences] == [
        [("game", "DOTA")],
        [("name", "叶老桂")],
        [("name", "叶老桂"), ("game", "DOTA2")],
        [("name", "叶老桂"), ("game", "DOTA")],  # CLUENER's end is inclusive
        [],
        [],
    ]
    assert [s.line for s in sentences] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"text": "Ann", "label": [[0, 3, "PER"]', "invalid JSON"),
        ('{"entities": []}', "missing key 'text'"),
        ('{"text": " ", "entities": []}', "'text' is empty"),
        (
            '{"text": "Ann", "label": [[0, 4, "PER"]]}',
            r"entity PER \[0, 4\) is out of the text's 3",
        ),
        ('{"text": "Ann", "label": [[2, 2, "PER"]]}', "start must be before end"),
        (
            '{"text": "Ann Lee", "label": [[0, 3, "PER"], [2, 7, "ORG"]]}',
            r"entities 'Ann' \(PER \[0, 3\)\) and 'n Lee' \(ORG \[2, 7\)\) overlap",
        ),
        (
            '{"text": "Ann Lee", "label": {"PER": {"Lee": [[0, 2]]}}}',
            r"entity 'Lee' \(PER\) is not at \[0, 2\]: the text there is 'Ann'",
        ),
        ('{"text": "Ann", "label": [[0, 3, 7]]}', "an entity's label must be a text, got 7"),
        ('{"text": "Ann", "entities": [{"start": 0, "end": 3}]}', "label must be a text, got None"),
    ],
)
def test_each_error_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "fine", "entities": []}\n' + line + "\n")
    with pytest.raises(UserError, match=rf"^{path}:2: .*{message}"):
        read_spans(path, overlapping="error")


def test_overlaps_are_kept_and_said_by_default(tmp_path, capsys):
    record = {"text": "Oslo Bank", "label": [[0, 4, "LOC"], [0, 9, "ORG"]]}
    path = write_lines(tmp_path / "dev.json", [{"text": "ok"}, record])
    [_, sentence] = task_of().read(path)
    assert entities(sentence) == [("LOC", "Oslo"), ("ORG", "Oslo Bank")]
    assert capsys.readouterr().err == (
        f"{path}: 1 pair of overlapping entities in 1 text; training keeps the longest of "
        f"each nest, evaluation all; first: {path}:2 'Oslo' (LOC [0, 4)) and 'Oslo Bank' "
        "(ORG [0, 9))\n"
    )


def test_the_cli_exits_2_with_the_one_line(tmp_path):
    write_lines(tmp_path / "train.jsonl", [{"text": "Ann", "label": [[0, 9, "PER"]]}])
    checkpoint = write_tiny_checkpoint(tmp_path / "ckpt", num_layers=1)
    (tmp_path / "recipe.yaml").write_text(
        f"schema: 1\ntask: {{name: tagging}}\nbackbone: {{preset: {checkpoint}}}\n"
        f"data: {{train: {tmp_path / 'train.jsonl'}}}\n"
    )
    result = run_bertkit("finetune", tmp_path / "recipe.yaml", "--output", tmp_path / "run")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"bertkit: error: {tmp_path / 'train.jsonl'}:1: entity PER [0, 9) is out of the text's 3 characters"
    )


def test_auto_detects_spans_from_the_first_record(tmp_path):
    spans = write_lines(tmp_path / "a.json", [{"text": "Ann", "label": [[0, 3, "PER"]]}])
    tagged = write_lines(tmp_path / "b.jsonl", [{"tokens": ["Ann"], "tags": ["B-PER"]}])
    (tmp_path / "c.txt").write_text("Ann B-PER\n")
    assert [file_format(p, "auto") for p in (spans, tagged, tmp_path / "c.txt")] == [
        "spans",
        "jsonl",
        "conll",
    ]
    assert file_format(tagged, "spans") == "spans"  # a format named is the format read
    task = task_of()
    assert entities(task.read(spans)[0]) == [("PER", "Ann")]
    assert task.read(tagged)[0].tags == ("B-PER",)


# ---------------------------------------------------------------- the word rule
def task_of(text_words="auto", state=None, sequence_length=16, **data) -> TaggingTask:
    tokenizer = WordPieceTokenizer(tiny_vocabulary() + list("比赛在开始"), lowercase=True)
    return TaggingTask(
        TaggingOptions(text_words=text_words),
        TaggingData(**data),
        tokenizer,
        sequence_length,
        state,
    )


def test_auto_chooses_characters_for_character_level_words(capsys):
    characters = [
        TaggedSentence(tuple("DOTA2比赛"), ("B-GAME",) + ("I-GAME",) * 4 + ("O",) * 2, "x", 1)
    ]
    words = [TaggedSentence(("DOTA2", "比"), ("B-GAME", "O"), "x", 1)]
    spans = read_spans_text("DOTA2比赛", [])
    assert task_of().fit_state(characters)["text_words"] == "characters"
    assert capsys.readouterr().out == (
        "raw texts are split into words by one word a character (whitespace excluded) "
        "(task.text_words: characters; auto: every training word is one character)\n"
    )
    assert task_of().fit_state(words)["text_words"] == "bert"
    assert task_of().fit_state(spans)["text_words"] == "bert"
    assert task_of("characters").fit_state(words)["text_words"] == "characters"
    assert task_of().text_words == "bert"  # a run saved before the option read texts so
    assert task_of("characters", {"labels": ["O"]}).text_words == "characters"


def read_spans_text(text, spans, source="train.json", line=1):
    from bertkit_tasks.tagging.spans import SpanSentence

    return [SpanSentence(text, tuple(SpanEntity(*s) for s in spans), source, line)]


@pytest.mark.parametrize("rule", ["characters", "bert"])
def test_python_and_tensorflow_make_the_same_words(rule):
    task = task_of(state={"labels": ["O"], "text_words": rule}, sequence_length=8)
    texts = MIXED + [" ".join(MIXED * 3)]  # windows over a long one
    compared = check_preprocessor(task, texts)
    assert compared == ["token_ids", "segment_ids", "example_index", "read_at"]
    features = task.featurize([task.parse_input(MIXED[0])], training=False)
    starts, ends = features.extras["char_offsets"][0]
    words = [MIXED[0][s:e] for s, e in zip(starts, ends, strict=True)]
    if rule == "characters":
        assert words == [c for c in MIXED[0] if not c.isspace()]
    else:
        assert words == ["DOTA2", "比", "赛", "在", "01", ":", "29", "开", "始", "Riddick"]


def test_spans_train_on_the_rows_predict_makes_and_on_whole_words(capsys):
    text = "in DOTA2 比赛 acme"
    spans = [("GAME", 3, 7), ("EVENT", 9, 11), ("ORG", 12, 16)]  # "DOTA" ends inside "DOTA2"
    [sentence] = read_spans_text(text, spans, line=17)
    task = task_of(state={"labels": ["O", "B-GAME", "I-GAME", "B-EVENT", "I-EVENT", "B-ORG"]})
    features = task.featurize([sentence], training=True)
    assert capsys.readouterr().out == (
        "1 of 3 entities do not start and end at word boundaries; trained on whole words; "
        "first: train.json:17 'DOTA'; task.text_words: characters trains them as written\n"
    )
    predicted = task.featurize([task.parse_input(text)], training=False)
    assert [r.tolist() for r in features.columns["token_ids"]] == [
        r.tolist() for r in predicted.columns["token_ids"]
    ]
    labels = features.columns["labels"][0]
    tags = [task.labels[i] for i in labels[labels >= 0]]  # words: in DOTA2 比 赛 acme
    assert tags == ["O", "B-GAME", "B-EVENT", "I-EVENT", "B-ORG"]
    task.featurize([sentence], training=False)  # evaluation data is not said again
    assert capsys.readouterr().out == ""


# ---------------------------------------------------------------- span F1
def test_span_f1_on_a_hand_made_example():
    task = task_of()
    examples = read_spans_text("DOTA2 in Oslo", [("GAME", 0, 4), ("LOC", 9, 13)])
    examples += read_spans_text("Ann and Bo", [("PER", 0, 3), ("PER", 8, 10)], line=2)
    predictions = [
        {
            "entities": [
                {"type": "GAME", "start": 0, "end": 5},
                {"type": "LOC", "start": 9, "end": 13},
            ]
        },
        {
            "entities": [
                {"type": "PER", "start": 0, "end": 3},
                {"type": "ORG", "start": 4, "end": 7},
            ]
        },
    ]
    metrics = task.evaluate(examples, predictions)
    # correct: LOC Oslo, PER Ann; 4 predicted, 4 gold
    assert metrics["precision"] == metrics["recall"] == metrics["f1"] == 0.5
    assert metrics["counts"] == {
        "characters": 23,
        "found_gold": 4,
        "found_predicted": 4,
        "correct": 2,
    }
    assert metrics["per_type"]["PER"]["recall"] == 0.5 and metrics["per_type"]["ORG"]["f1"] == 0
    # wrong characters: "2" (GAME for O), "and" (ORG for O), "Bo" (O for PER)
    assert metrics["accuracy"] == pytest.approx(17 / 23)
    assert task.format_metrics(metrics).splitlines()[0] == (
        "processed 23 characters with 4 phrases; found: 4 phrases; correct: 2."
    )
    assert evaluate_spans(["Ann"], [[("PER", 0, 3)]], [[]])["recall"] == 0.0


# ---------------------------------------------------------------- a run on span data
NAMES, CITIES = ["smith", "ann", "li", "bo"], ["paris", "rome", "oslo", "dota2"]
FILLER = ["the", "比赛", "在", "01:29", "开始", "ok", "was", "very"]


def span_record(rng: random.Random) -> dict:
    """A text with a PER after "mr " and a LOC after "in ", and character spans."""
    parts = rng.sample(FILLER, 3)
    for cue, names, type_ in (("mr", NAMES, "PER"), ("in", CITIES, "LOC")):
        at = rng.randint(0, len(parts))
        parts[at:at] = [cue, (rng.choice(names), type_)]
    text, spans = "", []
    for part in parts:
        word, type_ = part if isinstance(part, tuple) else (part, None)
        text += "" if not text or rng.random() < 0.3 else " "
        if type_:
            spans.append([len(text), len(text) + len(word), type_])
        text += word
    return {"text": text, "label": spans}


@pytest.fixture(scope="module")
def spans_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spans")
    rng = random.Random(0)
    write_lines(tmp / "train.jsonl", [span_record(rng) for _ in range(300)])
    cluener = []
    for record in (span_record(rng) for _ in range(40)):
        label = {}
        for start, end, type_ in record["label"]:
            label.setdefault(type_, {}).setdefault(record["text"][start:end], []).append(
                [start, end - 1]
            )
        cluener.append({"text": record["text"], "label": label})
    write_lines(tmp / "dev.json", cluener)
    result = run_task_contract_test(
        "tagging",
        tmp / "train.jsonl",
        task_options={"text_words": "characters"},
        data={"validation": str(tmp / "dev.json")},
        training={"epochs": 8, "batch_size": 16},
        sequence_length=48,
        directory=tmp,
        compare=same_entities,
        bad_input=7,
        inputs=MIXED + ["mr smith in paris", "in rome mr li"],
    )
    return tmp, result, bertkit.load(tmp / "run")


def same_entities(predictions, served):
    for i, prediction in enumerate(predictions):
        got = [
            tuple(served[f"entity_{key}"][i][j] for key in ("type", "text", "start", "end"))
            for j in range(served["entity_count"][i])
        ]
        assert got == [(e["type"], e["text"], e["start"], e["end"]) for e in prediction["entities"]]


def test_a_run_on_span_data_evaluates_on_character_spans(spans_run):
    tmp, result, model = spans_run
    assert result["preprocessor"] == ["token_ids", "segment_ids", "example_index", "read_at"]
    assert model.task.state["text_words"] == "characters"
    metrics = json.loads((tmp / "run" / "metrics.json").read_text())
    assert metrics["epochs"][-1]["loss"] < metrics["epochs"][0]["loss"]
    final = metrics["final"]["validation"]
    assert final["counts"]["found_gold"] == 80 and final["f1"] > 0.3, final
    # evaluation's predictions are predict's on the raw texts
    dev = model.task.read(str(tmp / "dev.json"))
    predictions = model.predict([sentence.text for sentence in dev])
    assert model.task.evaluate(dev, predictions)["f1"] == final["f1"]
    for sentence, prediction in zip(dev, predictions, strict=True):
        for entity in prediction["entities"]:
            assert entity["text"] == sentence.text[entity["start"] : entity["end"]]
    assert "wrong entities" in (tmp / "run" / "report.md").read_text()


def test_raw_text_predictions_equal_character_list_predictions(spans_run):
    _, result, model = spans_run
    texts = MIXED + ["mr smith在paris", "DOTA2比赛 in oslo mr bo"]
    found = 0
    for text, as_text in zip(texts, model.predict(texts), strict=True):
        positions = [i for i, char in enumerate(text) if not char.isspace() and char != "\u200b"]
        [as_words] = model.predict([[text[i] for i in positions]])
        mapped = [
            (e["type"], positions[e["start"]], positions[e["end"] - 1] + 1, round(e["score"], 4))
            for e in as_words["entities"]
        ]
        assert mapped == [
            (e["type"], e["start"], e["end"], round(e["score"], 4)) for e in as_text["entities"]
        ]
        found += len(mapped)
    assert found >= 3
