"""Vocabulary checks: cased settings without capitals lowercased, characters the vocabulary
lacks mapped to their equivalents (offsets kept, same in a SavedModel), the [UNK] share."""

import json
from types import SimpleNamespace

import pytest
import tensorflow as tf

import bertkit
from bertkit.errors import UserError
from bertkit.model.backbone import load_pretrained
from bertkit.model.tokenizer import WordPieceTokenizer, character_offsets
from bertkit.model.vocabulary_checks import punctuation_equivalents
from bertkit.recipes.recipe import load_recipe
from bertkit.testing import tiny_vocabulary, write_sentiment_tsv, write_tiny_checkpoint
from bertkit.training.feature_file_data import check_vocabulary, vocabulary_of
from bertkit.training.task_data import TaskData

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCABULARY = SPECIAL + ["paris", "ok", "a", "b", "'", '"', "-", ".", "”", "Paris"] + list("ioprs")
LOWERCASED = (
    "tokenizer_config.json says do_lower_case: false, but vocab.txt has no capital letters: "
    "lowercasing (backbone.lowercase: false keeps the text cased)"
)


def pieces(tokenizer, text):
    return [tokenizer.vocabulary[i] for i in tokenizer.tokenize(tf.constant([text])).to_list()[0]]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("vocabulary") / "tiny")


def with_lower_case_setting(folder, value):
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": value}))
    return folder


def test_cased_settings_and_a_vocabulary_without_capitals_are_lowercased(checkpoint, capsys):
    with_lower_case_setting(checkpoint, False)
    try:
        loaded = load_pretrained(str(checkpoint), sequence_length=16)
        assert loaded.tokenizer.lowercase
        assert capsys.readouterr().out.splitlines() == [LOWERCASED]
        assert pieces(loaded.tokenizer, "Good Film") == ["good", "film"]
        kept = load_pretrained(str(checkpoint), sequence_length=16, lowercase=False)
        assert not kept.tokenizer.lowercase and capsys.readouterr().out == ""
    finally:
        with_lower_case_setting(checkpoint, True)


def test_cased_settings_of_a_cased_vocabulary_stay_cased(tmp_path, capsys):
    cased = tiny_vocabulary() + [f"Word{i}" for i in range(40)]
    folder = with_lower_case_setting(
        write_tiny_checkpoint(tmp_path / "cased", vocabulary=cased), False
    )
    assert not load_pretrained(str(folder), sequence_length=16).tokenizer.lowercase
    assert capsys.readouterr().out == ""


def test_equivalents_are_mapped_only_where_the_vocabulary_lacks_them():
    table = punctuation_equivalents(VOCABULARY, lowercase=True)
    assert table["“"] == '"' and table["‘"] == table["’"] == "'" and table["—"] == "-"
    assert table["…"] == "..." and table["ｏ"] == "o" and table["ａ"] == "a"
    assert "”" not in table  # a piece of its own
    assert "ｚ" not in table  # "z" is not in the vocabulary
    assert "ⅶ" not in table  # nor "v" and "i"
    cased = punctuation_equivalents(VOCABULARY, lowercase=False)
    assert cased["“"] == '"' and "Ｐ" not in cased  # cased "P" is not a piece
    tokenizer = WordPieceTokenizer(VOCABULARY, lowercase=True, normalize_punctuation=True)
    assert pieces(tokenizer, "“Ｐａｒｉｓ” — ok…") == ['"', "paris", "”", "-", "ok", ".", ".", "."]


def test_offsets_of_mapped_characters_cut_the_original_text():
    tokenizer = WordPieceTokenizer(VOCABULARY, lowercase=True, normalize_punctuation=True)
    text = "Zoë said “Paris”—ok… ‘Ｐａｒｉｓ’"
    ids, byte_starts, byte_ends = tokenizer.words_with_offsets(tf.constant([text]))
    starts, ends = character_offsets(text, byte_starts.to_list()[0], byte_ends.to_list()[0])
    words = [text[s:e] for s, e in zip(starts, ends, strict=True)]
    assert words == ["Zoë", "said", "“", "Paris", "”", "—", "ok", "…", "…", "…"] + [
        "‘",
        "Ｐａｒｉｓ",
        "’",
    ]
    # the entity (or answer) "Paris" inside curly quotes is cut exactly from the original
    paris = text.index("Paris")
    assert (starts[3], ends[3]) == (paris, paris + 5)
    assert [[tokenizer.vocabulary[i] for i in word] for word in ids.to_list()[0]][2:] == [
        ['"'],
        ["paris"],
        ["”"],
        ["-"],
        ["ok"],
        ["."],
        ["."],
        ["."],
        ["'"],
        ["paris"],
        ["'"],
    ]


def test_the_saved_model_graph_normalizes_as_python_does(tmp_path):
    tokenizer = WordPieceTokenizer(VOCABULARY, lowercase=True, normalize_punctuation=True)
    texts = tf.constant(["“Paris”—ok…", "", "‘ａ’ b\x07 ⅶ", "Ｐａｒｉｓ"])
    expected = [t.to_list() for t in tokenizer.tokenize_with_offsets(texts)]
    assert expected[0][0] == [10, 5, 13, 11, 6, 12, 12, 12]
    module = tf.Module()
    module.normalizer, module.pieces = tokenizer.normalizer, tokenizer.fast_tokenizer
    module.serve = tf.function(
        lambda t: [r.to_tensor(-1) for r in tokenizer.tokenize_with_offsets(t)],
        input_signature=[tf.TensorSpec([None], tf.string)],
    )
    tf.saved_model.save(module, str(tmp_path))
    served = tf.saved_model.load(str(tmp_path)).serve(texts)
    for got, want in zip(served, expected, strict=True):
        assert [[v for v in row if v != -1] for row in got.numpy().tolist()] == want


def test_off_it_looks_characters_up_as_they_are():
    tokenizer = WordPieceTokenizer(VOCABULARY, lowercase=True)
    assert not tokenizer.normalize_punctuation
    assert pieces(tokenizer, "“Paris”—ok") == ["[UNK]", "paris", "”", "[UNK]", "ok"]


def test_the_recipe_setting_reaches_the_tokenizer(checkpoint, capsys):
    def tokenizer(**backbone):
        recipe = load_recipe(
            {
                "schema": 1,
                "task": "classification",
                "backbone": {"preset": str(checkpoint), "sequence_length": 16, **backbone},
                "data": {"train": "train.tsv"},
            }
        )
        return TaskData._backbone(recipe, load_pretrained).tokenizer

    assert tokenizer().normalize_punctuation  # on by default for new runs
    assert not tokenizer(normalize_punctuation=False).normalize_punctuation


def test_saved_setting_loads_and_a_tokenizer_saved_before_it_loads_off(tmp_path):
    WordPieceTokenizer(VOCABULARY, lowercase=True, normalize_punctuation=True).save(tmp_path)
    assert WordPieceTokenizer.load(tmp_path).normalize_punctuation
    (tmp_path / "tokenizer.json").write_text(json.dumps({"lowercase": True}))  # an old run
    old = WordPieceTokenizer.load(tmp_path)
    assert old.lowercase and not old.normalize_punctuation
    assert pieces(old, "“ok”") == ["[UNK]", "ok", "”"]


def test_a_features_file_made_before_the_setting_is_one_made_with_it_off():
    def pretrained(normalize_punctuation):
        tokenizer = WordPieceTokenizer(VOCABULARY, True, normalize_punctuation)
        return SimpleNamespace(tokenizer=tokenizer, backbone=SimpleNamespace(num_segments=2))

    stored = vocabulary_of(pretrained(False))
    del stored["normalize_punctuation"]
    check_vocabulary(stored, pretrained(False), "old.npz")
    with pytest.raises(UserError, match="another backbone.normalize_punctuation than"):
        check_vocabulary(stored, pretrained(True), "old.npz")


def test_unknown_share_is_said_and_recorded(tmp_path, capsys):
    write_tiny_checkpoint(tmp_path / "tiny")
    write_sentiment_tsv(tmp_path / "train.tsv", 32)
    recipe = {
        "schema": 1,
        "task": "classification",
        "backbone": {"preset": str(tmp_path / "tiny"), "sequence_length": 32},
        "data": {"train": str(tmp_path / "train.tsv"), "text": "sentence"},
        "training": {"epochs": 1, "batch_size": 16},
    }
    data = TaskData.read(load_recipe(recipe))
    out, err = capsys.readouterr()
    counted = data.unknown_pieces
    assert counted.unknown == 0 and counted.pieces > 100
    assert f"[UNK]: 0.0% of the training data's {counted.pieces:,} word pieces" in out
    assert "warning" not in err


def test_over_five_percent_unknown_warns_with_the_characters_and_the_cause(tmp_path, capsys):
    write_tiny_checkpoint(tmp_path / "tiny")  # its vocabulary has no Chinese characters
    rows = ["北京很好 good", "上海不好 bad", "北京的 film good", "上海 bad"] * 6
    labels = ["positive", "negative"] * 12
    lines = ["sentence\tlabel", *(f"{r}\t{lab}" for r, lab in zip(rows, labels, strict=True))]
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n")
    recipe = {
        "schema": 1,
        "task": "classification",
        "backbone": {"preset": str(tmp_path / "tiny"), "sequence_length": 32},
        "data": {"train": str(tmp_path / "train.tsv"), "text": "sentence"},
        "training": {"epochs": 1, "batch_size": 8},
    }
    bertkit.finetune(recipe, output_dir=tmp_path / "run", verbose=0)
    out, err = capsys.readouterr()
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    recorded = run["unknown_pieces"]
    # the training rows are the split-off part of the 24 examples: counted, not assumed
    assert recorded["unknown"] > 0.5 * recorded["pieces"]
    share = recorded["unknown"] / recorded["pieces"]
    assert f"[UNK]: {share:.1%} of the training data's {recorded['pieces']:,} word pieces" in out
    [warning] = [line for line in err.splitlines() if "[UNK]" in line]
    assert warning.startswith(f"bertkit: warning: {share:.1%} of the training data's word pieces")
    assert "(most often: 北 " in warning and "上 " in warning
    assert warning.endswith(
        "the vocabulary lacks most Chinese characters: use a Chinese checkpoint's vocabulary"
    )
