"""Chinese whole-word masking: jieba's words and reference-file words as masked units."""

import json
import re
import sys

import numpy as np
import pytest

from bertkit.errors import UserError
from bertkit.model.tokenizer import WordPieceTokenizer
from bertkit.padding import pad_batch
from bertkit.recipes.recipe import load_recipe
from bertkit.testing import tiny_vocabulary, write_tiny_checkpoint
from bertkit.testing.cli import run_bertkit
from bertkit_tasks.mlm import CorpusData, MaskedLMOptions, MaskedLMTask
from bertkit_tasks.mlm.word_segments import chinese_continuations, jieba_words

CHINESE = "我爱北京天安门人民大学生活很好今天气"
VOCABULARY = tiny_vocabulary() + list(dict.fromkeys(CHINESE))
# jieba (0.42.1) splits these as 我/爱/北京大学 and 今天/天气/很好: 北京大学 is one word
LINES = ["我爱北京大学", "今天天气很好", "我爱北京大学 the film"]


def make_task(mode, data=None, sequence_length=64):
    tokenizer = WordPieceTokenizer(VOCABULARY, True)
    options = MaskedLMOptions(whole_word_masking=mode, next_sentence_prediction=False)
    return MaskedLMTask(options, data or CorpusData("c.txt"), tokenizer, sequence_length)


def write_corpus(path, documents=6):
    text = "\n\n".join(["\n".join(LINES * 2)] * documents)  # 44 tokens a document
    path.write_text(text + "\n", encoding="utf-8")
    return path


def tokens_of(row):
    return [VOCABULARY[i] for i in row]


def test_jieba_word_is_one_masked_unit(tmp_path):
    task = make_task("jieba")
    features = task.featurize(task.read(str(write_corpus(tmp_path / "c.txt"))), training=True)
    words = 0
    for row, starts in zip(
        features.columns["token_ids"], features.columns["word_starts"], strict=True
    ):
        tokens = tokens_of(row)
        for i in range(len(tokens) - 3):
            if tokens[i : i + 4] == list("北京大学"):
                assert starts[i : i + 4].tolist() == [1, 0, 0, 0]
                words += 1
            if tokens[i : i + 2] in (["我", "爱"], ["the", "film"]):
                assert starts[i : i + 2].tolist() == [1, 1]
    assert words > 0

    batch = pad_batch(features, np.arange(len(features)), (64,))
    seen_whole = 0
    for seed in range(40):
        inputs, _, weights = task.make_batch(batch, True, np.random.default_rng(seed))
        for r in range(len(batch["token_ids"])):
            chosen = set(inputs["mask_positions"][r][weights["mlm"][r] > 0].tolist())
            row_tokens = tokens_of(batch["token_ids"][r])
            for i in (i for i in range(60) if row_tokens[i : i + 4] == list("北京大学")):
                taken = [i + k in chosen for k in range(4)]
                assert all(taken) or not any(taken), (seed, r, i)
                seen_whole += all(taken)
    assert seen_whole > 0


def test_segmented_words_keep_the_instances_and_pieces_mode_stores_nothing(tmp_path):
    corpus = str(write_corpus(tmp_path / "c.txt"))
    by_mode = {}
    for mode in (False, True, "jieba"):
        task = make_task(mode, sequence_length=24)  # rows cut inside sentences, too
        by_mode[mode] = task.featurize(task.read(corpus), training=True).columns
    for mode in (True, "jieba"):
        assert all(
            np.array_equal(a, b)
            for a, b in zip(by_mode[False]["token_ids"], by_mode[mode]["token_ids"], strict=True)
        )
    assert "word_starts" not in by_mode[True] and "word_starts" not in by_mode[False]
    starts = by_mode["jieba"]["word_starts"]
    assert [len(s) for s in starts] == [len(ids) for ids in by_mode["jieba"]["token_ids"]]


def reference_line(sentence):
    """A reference line as run_chinese_ref.py writes one, from jieba's words."""
    tokens = [VOCABULARY[i] for i in WordPieceTokenizer(VOCABULARY, True).tokenize([sentence])[0]]
    flags = chinese_continuations(tokens, jieba_words()(sentence))
    return json.dumps([int(p) + 1 for p in np.flatnonzero(flags)])  # [CLS] is position 0


def reference_task(tmp_path, lines):
    corpus = write_corpus(tmp_path / "c.txt", documents=2)
    reference = tmp_path / "ref.txt"
    reference.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return make_task("reference", CorpusData(str(corpus), train_word_reference=str(reference)))


def test_reference_file_units_equal_the_segmenter_they_came_from(tmp_path):
    assert reference_line("我爱北京大学") == "[4, 5, 6]"
    task = reference_task(tmp_path, [reference_line(line) for line in LINES] * 4)
    from_reference = task.featurize(task.read(task.data.train), training=True).columns
    jieba_task = make_task("jieba")
    from_jieba = jieba_task.featurize(jieba_task.read(task.data.train), training=True).columns
    for name in ("token_ids", "word_starts"):
        assert all(
            np.array_equal(a, b)
            for a, b in zip(from_reference[name], from_jieba[name], strict=True)
        )
    documents = task.read(task.data.train)
    assert documents[1].word_reference[0] == (7, (4, 5, 6))  # line 7 of the reference


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            ["[4, 5, 6]", '{"a": 1}'],
            "ref.txt:2: expected a JSON list of token positions, got '{\"a\": 1}'",
        ),
        (["[4, 5, 6]", "[1, true]"], "ref.txt:2: expected a JSON list of token positions"),
        (["[4, 5, 6]", "[1, 2"], "ref.txt:2: invalid JSON"),
        (["[]"] * 11, "ref.txt: 11 reference lines for the 12 sentences (non-blank lines) of "),
        (["[]"] * 13, "ref.txt:13: 13 reference lines for the 12 sentences"),
    ],
)
def test_bad_reference_lines_are_named_when_read(tmp_path, lines, message):
    task = reference_task(tmp_path, lines)
    with pytest.raises(UserError) as error:
        task.read(task.data.train)
    assert str(error.value).startswith(str(tmp_path / message))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("[7]", "ref.txt:2: position 7 is outside the line's tokens, 1 to 6 ([CLS] is 0)"),
        ("[0]", "ref.txt:2: position 0 is outside the line's tokens, 1 to 6 ([CLS] is 0)"),
        ("[]", None),
    ],
)
def test_reference_positions_are_checked_against_the_tokens(tmp_path, line, message):
    lines = [reference_line(text) for text in LINES] * 4
    lines[1] = line
    task = reference_task(tmp_path, lines)
    documents = task.read(task.data.train)
    if message is None:
        task.featurize(documents, training=True)
        return
    with pytest.raises(UserError) as error:
        task.featurize(documents, training=True)
    assert str(error.value) == str(tmp_path / message)


def test_a_reference_position_at_a_latin_token_is_refused(tmp_path):
    lines = [reference_line(text) for text in LINES] * 4
    lines[2] = "[7]"  # 我爱北京大学 the film: position 7 is "the"
    task = reference_task(tmp_path, lines)
    with pytest.raises(UserError, match=r"ref.txt:3: position 7 is 'the', not a Chinese"):
        task.featurize(task.read(task.data.train), training=True)


def test_option_combinations_are_refused(tmp_path):
    corpus = str(write_corpus(tmp_path / "c.txt"))
    with pytest.raises(UserError) as error:
        make_task("reference", CorpusData(corpus)).read(corpus)
    assert str(error.value) == (
        "data.train_word_reference: task.whole_word_masking: reference needs this file"
    )
    data = CorpusData(corpus, train_word_reference=corpus)
    with pytest.raises(UserError) as error:
        make_task("jieba", data).read(corpus)
    assert str(error.value) == (
        "data.train_word_reference: is read only with task.whole_word_masking: reference"
    )
    recipe = {"schema": 1, "task": {"name": "mlm"}, "backbone": {"preset": "x"}}
    recipe["data"] = {"train": corpus}
    recipe["task"]["whole_word_masking"] = "jieba"
    assert load_recipe(recipe).task_options.whole_word_masking == "jieba"
    recipe["task"]["whole_word_masking"] = "ltp"
    with pytest.raises(UserError, match="expected one of 'jieba', 'reference', got 'ltp'"):
        load_recipe(recipe)


def test_validation_corpus_without_reference_is_said(tmp_path, capsys):
    task = reference_task(tmp_path, [reference_line(line) for line in LINES] * 4)
    other = str(write_corpus(tmp_path / "other.txt", 1))
    documents = task.read(other)
    assert documents[0].word_reference is None
    said = f"{other}: no word reference: its words are pieces with ## continuations\n"
    assert capsys.readouterr().err == said
    features = task.featurize(documents, training=False)
    assert "mask_positions" in features.columns and "word_starts" not in features.columns


def test_the_share_of_multi_character_units_is_said(tmp_path, capsys):
    corpus = str(write_corpus(tmp_path / "c.txt", 40))
    shares = {}
    for mode in (True, "jieba"):
        task = make_task(mode)
        task.featurize(task.read(corpus), training=True)
        line = capsys.readouterr().out.strip().splitlines()[-1]
        name = "pieces" if mode is True else mode
        match = re.fullmatch(
            rf"whole-word masking \({name}\): ([\d.]+)% of masked units span more than one "
            r"character, ([\d.]+) characters a unit \(one masking of \d+ training rows\)",
            line,
        )
        assert match, line
        shares[mode] = float(match[1]), float(match[2])
    # pieces: a Chinese character or a Latin word ("the", "film": more than one character)
    assert 0 < shares[True][0] < shares["jieba"][0] and shares[True][1] < shares["jieba"][1]
    task = make_task(False)
    task.featurize(task.read(corpus), training=True)
    assert "whole-word masking" not in capsys.readouterr().out


def test_missing_jieba_fails_the_run_before_training(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "jieba", None)  # import jieba raises ImportError
    jieba_words.cache_clear()
    checkpoint = write_tiny_checkpoint(tmp_path / "checkpoint", vocabulary=VOCABULARY)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "schema: 1\ntask: {name: mlm, whole_word_masking: jieba}\n"
        f"backbone: {{preset: {checkpoint}, sequence_length: 32}}\n"
        f"data: {{train: {write_corpus(tmp_path / 'c.txt')}}}\n"
        f"output_dir: {tmp_path / 'run'}\n"
    )
    try:
        result = run_bertkit("finetune", str(recipe))
    finally:
        jieba_words.cache_clear()  # the next test loads the real jieba again
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "bertkit: error: task.whole_word_masking: jieba needs the jieba package: "
        "pip install 'bertkit[zh]'"
    ]
    assert not (tmp_path / "run" / "model").exists()


def test_features_file_carries_word_starts(tmp_path):
    from bertkit.training.feature_file import read_feature_file
    from bertkit.training.trainer import featurize

    checkpoint = write_tiny_checkpoint(tmp_path / "checkpoint", vocabulary=VOCABULARY)
    recipe = {
        "schema": 1,
        "task": {"name": "mlm", "whole_word_masking": "jieba", "next_sentence_prediction": False},
        "backbone": {"preset": str(checkpoint), "sequence_length": 32},
        "data": {"train": str(write_corpus(tmp_path / "c.txt", 40))},
    }
    stored = read_feature_file(featurize(recipe, tmp_path / "features.npz"))
    task = make_task("jieba", sequence_length=32)
    documents, _ = task.split_validation(task.read(recipe["data"]["train"]))
    expected = task.featurize(documents, training=True).columns["word_starts"]
    assert all(
        np.array_equal(a, b)
        for a, b in zip(stored.train.columns["word_starts"], expected, strict=True)
    )
