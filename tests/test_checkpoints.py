"""Checkpoint conversion: Google TF checkpoints and PyTorch `.bin` files -> keras-hub."""

from __future__ import annotations

import collections
import hashlib
import io
import json
import pickle
import re
import zipfile

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf
from safetensors.numpy import load_file, save_file

from bertkit.errors import UserError
from bertkit.model import torch_checkpoint
from bertkit.model.checkpoints import prepare_hf_dir
from bertkit.model.google_checkpoint import google_checkpoint_to_hf
from bertkit.model.hf_files import infer_do_lower_case
from bertkit.model.torch_checkpoint import read_torch_bin, torch_bin_to_safetensors
from tests.numpy_bert import gelu, numpy_bert_forward

# keras-hub's BertBackbone uses the tanh GELU, so "gelu_new" makes the comparison exact.
CONFIG = {
    "model_type": "bert",
    "vocab_size": 50,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "hidden_act": "gelu_new",
    "max_position_embeddings": 16,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
}
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{index}" for index in range(45)]
TOKEN_IDS = np.array([[2, 7, 9, 11, 3, 0], [2, 20, 3, 30, 31, 3]], np.int32)
SEGMENT_IDS = np.array([[0, 0, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1]], np.int32)
PADDING_MASK = np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]], np.int32)


def weight_table(config):
    """(Google name, HF name, HF shape, stored transposed in TF), written out independently."""
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    vocab, positions = config["vocab_size"], config["max_position_embeddings"]
    tables = {"word": vocab, "position": positions, "token_type": config["type_vocab_size"]}
    rows = [
        (
            f"bert/embeddings/{kind}_embeddings",
            f"bert.embeddings.{kind}_embeddings.weight",
            (size, hidden),
            False,
        )
        for kind, size in tables.items()
    ]
    rows += [
        ("cls/predictions/output_bias", "cls.predictions.bias", (vocab,), False),
        ("cls/seq_relationship/output_weights", "cls.seq_relationship.weight", (2, hidden), False),
        ("cls/seq_relationship/output_bias", "cls.seq_relationship.bias", (2,), False),
    ]
    # Dense layers: TF kernel (in, out) -> HF weight (out, in).
    denses = [
        ("bert/pooler/dense", "bert.pooler.dense", (hidden, hidden)),
        ("cls/predictions/transform/dense", "cls.predictions.transform.dense", (hidden, hidden)),
    ]
    norms = [
        ("bert/embeddings/LayerNorm", "bert.embeddings.LayerNorm"),
        ("cls/predictions/transform/LayerNorm", "cls.predictions.transform.LayerNorm"),
    ]
    for index in range(config["num_hidden_layers"]):
        google, hf = f"bert/encoder/layer_{index}", f"bert.encoder.layer.{index}"
        denses += [
            (
                f"{google}/attention/{part}",
                f"{hf}.attention.{part.replace('/', '.')}",
                (hidden,) * 2,
            )
            for part in ("self/query", "self/key", "self/value", "output/dense")
        ]
        denses += [
            (f"{google}/intermediate/dense", f"{hf}.intermediate.dense", (inner, hidden)),
            (f"{google}/output/dense", f"{hf}.output.dense", (hidden, inner)),
        ]
        norms += [
            (f"{google}/attention/output/LayerNorm", f"{hf}.attention.output.LayerNorm"),
            (f"{google}/output/LayerNorm", f"{hf}.output.LayerNorm"),
        ]
    for google, hf, shape in denses:
        rows += [
            (f"{google}/kernel", f"{hf}.weight", shape, True),
            (f"{google}/bias", f"{hf}.bias", shape[:1], False),
        ]
    for google, hf in norms:
        rows += [
            (f"{google}/gamma", f"{hf}.weight", (hidden,), False),
            (f"{google}/beta", f"{hf}.bias", (hidden,), False),
        ]
    return rows


def random_state(seed=0):
    """A random HF state dict (with `bert.` prefix and pretraining heads)."""
    rng = np.random.default_rng(seed)
    state = {}
    for _, name, shape, _ in weight_table(CONFIG):
        center = 1.0 if "LayerNorm.weight" in name else 0.0
        state[name] = (center + rng.normal(0.0, 0.2, shape)).astype(np.float32)
    return state


def write_google_checkpoint(directory, state, vocab=VOCAB, drop=()):
    """An original-format checkpoint: TF names, (in, out) kernels, Adam slots, global_step."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {"global_step": np.int64(1000)}
    for google, hf, _, transposed in weight_table(CONFIG):
        if google not in drop:
            tensors[google] = state[hf].T if transposed else state[hf]
            tensors[f"{google}/adam_m"] = tensors[f"{google}/adam_v"] = np.zeros_like(
                tensors[google]
            )
    names = sorted(tensors)
    tf.raw_ops.SaveV2(
        prefix=str(directory / "bert_model.ckpt"),
        tensor_names=names,
        shape_and_slices=[""] * len(names),
        tensors=[tensors[n] for n in names],
    )
    google_config = {
        key: CONFIG[key] for key in CONFIG if key not in ("model_type", "layer_norm_eps")
    }
    (directory / "bert_config.json").write_text(json.dumps(google_config))
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return directory


def keras_hub_outputs(hf_dir):
    backbone = keras_hub.models.BertBackbone.from_preset(str(hf_dir))
    outputs = backbone(
        {"token_ids": TOKEN_IDS, "segment_ids": SEGMENT_IDS, "padding_mask": PADDING_MASK}
    )
    return [
        keras.ops.convert_to_numpy(outputs[key]) for key in ("sequence_output", "pooled_output")
    ]


def assert_matches_reference(hf_dir, state):
    expected = numpy_bert_forward(state, CONFIG, TOKEN_IDS, SEGMENT_IDS, PADDING_MASK)
    for actual, wanted in zip(keras_hub_outputs(hf_dir), expected, strict=True):
        np.testing.assert_allclose(actual, wanted, atol=1e-5, rtol=0)


def snapshot(directory):
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.iterdir())
    }


@pytest.fixture(scope="module")
def google_dir(tmp_path_factory):
    return write_google_checkpoint(
        tmp_path_factory.mktemp("google") / "uncased_L-2_H-32", random_state()
    )


# ---------------------------------------------------------------- the NumPy reference


def test_numpy_reference_matches_keras_hub(tmp_path):
    state = {name.removeprefix("bert."): value for name, value in random_state(seed=1).items()}
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    assert_matches_reference(tmp_path, state)


def test_exact_gelu_uses_erf():
    x = np.array([-1.0, 0.0, 1.0])
    np.testing.assert_allclose(gelu(x, "gelu"), [-0.15865525393145707, 0.0, 0.8413447460685429])
    assert abs(gelu(x, "gelu_new")[2] - gelu(x, "gelu")[2]) > 1e-4


# ---------------------------------------------------------------- Google checkpoints


def test_google_checkpoint_converts_to_the_same_model(google_dir, tmp_path):
    hf_dir = google_checkpoint_to_hf(google_dir, tmp_path / "hf")
    state = random_state()
    converted = load_file(str(hf_dir / "model.safetensors"))
    assert sorted(converted) == sorted(state)  # Heads kept; Adam slots and global_step dropped.
    for name, value in state.items():
        np.testing.assert_array_equal(converted[name], value, err_msg=name)
    config = json.loads((hf_dir / "config.json").read_text())
    assert config["model_type"] == "bert" and config["layer_norm_eps"] == 1e-12
    assert json.loads((hf_dir / "tokenizer_config.json").read_text())["do_lower_case"] is True
    assert (hf_dir / "vocab.txt").read_text() == (google_dir / "vocab.txt").read_text()
    assert_matches_reference(hf_dir, state)


@pytest.mark.parametrize("missing", ["vocab.txt", "bert_config.json"])
def test_google_missing_file_is_named(google_dir, tmp_path, missing):
    source = tmp_path / "source"
    source.mkdir()
    for path in google_dir.iterdir():
        if path.name != missing:
            (source / path.name).write_bytes(path.read_bytes())
    with pytest.raises(UserError, match=re.escape(f"{source}: missing {missing}") + "$"):
        google_checkpoint_to_hf(source, tmp_path / "hf")


def test_google_missing_variable_is_named(tmp_path):
    source = write_google_checkpoint(
        tmp_path / "source", random_state(), drop={"bert/pooler/dense/kernel"}
    )
    with pytest.raises(UserError, match="checkpoint has no variable 'bert/pooler/dense/kernel'$"):
        google_checkpoint_to_hf(source, tmp_path / "hf")


@pytest.mark.parametrize(
    "tokens, expected",
    [
        (["[PAD]", "[unused0]", "[CLS]", "<S>", "hello", "##ing", "é"], True),
        (["[PAD]", "[CLS]", "hello", "Hello"], False),
        (["[PAD]", "ÉCOLE"], False),
    ],
)
def test_infer_do_lower_case(tokens, expected):
    assert infer_do_lower_case(tokens) is expected


# ---------------------------------------------------------------- PyTorch .bin files


class TorchGlobal:
    """A global named as torch's pickles name it, pickled without importing torch."""

    def __init__(self, module, name):
        self.module, self.name = module, name

    def __call__(self, *args):
        raise AssertionError("only pickled, never called")


class FakeStorage:
    def __init__(self, type_name, key, data):
        self.type_name, self.key, self.data = type_name, key, data


class FakeTensor:
    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride


class TorchLikePickler(pickle._Pickler):
    """Writes the opcodes `torch.save` writes: the pure-Python pickler lets us emit
    `GLOBAL torch FloatStorage` for a module that is not installed."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_torch_global(self, obj):
        self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())
        self.memoize(obj)

    dispatch[TorchGlobal] = save_torch_global

    def persistent_id(self, obj):
        if isinstance(obj, FakeStorage):
            return ("storage", TorchGlobal("torch", obj.type_name), obj.key, "cpu", obj.data.size)
        return None

    def reducer_override(self, obj):
        if isinstance(obj, FakeTensor):
            rebuild = TorchGlobal("torch._utils", "_rebuild_tensor_v2")
            return rebuild, (
                obj.storage,
                obj.offset,
                obj.size,
                obj.stride,
                False,
                collections.OrderedDict(),
            )
        return NotImplemented


def write_torch_bin(path, tensors, byteorder="little", pickle_bytes=None):
    """A zip-format `.bin` as torch.save lays it out: archive/data.pkl + archive/data/<key>."""
    state = collections.OrderedDict(tensors)
    state._metadata = collections.OrderedDict({"": {"version": 1}})  # As state_dict() sets.
    if pickle_bytes is None:
        buffer = io.BytesIO()
        TorchLikePickler(buffer, protocol=2).dump(state)
        pickle_bytes = buffer.getvalue()
    storages = {t.storage.key: t.storage for t in tensors.values()}
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle_bytes)
        archive.writestr("archive/byteorder", byteorder)
        for key, storage in storages.items():
            data = storage.data.byteswap() if byteorder == "big" else storage.data
            archive.writestr(f"archive/data/{key}", data.tobytes())
    return path


def contiguous(array, key):
    array = array.copy(order="C")  # np.ascontiguousarray would make a scalar 1-D.
    storage = FakeStorage(TYPE_NAMES[array.dtype.name], key, array.ravel())
    stride = tuple(step // array.itemsize for step in array.strides)
    return FakeTensor(storage, 0, array.shape, stride)


TYPE_NAMES = {
    "float32": "FloatStorage",
    "float16": "HalfStorage",
    "int64": "LongStorage",
    "int32": "IntStorage",
    "uint8": "ByteStorage",
    "bool": "BoolStorage",
    "uint16": "BFloat16Storage",
}
MATRIX = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
BFLOAT16_VALUES = np.array([1.0, -2.5, 0.15625, 2.0**100], np.float32)


def mixed_tensors():
    """Expected arrays and the fake tensors that store them, in every layout we handle."""
    matrix = contiguous(MATRIX, "0")
    halves = FakeStorage("HalfStorage", "1", np.arange(10, dtype=np.float16))
    bfloat_bits = (BFLOAT16_VALUES.view(np.uint32) >> 16).astype(np.uint16)
    cases = {
        "matrix": (MATRIX, matrix),
        "transposed": (MATRIX.T, FakeTensor(matrix.storage, 0, (4, 3), (1, 4))),  # Shares "0".
        "offset": (
            np.arange(3, 7, dtype=np.float16).reshape(2, 2),
            FakeTensor(halves, 3, (2, 2), (2, 1)),
        ),
        "bfloat16": (BFLOAT16_VALUES, contiguous(bfloat_bits, "2")),
        "int64": (np.array([[1, -2], [3, 2**40]], np.int64), None),
        "int32": (np.array([5, -6], np.int32), None),
        "uint8": (np.array([0, 255], np.uint8), None),
        "bool": (np.array([True, False, True]), None),
        "scalar": (np.array(7, np.int64), None),
        "empty": (np.zeros((0, 3), np.float32), None),
    }
    return {
        name: (expected, tensor if tensor is not None else contiguous(expected, str(index + 3)))
        for index, (name, (expected, tensor)) in enumerate(cases.items())
    }


@pytest.mark.parametrize("byteorder", ["little", "big"])
def test_torch_bin_round_trips_every_layout(tmp_path, byteorder):
    cases = mixed_tensors()
    path = write_torch_bin(
        tmp_path / "pytorch_model.bin", {n: t for n, (_, t) in cases.items()}, byteorder
    )
    target = torch_bin_to_safetensors(path, tmp_path / "model.safetensors")
    read = read_torch_bin(path)
    assert list(read) == list(cases)  # The file's order; safetensors sorts its own.
    for loaded in (read, load_file(str(target))):
        assert sorted(loaded) == sorted(cases)
        for name, (expected, _) in cases.items():
            actual = loaded[name].astype(np.float32) if name == "bfloat16" else loaded[name]
            np.testing.assert_array_equal(actual, expected, err_msg=name)
            assert actual.shape == expected.shape and actual.dtype == expected.dtype, name
    assert read["bfloat16"].dtype.name == "bfloat16"


def test_torch_bin_bfloat16_without_ml_dtypes(tmp_path, monkeypatch):
    monkeypatch.setattr(torch_checkpoint, "ml_dtypes", None)
    cases = mixed_tensors()
    path = write_torch_bin(tmp_path / "model.bin", {"bfloat16": cases["bfloat16"][1]})
    loaded = read_torch_bin(path)["bfloat16"]
    assert loaded.dtype == np.float32
    np.testing.assert_array_equal(loaded, BFLOAT16_VALUES)


def test_torch_bin_refuses_other_globals(tmp_path):
    evil = b"cos\nsystem\n(S'touch " + str(tmp_path / "pwned").encode() + b"'\ntR."
    path = write_torch_bin(tmp_path / "evil.bin", {}, pickle_bytes=evil)
    with pytest.raises(UserError, match="refusing to load global 'os.system'"):
        read_torch_bin(path)
    assert not (tmp_path / "pwned").exists()


def test_torch_bin_tensor_outside_its_storage_is_reported(tmp_path):
    storage = FakeStorage("FloatStorage", "0", np.zeros(6, np.float32))
    path = write_torch_bin(tmp_path / "bad.bin", {"x": FakeTensor(storage, 3, (2, 2), (2, 1))})
    with pytest.raises(UserError, match=r"bad\.bin: a tensor lies outside its storage"):
        read_torch_bin(path)


def test_legacy_torch_bin_is_rejected(tmp_path):
    path = tmp_path / "pytorch_model.bin"
    path.write_bytes(pickle.dumps({"magic": 119547037146038801333356}, protocol=2))
    with pytest.raises(UserError, match="legacy .*re-save the model with a recent transformers"):
        read_torch_bin(path)


# ---------------------------------------------------------------- prepare_hf_dir


def test_prepare_keeps_a_safetensors_dir(tmp_path):
    save_file({"x": np.zeros(2, np.float32)}, str(tmp_path / "model.safetensors"))
    assert prepare_hf_dir(tmp_path, tmp_path / "cache") == tmp_path
    assert not (tmp_path / "cache").exists()


def test_prepare_converts_a_torch_dir_without_touching_it(tmp_path):
    source, state = tmp_path / "cased-bert", random_state(seed=2)
    source.mkdir()
    write_torch_bin(
        source / "pytorch_model.bin",
        {name: contiguous(value, str(i)) for i, (name, value) in enumerate(state.items())},
    )
    (source / "config.json").write_text(json.dumps(CONFIG))
    (source / "vocab.txt").write_text("\n".join(VOCAB + ["Paris"]) + "\n")
    before = snapshot(source)
    hf_dir = prepare_hf_dir(source, tmp_path / "cache")
    assert snapshot(source) == before and hf_dir.parent == tmp_path / "cache"
    assert sorted(path.name for path in hf_dir.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    converted = load_file(str(hf_dir / "model.safetensors"))
    assert all(np.array_equal(converted[name], value) for name, value in state.items())
    assert json.loads((hf_dir / "tokenizer_config.json").read_text())["do_lower_case"] is False
    assert prepare_hf_dir(source, tmp_path / "cache") == hf_dir  # Converted once, then reused.


def test_prepare_converts_a_google_dir_without_touching_it(google_dir, tmp_path):
    before = snapshot(google_dir)
    hf_dir = prepare_hf_dir(google_dir, tmp_path / "cache")
    assert snapshot(google_dir) == before
    assert (hf_dir / "model.safetensors").is_file() and hf_dir.parent == tmp_path / "cache"
    assert [path.name for path in (tmp_path / "cache").iterdir()] == [
        hf_dir.name
    ]  # No scratch left.


def test_prepare_names_what_it_expected(tmp_path):
    with pytest.raises(UserError, match="found no model.safetensors, pytorch_model.bin or"):
        prepare_hf_dir(tmp_path, tmp_path / "cache")
