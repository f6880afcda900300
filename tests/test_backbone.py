"""Backbone loading: same outputs as the source checkpoint, every source kind, clear errors."""

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from bertkit.errors import UserError
from bertkit.model.backbone import (
    load_architecture,
    load_pretrained,
    save_architecture,
    save_preset,
)
from bertkit.testing import random_bert_state, write_tiny_checkpoint
from tests.numpy_bert import numpy_bert_forward

TOKEN_IDS = np.array([[2, 7, 8, 9, 30, 3, 0, 0], [2, 11, 12, 3, 13, 14, 15, 3]], dtype=np.int32)
SEGMENT_IDS = np.array([[0] * 8, [0, 0, 0, 0, 1, 1, 1, 1]], dtype=np.int32)
PADDING_MASK = np.array([[1] * 6 + [0, 0], [1] * 8], dtype=np.int32)


def outputs(backbone):
    result = backbone(
        {"token_ids": TOKEN_IDS, "segment_ids": SEGMENT_IDS, "padding_mask": PADDING_MASK}
    )
    return np.asarray(result["sequence_output"]), np.asarray(result["pooled_output"])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny HF checkpoint with exact GELU and weights large enough for GELU variants to differ."""
    folder = write_tiny_checkpoint(tmp_path_factory.mktemp("hf"), hidden_act="gelu")
    config = json.loads((folder / "config.json").read_text())
    state = random_bert_state(config, seed=3)
    for name in state:
        if "intermediate.dense.weight" in name:
            state[name] = state[name] * 60  # pre-activations of several units
    save_file(state, str(folder / "model.safetensors"))
    return folder, config, state


def test_hugging_face_folder_matches_its_source_with_exact_gelu(checkpoint):
    folder, config, state = checkpoint
    loaded = load_pretrained(str(folder), sequence_length=64)
    expected_sequence, expected_pooled = numpy_bert_forward(
        state, config, TOKEN_IDS, SEGMENT_IDS, PADDING_MASK
    )
    sequence, pooled = outputs(loaded.backbone)
    mask = PADDING_MASK.astype(bool)
    np.testing.assert_allclose(sequence[mask], expected_sequence[mask], atol=2e-5)
    np.testing.assert_allclose(pooled, expected_pooled, atol=2e-5)
    tanh_sequence, _ = numpy_bert_forward(
        state, {**config, "hidden_act": "gelu_new"}, TOKEN_IDS, SEGMENT_IDS, PADDING_MASK
    )
    assert np.abs(tanh_sequence - expected_sequence)[mask].max() > 1e-4  # the fix matters here
    assert loaded.tokenizer.lowercase and loaded.hidden_act == "gelu"


def test_keras_hub_preset_folder_and_run_architecture_round_trip(checkpoint, tmp_path):
    loaded = load_pretrained(str(checkpoint[0]), sequence_length=64)
    expected = outputs(loaded.backbone)
    save_preset(loaded.backbone, loaded.tokenizer, loaded.hidden_act, tmp_path / "preset")
    again = load_pretrained(str(tmp_path / "preset"), sequence_length=64)
    np.testing.assert_allclose(outputs(again.backbone)[0], expected[0], atol=1e-6)
    assert again.tokenizer.vocabulary == loaded.tokenizer.vocabulary
    save_architecture(loaded, tmp_path / "arch")
    rebuilt = load_architecture(tmp_path / "arch")
    rebuilt.backbone.set_weights(loaded.backbone.get_weights())
    np.testing.assert_allclose(outputs(rebuilt.backbone)[0], expected[0], atol=1e-6)


def test_pytorch_bin_folder_loads_without_torch(checkpoint, tmp_path):
    from tests.test_checkpoints import FakeStorage, FakeTensor, write_torch_bin

    folder, config, state = checkpoint
    tensors = {
        name: FakeTensor(
            FakeStorage("FloatStorage", str(i), value.ravel()),
            0,
            value.shape,
            tuple(s // 4 for s in value.strides),
        )
        for i, (name, value) in enumerate(state.items())
    }
    source = tmp_path / "bin"
    source.mkdir()
    for name in ("config.json", "vocab.txt", "tokenizer_config.json"):
        (source / name).write_text((folder / name).read_text())
    write_torch_bin(source / "pytorch_model.bin", tensors)
    loaded = load_pretrained(str(source), sequence_length=64)
    np.testing.assert_allclose(
        outputs(loaded.backbone)[1],
        numpy_bert_forward(state, config, TOKEN_IDS, SEGMENT_IDS, PADDING_MASK)[1],
        atol=2e-5,
    )
    assert sorted(p.name for p in source.iterdir()) == [
        "config.json",
        "pytorch_model.bin",
        "tokenizer_config.json",
        "vocab.txt",
    ]


def test_package_scheme_finds_folders_inside_installed_packages():
    with pytest.raises(UserError, match="backbone.preset: no installed Python package 'nope_pkg'"):
        load_pretrained("package:nope_pkg/model", sequence_length=8)
    with pytest.raises(UserError, match="holds no BERT checkpoint"):
        load_pretrained("package:bertkit/../tests", sequence_length=8)


@pytest.mark.parametrize(
    "preset, kwargs, message",
    [
        (
            "bert_tiny_en_uncasd",
            {},
            "unknown preset 'bert_tiny_en_uncasd'; did you mean 'bert_tiny_en_uncased'?",
        ),
        ("./missing-folder", {}, "'./missing-folder' is not a folder"),
    ],
)
def test_preset_errors(preset, kwargs, message):
    with pytest.raises(UserError, match=message):
        load_pretrained(preset, sequence_length=64, **kwargs)


def test_sequence_length_and_lowercase_errors(checkpoint):
    folder = str(checkpoint[0])
    with pytest.raises(
        UserError, match="backbone.sequence_length: 512 is more than the model's 128 positions"
    ):
        load_pretrained(folder, sequence_length=512)
    with pytest.raises(
        UserError, match="backbone.lowercase: lowercase: false contradicts the uncased"
    ):
        load_pretrained(folder, sequence_length=64, lowercase=False)


def test_google_checkpoint_folder_uses_googles_tanh_gelu(tmp_path):
    import tests.test_checkpoints as google

    state = google.random_state()
    source = google.write_google_checkpoint(tmp_path / "google", state)
    config = json.loads((source / "bert_config.json").read_text())
    (source / "bert_config.json").write_text(json.dumps({**config, "hidden_act": "gelu"}))
    loaded = load_pretrained(str(source), sequence_length=16)
    assert loaded.hidden_act == "gelu_new"  # Google's modeling.py "gelu" is the tanh form
    result = loaded.backbone(
        {
            "token_ids": google.TOKEN_IDS,
            "segment_ids": google.SEGMENT_IDS,
            "padding_mask": google.PADDING_MASK,
        }
    )
    expected = numpy_bert_forward(
        state,
        {**google.CONFIG, "hidden_act": "gelu_new"},
        google.TOKEN_IDS,
        google.SEGMENT_IDS,
        google.PADDING_MASK,
    )
    np.testing.assert_allclose(np.asarray(result["pooled_output"]), expected[1], atol=1e-5)


def test_hugging_face_config_sets_segment_count_and_dropout(tmp_path):
    from safetensors.numpy import load_file

    folder = write_tiny_checkpoint(tmp_path / "hf", type_vocab_size=3, hidden_dropout_prob=0.2)
    loaded = load_pretrained(str(folder), sequence_length=64)
    segments = loaded.backbone.get_layer("segment_embedding").embeddings.numpy()
    state = load_file(str(folder / "model.safetensors"))
    expected = state["embeddings.token_type_embeddings.weight"]
    np.testing.assert_array_equal(segments, expected)  # all three segment rows
    assert loaded.backbone.dropout == 0.2


def test_loading_skips_the_random_draw_and_needs_every_weight(checkpoint, tmp_path):
    import keras

    folder, config, state = checkpoint
    loaded = load_pretrained(str(folder), sequence_length=64)  # zeros drawn, all overwritten
    embeddings = loaded.backbone.get_layer("token_embedding").embeddings
    np.testing.assert_array_equal(
        np.asarray(embeddings), state["embeddings.word_embeddings.weight"]
    )
    assert np.std(np.asarray(keras.initializers.TruncatedNormal(0.02)((1000,)))) > 0.01

    partial = write_tiny_checkpoint(tmp_path / "partial", hidden_act="gelu")
    save_file(
        {name: value for name, value in state.items() if "pooler" not in name},
        str(partial / "model.safetensors"),
    )
    with pytest.raises(UserError, match="cannot read the weights"):
        load_pretrained(str(partial), sequence_length=64)  # never a zero pooler


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"hidden_size": 64},
            "config.json does not match the weights: "
            "embeddings.word_embeddings.weight has shape ({vocab}, 32); "
            "config.json's vocab_size and hidden_size make it ({vocab}, 64)",
        ),
        (
            {"intermediate_size": 48},
            "encoder.layer.0.intermediate.dense.weight has shape (64, 32); "
            "config.json's intermediate_size and hidden_size make it (48, 32)",
        ),
        ({"type_vocab_size": 3}, "embeddings.token_type_embeddings.weight has shape (2, 32)"),
        (
            {"num_hidden_layers": 3},
            "config.json does not match the weights: num_hidden_layers is 3, "
            "the weights have 2 layers",
        ),
        (
            {"num_attention_heads": 5},
            "config.json's hidden_size 32 is not a multiple of its num_attention_heads 5",
        ),
        (
            {"num_attention_heads": None},
            "config.json lacks 'num_attention_heads' (a whole number of at least 1)",
        ),
        ({"vocab_size": "many"}, "config.json has 'many' as 'vocab_size'"),
    ],
    ids=["hidden", "intermediate", "segments", "layers", "heads", "no heads", "text"],
)
def test_a_config_json_that_disagrees_with_its_weights_is_one_line(tmp_path, change, message):
    import re

    folder = write_tiny_checkpoint(tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text())
    message = message.format(vocab=config["vocab_size"])
    config = {key: value for key, value in {**config, **change}.items() if value is not None}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=f"backbone.preset: '{folder}': .*" + re.escape(message)):
        load_pretrained(str(folder), sequence_length=64)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda config: config["bert_backbone"].pop("num_heads"),
            "backbone.json: bert_backbone: lacks 'num_heads' (a whole number of at least 1)",
        ),
        (
            lambda config: config["bert_backbone"].update(hidden_dim=30),
            "backbone.json: bert_backbone: hidden_dim 30 is not a multiple of num_heads 4",
        ),
        (
            lambda config: config["bert_backbone"].update(dropout="high"),
            "backbone.json: bert_backbone: cannot rebuild the backbone: ",
        ),
        (
            lambda config: config.pop("hidden_act"),
            "backbone.json: lacks 'hidden_act' (the feed-forward activation)",
        ),
        (
            lambda config: config.pop("bert_backbone"),
            "backbone.json: lacks 'bert_backbone' (keras-hub's BertBackbone config)",
        ),
    ],
    ids=["no heads", "heads", "dropout", "no activation", "no backbone"],
)
def test_a_run_backbone_json_that_lacks_keys_is_one_line(checkpoint, tmp_path, change, message):
    save_architecture(load_pretrained(str(checkpoint[0]), sequence_length=64), tmp_path)
    config = json.loads((tmp_path / "backbone.json").read_text())
    change(config)
    (tmp_path / "backbone.json").write_text(json.dumps(config))
    with pytest.raises(UserError) as caught:
        load_architecture(tmp_path)
    assert str(caught.value).startswith(f"{tmp_path}/{message}")
