"""Turn Google TensorFlow checkpoints and PyTorch `.bin` files into Hugging Face BERT dirs.

keras-hub's `BertBackbone.from_preset(directory)` loads a Hugging Face directory (config.json,
model.safetensors, vocab.txt, tokenizer_config.json). Other formats are converted into one, so
keras-hub's own converter does the weight porting. Weights get the names of Hugging Face's
`BertForPreTraining`: `bert.` for the encoder (keras-hub finds that prefix by suffix matching)
and `cls.` for the pretraining heads, which a masked-LM task can initialise from.
PyTorch files are read without PyTorch, by an unpickler that allows only a state dict's globals.
"""

from __future__ import annotations

import collections
import hashlib
import json
import pickle
import re
import shutil
import tempfile
import zipfile
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from bertkit.errors import UserError

try:
    import ml_dtypes
except ImportError:  # bfloat16 tensors are then upcast to float32.
    ml_dtypes = None

SAFETENSORS_FILE = "model.safetensors"
TORCH_BIN_FILE = "pytorch_model.bin"
GOOGLE_CONFIG_FILE = "bert_config.json"
VOCAB_FILE = "vocab.txt"
_SAFETENSORS_INDEX = "model.safetensors.index.json"  # Sharded safetensors, read by keras-hub.

# bert_config.json keys, copied as they are into the Hugging Face config.json.
_REQUIRED_CONFIG_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
)
_CONFIG_DEFAULTS = {
    "hidden_act": "gelu",
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "initializer_range": 0.02,
}
_HEAD_NAMES = {
    "cls/predictions/output_bias": "cls.predictions.bias",
    "cls/seq_relationship/output_weights": "cls.seq_relationship.weight",
    "cls/seq_relationship/output_bias": "cls.seq_relationship.bias",
}
_LEAF_NAMES = {"kernel": "weight", "gamma": "weight", "beta": "bias"}
_LAYER_DENSES = (
    "attention/self/query",
    "attention/self/key",
    "attention/self/value",
    "attention/output/dense",
    "intermediate/dense",
    "output/dense",
)
_LAYER_NORMS = ("attention/output/LayerNorm", "output/LayerNorm")
# [CLS], [unused0] or <S> keep their capitals in uncased vocabularies too.
_SPECIAL_TOKEN = re.compile(r"\[[^\]]*\]|<[^>]*>")


def google_variable_to_hf_name(name: str) -> str | None:
    """Hugging Face name of an original Google BERT variable; None for one to skip.

    Skipped: optimizer slots, `global_step`, and anything outside `bert/` and `cls/`
    (such as a fine-tuned classifier's `output_weights`).

    Example:
        >>> google_variable_to_hf_name("bert/encoder/layer_3/attention/self/query/kernel")
        'bert.encoder.layer.3.attention.self.query.weight'
        >>> google_variable_to_hf_name("bert/embeddings/word_embeddings")
        'bert.embeddings.word_embeddings.weight'
        >>> google_variable_to_hf_name("cls/predictions/output_bias")
        'cls.predictions.bias'
        >>> google_variable_to_hf_name("bert/pooler/dense/kernel/adam_m") is None
        True
    """
    parts = name.split("/")
    if parts[0] not in ("bert", "cls") or parts[-1] in ("adam_m", "adam_v", "global_step"):
        return None
    if name in _HEAD_NAMES:
        return _HEAD_NAMES[name]
    parts[-1] = _LEAF_NAMES.get(parts[-1], parts[-1])
    if parts[-1].endswith("_embeddings"):  # An embedding table is one variable, no leaf.
        parts.append("weight")
    return re.sub(r"\.layer_(\d+)\.", r".layer.\1.", ".".join(parts))


def infer_do_lower_case(tokens) -> bool:
    """Whether a WordPiece vocabulary is uncased: only special tokens have capitals.

    Example:
        >>> infer_do_lower_case(["[PAD]", "[CLS]", "<S>", "the", "##ing"])
        True
        >>> infer_do_lower_case(["[PAD]", "[CLS]", "The", "the"])
        False
    """
    words = (token for token in tokens if not _SPECIAL_TOKEN.fullmatch(token))
    return all(word == word.lower() for word in words)


def google_checkpoint_to_hf(source_dir, target_dir, *, do_lower_case=None) -> Path:
    """Converts an original Google BERT checkpoint directory into a Hugging Face one.

    Args:
        source_dir: holds bert_config.json, vocab.txt and a TensorFlow checkpoint
            (`*.ckpt.index` + `*.ckpt.data-*`; a `checkpoint` file picks among several).
        target_dir: receives config.json, model.safetensors, vocab.txt and
            tokenizer_config.json; created if needed.
        do_lower_case: whether the vocabulary is uncased; inferred from vocab.txt if None.

    Returns:
        `target_dir`, ready for `keras_hub.models.BertBackbone.from_preset`.

    Raises:
        UserError: a file is missing or invalid, or a required variable is absent.
    """
    source_dir, target_dir = Path(source_dir), Path(target_dir)
    config_path = _require_file(source_dir, GOOGLE_CONFIG_FILE)
    vocab_path = _require_file(source_dir, VOCAB_FILE)
    if target_dir.resolve() == source_dir.resolve():
        raise UserError("the target directory must differ from the source", source=source_dir)
    config = _hf_config(_load_json(config_path), config_path)
    weights = _read_google_weights(_find_checkpoint(source_dir), config["num_hidden_layers"])
    target_dir.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(target_dir / SAFETENSORS_FILE), metadata={"format": "pt"})
    _write_json(target_dir / "config.json", config)
    shutil.copyfile(vocab_path, target_dir / VOCAB_FILE)
    _write_tokenizer_config(target_dir, config["max_position_embeddings"], do_lower_case)
    return target_dir


def _hf_config(google_config: dict, source: Path) -> dict:
    for key in _REQUIRED_CONFIG_KEYS:
        if key not in google_config:
            raise UserError("missing required key", source=source, key=key)
    merged = {**_CONFIG_DEFAULTS, **google_config}
    values = {key: merged[key] for key in _REQUIRED_CONFIG_KEYS + tuple(_CONFIG_DEFAULTS)}
    # Google's modeling.py names its tanh approximation "gelu"; Hugging Face calls that
    # "gelu_new" and means the exact erf form by "gelu".
    if values["hidden_act"] == "gelu":
        values["hidden_act"] = "gelu_new"
    return {
        "architectures": ["BertForPreTraining"],
        "model_type": "bert",
        **values,
        "pad_token_id": 0,
    }


def weight_shapes(hf_dir) -> dict[str, tuple]:
    """{tensor name: shape} of a Hugging Face folder's safetensors weights (one file or
    shards), read from the files' headers without loading a tensor."""
    from safetensors import safe_open

    hf_dir = Path(hf_dir)
    files = [hf_dir / SAFETENSORS_FILE]
    if not files[0].is_file() and (hf_dir / _SAFETENSORS_INDEX).is_file():
        index = _load_json(hf_dir / _SAFETENSORS_INDEX)
        files = [hf_dir / name for name in sorted(set(index.get("weight_map", {}).values()))]
    shapes = {}
    for path in files:
        with safe_open(str(path), framework="numpy") as tensors:
            shapes.update({name: tuple(tensors.get_slice(name).get_shape())
                           for name in tensors.keys()})
    return shapes


def size_problem(config: dict, key: str, default=None) -> str | None:
    """What is wrong with `config[key]` as a size (a whole number of at least 1), or None.

    Example:
        >>> size_problem({"hidden_size": "768"}, "hidden_size")
        "has '768' as 'hidden_size' (a whole number of at least 1)"
    """
    value = config.get(key, default)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return None
    problem = "lacks" if value is None else f"has {value!r:.40} as"
    return f"{problem} '{key}' (a whole number of at least 1)"


def config_mismatch(config: dict, shapes: dict[str, tuple]) -> str | None:
    """What in a Hugging Face BERT `config.json` is missing or disagrees with the shapes of
    its weights (`weight_shapes`; names with any prefix, such as `bert.`); None if nothing.

    Example:
        >>> config = {"vocab_size": 30, "hidden_size": 8, "num_hidden_layers": 1,
        ...           "num_attention_heads": 2, "intermediate_size": 16,
        ...           "max_position_embeddings": 64}
        >>> shapes = {"bert.embeddings.word_embeddings.weight": (30, 8),
        ...           "bert.encoder.layer.0.output.dense.bias": (8,)}
        >>> config_mismatch(config, shapes) is None
        True
        >>> config_mismatch({**config, "hidden_size": 4}, shapes).split("; ")[1]
        "config.json's vocab_size and hidden_size make it (30, 4)"
        >>> config_mismatch({"vocab_size": 30}, shapes)
        "config.json lacks 'hidden_size' (a whole number of at least 1)"
    """
    for key in (*_REQUIRED_CONFIG_KEYS, "type_vocab_size"):
        problem = size_problem(config, key, 2 if key == "type_vocab_size" else None)
        if problem:
            return f"config.json {problem}"
    hidden = config["hidden_size"]
    if hidden % config["num_attention_heads"]:
        return (f"config.json's hidden_size {hidden} is not a multiple of its "
                f"num_attention_heads {config['num_attention_heads']}")
    for suffix, keys in _SHAPE_KEYS.items():
        expected = tuple(config.get(key, 2) for key in keys)
        found = next((shape for name, shape in shapes.items()
                      if name == suffix or name.endswith("." + suffix)), expected)
        if tuple(found) != expected:
            return (f"config.json does not match the weights: {suffix} has shape "
                    f"{tuple(found)}; config.json's {' and '.join(keys)} make it {expected}")
    layers = {match[1] for name in shapes if (match := re.search(r"layer\.(\d+)\.", name))}
    if layers and len(layers) != config["num_hidden_layers"]:
        return (f"config.json does not match the weights: num_hidden_layers is "
                f"{config['num_hidden_layers']}, the weights have {len(layers)} layers")
    return None


# Weights whose shape the config sets (type_vocab_size defaults to 2, as in transformers).
_SHAPE_KEYS = {
    "embeddings.word_embeddings.weight": ("vocab_size", "hidden_size"),
    "embeddings.position_embeddings.weight": ("max_position_embeddings", "hidden_size"),
    "embeddings.token_type_embeddings.weight": ("type_vocab_size", "hidden_size"),
    "encoder.layer.0.intermediate.dense.weight": ("intermediate_size", "hidden_size"),
}


def _find_checkpoint(source_dir: Path) -> str:
    """The checkpoint prefix (path without `.index`) inside `source_dir`."""
    import tensorflow as tf  # Only Google checkpoints need TensorFlow.

    latest = tf.train.latest_checkpoint(str(source_dir))  # Needs a `checkpoint` file.
    if latest:
        return latest
    indexes = sorted(source_dir.glob("*.index"))
    if not indexes:
        raise UserError("no TensorFlow checkpoint (*.ckpt.index) found", source=source_dir)
    if len(indexes) > 1:
        names = ", ".join(path.name for path in indexes)
        raise UserError(f"several checkpoints ({names}); keep one", source=source_dir)
    return str(indexes[0].with_suffix(""))


def _required_google_variables(num_layers: int) -> list[str]:
    names = [f"bert/embeddings/{kind}_embeddings" for kind in ("word", "position", "token_type")]
    names += [
        "bert/embeddings/LayerNorm/gamma",
        "bert/embeddings/LayerNorm/beta",
        "bert/pooler/dense/kernel",
        "bert/pooler/dense/bias",
    ]
    for index in range(num_layers):
        layer = f"bert/encoder/layer_{index}"
        names += [
            f"{layer}/{dense}/{leaf}" for dense in _LAYER_DENSES for leaf in ("kernel", "bias")
        ]
        names += [f"{layer}/{norm}/{leaf}" for norm in _LAYER_NORMS for leaf in ("gamma", "beta")]
    return names


def _read_google_weights(prefix: str, num_layers: int) -> dict[str, np.ndarray]:
    import tensorflow as tf

    reader = tf.train.load_checkpoint(prefix)
    available = reader.get_variable_to_shape_map()
    missing = [name for name in _required_google_variables(num_layers) if name not in available]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UserError(f"checkpoint has no variable '{missing[0]}'{more}", source=prefix)
    weights = {}
    for name in sorted(available):
        if (hf_name := google_variable_to_hf_name(name)) is not None:
            value = reader.get_tensor(name)
            # TF dense kernels are (in, out); Hugging Face Linear weights are (out, in).
            weights[hf_name] = np.ascontiguousarray(value.T if name.endswith("/kernel") else value)
    return weights


# PyTorch storage classes -> NumPy dtypes without byte order; bfloat16 is read as its bits.
_STORAGE_DTYPES = {
    "FloatStorage": "f4",
    "HalfStorage": "f2",
    "DoubleStorage": "f8",
    "BFloat16Storage": "u2",
    "LongStorage": "i8",
    "IntStorage": "i4",
    "ShortStorage": "i2",
    "CharStorage": "i1",
    "ByteStorage": "u1",
    "BoolStorage": "?",
}


class _StorageType(str):
    """Stands for `torch.FloatStorage` and the like: the storage class name."""


def _rebuild_tensor(storage, storage_offset, size, stride, *_requires_grad_hooks_metadata):
    """`torch._utils._rebuild_tensor_v2` for a 1-D NumPy storage: a strided view, copied."""
    size, stride = tuple(size), tuple(stride)
    if 0 in size:
        return np.zeros(size, storage.dtype)
    extents = [(length - 1) * step for length, step in zip(size, stride, strict=True)]
    last = storage_offset + sum(extents)  # Index of the last element the view reads.
    if storage_offset < 0 or min(stride, default=0) < 0 or last >= storage.size:
        raise pickle.UnpicklingError("a tensor lies outside its storage; the file is corrupt")
    strides = [step * storage.itemsize for step in stride]
    return np.lib.stride_tricks.as_strided(storage[storage_offset:], size, strides).copy()


class _StateDictUnpickler(pickle.Unpickler):
    """Unpickles a PyTorch state dict into NumPy arrays; refuses every other global."""

    def __init__(self, file, load_storage):
        super().__init__(file)
        self._load_storage = load_storage

    def find_class(self, module, name):
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        raise pickle.UnpicklingError(f"refusing to load global '{module}.{name}'")

    def persistent_load(self, pid):
        # ('storage', storage class, key of its file under data/, location, element count)
        if not (isinstance(pid, tuple) and len(pid) == 5 and isinstance(pid[1], _StorageType)):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        return self._load_storage(pid[1], str(pid[2]), int(pid[4]))


def _storage_loader(archive: zipfile.ZipFile, record_dir: str, byteorder: str):
    """A function (storage class, key, element count) -> 1-D array; reads each storage once."""
    cache = {}

    def load(type_name: str, key: str, numel: int) -> np.ndarray:
        if key not in cache:
            dtype = np.dtype(byteorder + _STORAGE_DTYPES[type_name])
            data = archive.read(f"{record_dir}data/{key}")
            if len(data) < numel * dtype.itemsize:
                raise pickle.UnpicklingError(f"storage {key} is truncated; the file is corrupt")
            array = np.frombuffer(data, dtype, count=numel)  # Read-only; tensors copy it.
            if not dtype.isnative:
                array = array.astype(dtype.newbyteorder("="))
            cache[key] = _bfloat16(array) if type_name == "BFloat16Storage" else array
        return cache[key]

    return load


def _bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 values from their uint16 bit patterns (as float32 without ml_dtypes)."""
    if ml_dtypes is not None:
        return bits.view(ml_dtypes.bfloat16)
    return (bits.astype(np.uint32) << 16).view(np.float32)  # The top half of a float32.


def read_torch_bin(bin_path) -> dict[str, np.ndarray]:
    """Reads a PyTorch state dict (zip format, PyTorch >= 1.6) as NumPy arrays, without PyTorch.

    Returns:
        Tensor name -> contiguous array, in the file's order.

    Raises:
        UserError: the file is missing, in the legacy format, or not a plain state dict.
    """
    bin_path = Path(bin_path)
    if not bin_path.is_file():
        raise UserError("no such file", source=bin_path)
    if not zipfile.is_zipfile(bin_path):
        raise UserError(
            "legacy (non-zip) PyTorch format is not supported; re-save the model "
            "with a recent transformers version (save_pretrained)",
            source=bin_path,
        )
    with zipfile.ZipFile(bin_path) as archive:
        names = archive.namelist()
        pickles = [name for name in names if name.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise UserError("not a PyTorch checkpoint (no single data.pkl)", source=bin_path)
        record_dir = pickles[0].removesuffix("data.pkl")
        big_endian = (
            f"{record_dir}byteorder" in names
            and archive.read(f"{record_dir}byteorder").strip() == b"big"
        )
        load_storage = _storage_loader(archive, record_dir, ">" if big_endian else "<")
        with archive.open(pickles[0]) as file:
            try:
                state = _StateDictUnpickler(file, load_storage).load()
            except (pickle.UnpicklingError, EOFError, KeyError, ValueError) as error:
                # Refused globals, and the damage a truncated or edited file shows as.
                raise UserError(str(error), source=bin_path) from None
    if not isinstance(state, dict) or not all(isinstance(v, np.ndarray) for v in state.values()):
        raise UserError("does not hold a flat state dict of tensors", source=bin_path)
    return dict(state)


def torch_bin_to_safetensors(bin_path, target_path) -> Path:
    """Converts a PyTorch `pytorch_model.bin` into a safetensors file; returns `target_path`."""
    target_path = Path(target_path)
    save_file(read_torch_bin(bin_path), str(target_path), metadata={"format": "pt"})
    return target_path


def prepare_hf_dir(source_dir, cache_dir) -> Path:
    """A Hugging Face directory keras-hub can load, converted into `cache_dir` if needed.

    A directory with model.safetensors (or its sharded index) is returned as it is. One
    with pytorch_model.bin, or an original Google checkpoint, is converted once into a
    subdirectory of `cache_dir` keyed by the source's path and file stamps, and reused
    by later calls. The source directory is never modified.

    Raises:
        UserError: the directory holds no supported checkpoint, or converting it failed.
    """
    source_dir, cache_dir = Path(source_dir), Path(cache_dir)
    if not source_dir.is_dir():
        raise UserError("no such directory", source=source_dir)
    if any((source_dir / name).is_file() for name in (SAFETENSORS_FILE, _SAFETENSORS_INDEX)):
        return source_dir
    if (source_dir / TORCH_BIN_FILE).is_file():
        convert = _convert_torch_dir
    elif any(source_dir.glob("*.index")):
        convert = google_checkpoint_to_hf
    else:
        raise UserError(
            f"found no {SAFETENSORS_FILE}, {TORCH_BIN_FILE} or TensorFlow "
            "checkpoint (*.ckpt.index)",
            source=source_dir,
        )
    target = cache_dir / f"{source_dir.name}-{_fingerprint(source_dir)}"
    if not target.is_dir():
        cache_dir.mkdir(parents=True, exist_ok=True)
        # Convert in a scratch directory, then rename: an interrupted conversion never
        # leaves a half-written entry that a later call would trust.
        with tempfile.TemporaryDirectory(dir=cache_dir) as scratch:
            convert(source_dir, Path(scratch) / "converted").rename(target)
    return target


def _convert_torch_dir(source_dir: Path, target_dir: Path) -> Path:
    """Copies the text files (configs, vocabulary) and converts the weights."""
    config = _load_json(_require_file(source_dir, "config.json"))
    shutil.copytree(source_dir, target_dir, ignore=_all_but_text_files)
    torch_bin_to_safetensors(source_dir / TORCH_BIN_FILE, target_dir / SAFETENSORS_FILE)
    # keras-hub reads do_lower_case from tokenizer_config.json, which old checkpoints lack.
    if (target_dir / VOCAB_FILE).is_file() and not (target_dir / "tokenizer_config.json").is_file():
        _write_tokenizer_config(target_dir, config.get("max_position_embeddings"), None)
    return target_dir


def _all_but_text_files(directory: str, names: list[str]) -> list[str]:
    """`shutil.copytree`'s ignore: weights (.bin, .h5, .msgpack...) and hidden entries."""

    def skipped(name: str) -> bool:
        path = Path(directory, name)
        return name.startswith(".") or (path.is_file() and path.suffix not in (".json", ".txt"))

    return [name for name in names if skipped(name)]


def _fingerprint(source_dir: Path) -> str:
    digest = hashlib.sha256(str(source_dir.resolve()).encode())
    for path in sorted(source_dir.iterdir()):
        if path.is_file():
            stat = path.stat()
            digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def _require_file(directory: Path, name: str) -> Path:
    if not (directory / name).is_file():
        raise UserError(f"missing {name}", source=directory)
    return directory / name


def _load_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise UserError(f"invalid JSON: {error.msg}", source=path, line=error.lineno) from None


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _write_tokenizer_config(directory: Path, max_length: int | None, do_lower_case) -> None:
    if do_lower_case is None:
        # One token a line; str.splitlines would also split at \x1c, \u2028 and the like.
        lines = (directory / VOCAB_FILE).read_text(encoding="utf-8").split("\n")
        do_lower_case = infer_do_lower_case(line.rstrip("\r") for line in lines if line)
    _write_json(
        directory / "tokenizer_config.json",
        {
            "do_lower_case": do_lower_case,
            "model_max_length": max_length,
            "tokenizer_class": "BertTokenizer",
        },
    )
