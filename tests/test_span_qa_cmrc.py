"""Tests for span QA's CMRC 2018 metric (`task.metric`) and for keeping every gold answer.

Expected segmentations and scores were computed by running the official script
(github.com/ymcui/cmrc2018, `squad-style-data/cmrc2018_evaluate.py`) under Python 2.7 with
NLTK 3.4.5, and after its four Python 3 edits (`benchmarks/cmrc_metric_parity.py`) with
NLTK 3.10, `nltk.word_tokenize` called with `preserve_line=True`; both gave these values
(the cases hold no dash that the two NLTKs split differently).
"""

import json
import random

import pytest

import bertkit
from bertkit.model.tokenizer import WordPieceTokenizer
from bertkit.testing import tiny_vocabulary, write_tiny_checkpoint
from bertkit_tasks.span_qa import SpanQAOptions, SpanQATask
from bertkit_tasks.span_qa.cmrc_eval import choose_metric, cmrc_scores, mixed_segmentation
from bertkit_tasks.span_qa.squad import QAExample
from bertkit_tasks.span_qa.squad_eval import evaluate
from bertkit_tasks.span_qa.treebank_words import word_tokenize

NAMES = ["张伟", "李娜", "王芳", "刘洋", "陈静", "杨明"]
FILLER = list("的是在了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动")
CHINESE = list(dict.fromkeys("".join(NAMES) + "".join(FILLER) + "谁写书？。"))


@pytest.mark.parametrize(
    "text, tokens, without_punctuation",
    [
        (
            "2018年的BERT-base模型",
            ["2018", "年", "的", "bert", "-", "base", "模", "型"],
            ["2018", "年", "的", "bertbase", "模", "型"],
        ),
        (
            "《红楼梦》第1回：Chapter One.",
            ["《", "红", "楼", "梦", "》", "第", "1", "回", "：", "chapter", "one", "."],
            ["红", "楼", "梦", "第", "1", "回", "chapter", "one", "."],
        ),
        (
            "他说：“I'm fine, thanks!”",
            ["他", "说", "：", "“", "i", "'m", "fine", ",", "thanks", "!", "”"],
            ["他", "说", "i", "'m", "fine", ",", "thanks", "!"],
        ),
        (
            "约3.5%的人（U.S.）",
            ["约", "3.5", "%", "的", "人", "（", "u.s", ".", "）"],
            ["约", "3.5", "%", "的", "人", "u.s", "."],
        ),
        ("……Hello World…… ", ["……hello", "world……"], ["……hello", "world……"]),  # "……" unlisted
        (
            " A-b_c*d^e/f\\g~h`i+j=k ",
            list("a-b_c*d^e/f\\g~h`i+j=k"),
            ["abcdefghijk"],  # removed marks join their run
        ),
    ],
)
def test_mixed_segmentation_matches_the_official_script(text, tokens, without_punctuation):
    assert mixed_segmentation(text) == tokens
    assert mixed_segmentation(text, remove_punctuation=True) == without_punctuation


@pytest.mark.parametrize(
    "prediction, golds, exact, f1",
    [
        ("北京大", ["北京大学"], 0, 0.8571428571428571),
        ("北京大学附属中学", ["北京大学"], 0, 0.6666666666666666),
        ("BERT-base模型", ["bert base 模型"], 0, 0.5714285714285715),
        ("", ["北京"], 0, 0.0),
        ("，", ["。"], 1, 0.0),  # both empty without punctuation: EM 1, but no common token
        ("1843年", ["1843", "1843年3月"], 0, 0.6666666666666666),
        ("the Beatles乐队", ["Beatles乐队"], 0, 0.8571428571428571),
        ("约3.5%", ["3.5%"], 0, 0.8),
        ("他说：“I'm fine”", ["I am fine"], 0, 0.25),
        ("Don't stop", ["do n't stop"], 0, 1.0),
    ],
)
def test_scores_match_the_official_script(prediction, golds, exact, f1):
    assert cmrc_scores(prediction, golds) == (exact, pytest.approx(f1, abs=1e-12))


def test_word_tokenize_port_on_treebank_cases():
    """Expected: NLTK 3.4.5's `word_tokenize(..., preserve_line=True)` under Python 2."""
    assert word_tokenize("cost $3.88 (roughly 3,36 euros) in New York.") == (
        ["cost", "$", "3.88", "(", "roughly", "3,36", "euros", ")", "in", "New", "York", "."]
    )
    assert word_tokenize("I can't go, 'cause gonna") == (
        ["I", "ca", "n't", "go", ",", "'cause", "gon", "na"]
    )
    # NLTK 3.5 and later split the em dash too
    assert word_tokenize("1\u20142 a--b wanna go") == [
        "1\u20142",
        "a",
        "--",
        "b",
        "wan",
        "na",
        "go",
    ]


def test_one_character_short_scores_partial_f1_not_zero():
    gold = [QAExample("q", "谁？", "张伟写了书。", ("张伟写",), (0,), False)]
    squad = evaluate(gold, {"q": "张伟"}, version="1.1")
    cmrc = evaluate(gold, {"q": "张伟"}, version="1.1", metric="cmrc2018")
    assert (squad["exact"], squad["f1"]) == (0.0, 0.0)
    assert (cmrc["exact"], cmrc["f1"]) == (0.0, pytest.approx(80.0))


def test_unanswerable_questions_keep_the_v2_rules():
    examples = [
        QAExample("a", "谁？", "张伟写了书。", ("张伟",), (0,), False),
        QAExample("b", "谁？", "张伟写了书。", (), (), True),
    ]
    scores = evaluate(examples, {"a": "张伟", "b": "。"}, {"a": -1.0, "b": 0.5}, metric="cmrc2018")
    assert (scores["exact"], scores["HasAns_f1"], scores["NoAns_f1"]) == (100.0, 100.0, 100.0)
    best = evaluate(examples, {"a": "张", "b": "书"}, {"a": -1.0, "b": 0.5}, metric="cmrc2018")
    assert best["f1"] == pytest.approx(100 * (2 / 3) / 2)  # "书" for b scores 0
    assert best["best_f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)  # b answered ""
    assert best["best_f1_thresh"] == -1.0


def make_task(metric="auto", version="1.1", sequence_length=24):
    tokenizer = WordPieceTokenizer(tiny_vocabulary() + CHINESE, lowercase=True)
    options = SpanQAOptions(version=version, metric=metric, max_query_length=4)
    return SpanQATask(options, None, tokenizer, sequence_length)


def test_auto_choice_by_the_share_of_cjk_characters(capfd):
    chinese = [QAExample("a", "谁？", "张伟写了 BERT 的书。", ("张伟",), (0,), False)]
    english = [QAExample("b", "Who?", "Ada wrote 张伟.", ("Ada",), (0,), False)]
    task = make_task()
    assert task.evaluate(chinese, [{"answer": "张伟"}])["metric"] == "cmrc2018"
    assert task.evaluate(chinese, [{"answer": "张"}])["metric"] == "cmrc2018"
    assert task.evaluate(english, [{"answer": "Ada"}])["metric"] == "squad"
    assert capfd.readouterr().err.splitlines() == [  # each choice said once
        "span_qa metric: cmrc2018 (auto: the evaluation contexts are 55% CJK characters)",
        "span_qa metric: squad (auto: the evaluation contexts are 18% CJK characters)",
    ]
    assert choose_metric("squad", ["张伟"])[0] == "squad"
    assert make_task("cmrc2018").evaluate(english, [{"answer": "Ada"}])["metric"] == "cmrc2018"


def test_wrong_answer_start_kept_in_evaluation_and_training_places_or_skips(tmp_path, capfd):
    context = "张伟写了书，李娜读了书。"
    records = [
        {"id": "moved", "question": "谁读？", "context": context,
         "answers": {"text": ["李娜"], "answer_start": [0]}},  # at 6: re-placed
        {"id": "lost", "question": "谁写？", "context": context,
         "answers": {"text": ["王芳", "刘洋"], "answer_start": [0, 3]}},  # in no context
        {"id": "fine", "question": "谁写？", "context": context,
         "answers": {"text": ["张伟"], "answer_start": [0]}},
    ]  # fmt: skip
    path = tmp_path / "dev.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    task = make_task()
    examples = task.read(str(path))
    assert capfd.readouterr().err == (
        f"{path}: 3 answers not at their answer_start: 1 re-placed at the nearest occurrence "
        "of their text, 2 not in the context (evaluated, not trained on); 1 questions not "
        "trained on; first: 'moved', 'lost'\n"
    )
    assert [(e.id, e.answer_starts) for e in examples] == [
        ("moved", (6,)),
        ("lost", (-1, -1)),
        ("fine", (0,)),
    ]
    training = task.featurize(examples, training=True)
    assert training.example_index.tolist() == [0, 2]  # "lost" is not trained on
    pieces = [task.tokenizer.vocabulary[i] for i in training.columns["token_ids"][0]]
    start, end = training.columns["start_positions"][0], training.columns["end_positions"][0]
    assert pieces[start : end + 1] == ["李", "娜"]
    scores = task.evaluate(examples, [{"answer": "李娜"}, {"answer": "刘洋"}, {"answer": "张"}])
    assert scores["total"] == 3 and scores["exact"] == pytest.approx(200 / 3)  # "lost" scored


def chinese_qa_lines(count, seed, wrong_start_every=0):
    """Contexts of Chinese filler with one name; the question asks who wrote the book."""
    rng = random.Random(seed)
    lines = []
    for i in range(count):
        name = rng.choice(NAMES)
        before = "".join(rng.choices(FILLER, k=rng.randint(0, 6)))
        after = "".join(rng.choices(FILLER, k=rng.randint(0, 6)))
        context = f"{before}{name}写了书。{after}"
        start = len(before) + (1 if wrong_start_every and i % wrong_start_every == 0 else 0)
        answers = {"text": [name], "answer_start": [start]}
        lines.append(
            {"id": f"q{i}", "question": "谁写书？", "context": context, "answers": answers}
        )
    return lines


def test_trains_and_evaluates_chinese_data_with_the_cmrc_metric(tmp_path, capfd):
    vocabulary = tiny_vocabulary() + CHINESE
    write_tiny_checkpoint(tmp_path / "ckpt", vocabulary=vocabulary)
    files = {}
    for split, count, seed in (("train", 160, 0), ("dev", 40, 1)):
        lines = chinese_qa_lines(count, seed, wrong_start_every=10)
        files[split] = tmp_path / f"{split}.jsonl"
        files[split].write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines))
    recipe = {
        "schema": 1,
        "task": {"name": "span_qa", "metric": "cmrc2018", "max_query_length": 8},
        "backbone": {"preset": str(tmp_path / "ckpt"), "sequence_length": 32},
        "data": {"train": str(files["train"]), "validation": str(files["dev"])},
        "training": {"epochs": 3, "batch_size": 16, "learning_rate": 3e-3, "warmup_ratio": 0.0},
        "export": {"saved_model": False},
    }
    bertkit.finetune(recipe, output_dir=tmp_path / "run", verbose=0)
    err = capfd.readouterr().err
    assert "span_qa metric: cmrc2018 (task.metric)" in err
    assert f"{files['train']}: 16 answers not at their answer_start: 16 re-placed" in err
    final = json.loads((tmp_path / "run" / "metrics.json").read_text())["final"]["validation"]
    assert final["metric"] == "cmrc2018" and final["total"] == 40
    assert {"exact", "f1", "total"} <= set(final)
    assert final["f1"] >= final["exact"] and final["f1"] > 50
