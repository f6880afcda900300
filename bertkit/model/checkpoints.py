"""Checkpoints as Hugging Face BERT directories keras-hub loads, and their config checks.

keras-hub's `BertBackbone.from_preset(directory)` loads a Hugging Face directory (config.json,
model.safetensors, vocab.txt, tokenizer_config.json). Other formats are converted into one
(`prepare_hf_dir`), so keras-hub's own converter does the weight porting: original Google
TensorFlow checkpoints (`bertkit.model.google_checkpoint`) and PyTorch `.bin` files
(`bertkit.model.torch_checkpoint`). `config_mismatch` checks a directory's config.json
against its weights' shapes before keras-hub builds a model from it.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
from pathlib import Path

from bertkit.errors import UserError
from bertkit.model.google_checkpoint import google_checkpoint_to_hf
from bertkit.model.hf_files import (
    REQUIRED_CONFIG_KEYS,
    SAFETENSORS_FILE,
    SAFETENSORS_INDEX,
    TORCH_BIN_FILE,
    VOCAB_FILE,
    load_json,
    missing_weights,
    require_file,
    write_tokenizer_config,
)
from bertkit.model.torch_checkpoint import torch_bin_to_safetensors


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
    if any((source_dir / name).is_file() for name in (SAFETENSORS_FILE, SAFETENSORS_INDEX)):
        return source_dir
    if problem := missing_weights(source_dir):
        raise UserError(problem, source=source_dir)
    torch = (source_dir / TORCH_BIN_FILE).is_file()
    convert = _convert_torch_dir if torch else google_checkpoint_to_hf
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
    config = load_json(require_file(source_dir, "config.json"))
    shutil.copytree(source_dir, target_dir, ignore=_all_but_text_files)
    torch_bin_to_safetensors(source_dir / TORCH_BIN_FILE, target_dir / SAFETENSORS_FILE)
    # keras-hub reads do_lower_case from tokenizer_config.json, which old checkpoints lack.
    if (target_dir / VOCAB_FILE).is_file() and not (target_dir / "tokenizer_config.json").is_file():
        write_tokenizer_config(target_dir, config.get("max_position_embeddings"), None)
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


def weight_shapes(hf_dir) -> dict[str, tuple]:
    """{tensor name: shape} of a Hugging Face folder's safetensors weights (one file or
    shards), read from the files' headers without loading a tensor."""
    from safetensors import safe_open

    hf_dir = Path(hf_dir)
    files = [hf_dir / SAFETENSORS_FILE]
    if not files[0].is_file() and (hf_dir / SAFETENSORS_INDEX).is_file():
        index = load_json(hf_dir / SAFETENSORS_INDEX)
        files = [hf_dir / name for name in sorted(set(index.get("weight_map", {}).values()))]
    shapes = {}
    for path in files:
        with safe_open(str(path), framework="numpy") as tensors:
            shapes.update(
                {name: tuple(tensors.get_slice(name).get_shape()) for name in tensors.keys()}
            )
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
    return (
        _size_mismatch(config) or _shape_mismatch(config, shapes) or _layer_mismatch(config, shapes)
    )


def _size_mismatch(config: dict) -> str | None:
    """A size that is missing or not a whole number of at least 1, or a hidden size the
    attention heads do not divide; None if the sizes are sound."""
    for key in (*REQUIRED_CONFIG_KEYS, "type_vocab_size"):
        problem = size_problem(config, key, 2 if key == "type_vocab_size" else None)
        if problem:
            return f"config.json {problem}"
    hidden = config["hidden_size"]
    if hidden % config["num_attention_heads"]:
        return (
            f"config.json's hidden_size {hidden} is not a multiple of its "
            f"num_attention_heads {config['num_attention_heads']}"
        )
    return None


def _shape_mismatch(config: dict, shapes: dict[str, tuple]) -> str | None:
    """The first weight of `_SHAPE_KEYS` whose shape the config's sizes contradict."""
    for suffix, keys in _SHAPE_KEYS.items():
        expected = tuple(config.get(key, 2) for key in keys)
        found = next(
            (
                shape
                for name, shape in shapes.items()
                if name == suffix or name.endswith("." + suffix)
            ),
            expected,
        )
        if tuple(found) != expected:
            return (
                f"config.json does not match the weights: {suffix} has shape "
                f"{tuple(found)}; config.json's {' and '.join(keys)} make it {expected}"
            )
    return None


def _layer_mismatch(config: dict, shapes: dict[str, tuple]) -> str | None:
    """A `num_hidden_layers` other than the number of layers the weights have."""
    layers = {match[1] for name in shapes if (match := re.search(r"layer\.(\d+)\.", name))}
    if layers and len(layers) != config["num_hidden_layers"]:
        return (
            f"config.json does not match the weights: num_hidden_layers is "
            f"{config['num_hidden_layers']}, the weights have {len(layers)} layers"
        )
    return None


# Weights whose shape the config sets (type_vocab_size defaults to 2, as in transformers).
_SHAPE_KEYS = {
    "embeddings.word_embeddings.weight": ("vocab_size", "hidden_size"),
    "embeddings.position_embeddings.weight": ("max_position_embeddings", "hidden_size"),
    "embeddings.token_type_embeddings.weight": ("type_vocab_size", "hidden_size"),
    "encoder.layer.0.intermediate.dense.weight": ("intermediate_size", "hidden_size"),
}
