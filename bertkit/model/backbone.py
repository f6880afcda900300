"""Pretrained BERT backbones: keras-hub's `BertBackbone` plus a matching tokenizer.

Sources (`backbone.preset` in a recipe):
- a keras-hub preset name (`bert_base_en_uncased`), `hf://org/name` or
  `kaggle://...` handle: keras-hub downloads it (needs network);
- a local keras-hub preset folder (what `save_to_preset` writes);
- a local Hugging Face BERT folder (config.json, model.safetensors or
  pytorch_model.bin, vocab.txt);
- a local Google BERT TensorFlow checkpoint folder (bert_config.json,
  bert_model.ckpt.*, vocab.txt), converted once into a cache folder;
- `package:MODULE/SUBFOLDER`: a folder shipped inside an installed Python package.

keras-hub's `BertBackbone` always builds its feed-forward layers with the tanh
approximation of GELU and its Hugging Face converter ignores `hidden_act`.
Checkpoints trained with the exact (erf) GELU (`hidden_act: gelu`, the
Hugging Face default) then give outputs off by up to 4e-3, so we set the
activation the checkpoint declares on each encoder layer after loading.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import importlib.util
import json
import os
from pathlib import Path

from bertkit.errors import UserError
from bertkit.model.architecture import (  # noqa: F401 (public here too)
    PretrainedBackbone,
    gelu_exact,
    load_architecture,
    prepare_layers,
    save_architecture,
    set_activation,
)
from bertkit.model.tokenizer import WordPieceTokenizer, read_vocabulary
from bertkit.model.vocabulary_checks import checked_lowercase, vocabulary_is_cased

PRESET_MARKER = "bertkit_backbone.json"  # in presets bertkit writes: the GELU variant
_KEY = "backbone.preset"


def load_pretrained(
    preset: str,
    *,
    sequence_length: int,
    lowercase: bool | None = None,
    normalize_punctuation: bool = False,
    source=None,
) -> PretrainedBackbone:
    """Loads a backbone and tokenizer from any supported source (see module docstring).

    `lowercase` None takes the checkpoint's setting, but lowercases a checkpoint that says
    cased and has no capital letters (`bertkit.model.vocabulary_checks.checked_lowercase`);
    `normalize_punctuation` is the tokenizer's (`WordPieceTokenizer`).
    """
    preset = resolve_preset(preset, source)
    path = Path(preset).expanduser()
    if path.is_dir():
        loaded = _load_folder(path, source)
    elif path.exists() or preset.startswith((".", "/", "~")):
        raise UserError(f"'{preset}' is not a folder", source=source, key=_KEY)
    else:
        loaded = _load_named_preset(preset, source)
    _check_sequence_length(loaded.backbone, sequence_length, source)
    if lowercase is None and loaded.lowercase_stated_by:
        lowercase = checked_lowercase(
            loaded.tokenizer.lowercase, loaded.tokenizer.vocabulary, *loaded.lowercase_stated_by
        )
    loaded.tokenizer = _with_lowercase(loaded.tokenizer, lowercase, preset, source)
    if normalize_punctuation:
        loaded.tokenizer = loaded.tokenizer.with_settings(normalize_punctuation=True)
    prepare_layers(loaded.backbone, loaded.hidden_act)
    return loaded


def resolve_preset(preset: str, source=None) -> str:
    """A `package:MODULE/SUBFOLDER` preset as the folder it names; any other preset as it is.

    Example:
        >>> resolve_preset("bert_base_en_uncased")
        'bert_base_en_uncased'
    """
    if not preset.startswith("package:"):
        return preset
    module, _, subfolder = preset[len("package:") :].partition("/")
    spec = importlib.util.find_spec(module) if module else None
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            f"no installed Python package '{module}' (from '{preset}')", source=source, key=_KEY
        )
    return str(Path(next(iter(spec.submodule_search_locations))) / subfolder)


def _load_folder(path: Path, source) -> PretrainedBackbone:
    if (path / "metadata.json").exists():
        return _load_keras_hub(str(path), source)
    if problem := folder_problem(path):
        raise UserError(problem, source=source, key=_KEY)
    return _load_hugging_face(path, source)


def folder_problem(path: Path) -> str | None:
    """What keeps the folder `path` from holding a checkpoint bertkit loads, or None (the
    rule loading and `bertkit check` share)."""
    if (path / "metadata.json").exists():
        return None
    if (path / "bert_config.json").exists() or (path / "config.json").exists():
        return None
    return (
        f"'{path}' holds no BERT checkpoint: expected a keras-hub preset "
        "(metadata.json), a Hugging Face folder (config.json) or a Google BERT "
        "checkpoint (bert_config.json)"
    )


def _load_hugging_face(path: Path, source) -> PretrainedBackbone:
    from bertkit.model.checkpoints import prepare_hf_dir

    hf_dir = Path(prepare_hf_dir(path, _cache_dir(path)))
    config = _read_json_file(hf_dir / "config.json", source)
    if config.get("model_type", "bert") != "bert":
        raise UserError(
            f"'{path}' is a '{config['model_type']}' model, not BERT", source=source, key=_KEY
        )
    for name in ("vocab.txt", "model.safetensors"):
        if not (hf_dir / name).exists():
            raise UserError(f"missing {name} in '{path}'", source=source, key=_KEY)
    vocabulary = read_vocabulary(hf_dir / "vocab.txt")
    tokenizer_config = hf_dir / "tokenizer_config.json"
    settings = json.loads(tokenizer_config.read_text()) if tokenizer_config.exists() else {}
    lowercase = settings.get("do_lower_case")
    if lowercase is None:
        lowercase = not vocabulary_is_cased(vocabulary)
    backbone = _hugging_face_backbone(hf_dir, config, path, source)
    stated = ("tokenizer_config.json says do_lower_case", "vocab.txt")
    return PretrainedBackbone(
        backbone,
        WordPieceTokenizer(vocabulary, lowercase),
        config.get("hidden_act", "gelu"),
        hf_dir,
        stated if settings.get("do_lower_case") is not None else None,
    )


def _hugging_face_backbone(hf_dir: Path, config: dict, path: Path, source):
    """keras-hub's `BertBackbone` with a Hugging Face folder's weights, once its config.json
    is known to fit their shapes (keras-hub's converter would fail on a weight's assign)."""
    import keras_hub
    from safetensors import SafetensorError

    from bertkit.model.checkpoints import config_mismatch, weight_shapes

    try:
        problem = config_mismatch(config, weight_shapes(hf_dir))
        if problem is None:
            # keras-hub's converter reads only the sizes: the segment count and the dropout
            # (keras-hub has one rate for hidden states and attention) come from the config.
            with _no_random_initialization():
                return keras_hub.models.BertBackbone.from_preset(
                    str(hf_dir),
                    num_segments=config.get("type_vocab_size", 2),
                    dropout=config.get("hidden_dropout_prob", 0.1),
                )
    except (SafetensorError, OSError) as error:  # e.g. a truncated download
        raise UserError(
            f"cannot read the weights in '{path}' (truncated or corrupt "
            f"model.safetensors?): {error}",
            source=source,
            key=_KEY,
        ) from None
    raise UserError(f"'{path}': {problem}", source=source, key=_KEY)


@contextlib.contextmanager
def _no_random_initialization():
    """keras-hub's `BertBackbone` draws every weight from a truncated normal before the
    converter overwrites all of them (a weight the checkpoint lacks is an error, never
    left as drawn): 22M draws, 0.1-0.5 s of every run's start on a 2-core CPU. Here the draw is
    zeros, as transformers skips the initialization of weights it loads."""
    import keras

    draw = keras.initializers.TruncatedNormal.__call__
    keras.initializers.TruncatedNormal.__call__ = lambda self, shape, dtype=None: keras.ops.zeros(
        shape, dtype
    )
    try:
        yield
    finally:
        keras.initializers.TruncatedNormal.__call__ = draw


def _read_json_file(path: Path, source) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:  # ValueError: bad JSON, UTF-8 or a 5000-digit number
        raise UserError(f"cannot read '{path}': {error}", source=source, key=_KEY) from None
    if not isinstance(value, dict):
        raise UserError(f"'{path}' is not a JSON object", source=source, key=_KEY)
    return value


def _cache_dir(path: Path) -> Path:
    root = Path(os.environ.get("BERTKIT_CACHE", Path.home() / ".cache" / "bertkit"))
    stamp = f"{path.resolve()}:{max(p.stat().st_mtime for p in path.iterdir())}"
    return root / "converted" / hashlib.sha1(stamp.encode()).hexdigest()[:16]


def _load_keras_hub(preset: str, source) -> PretrainedBackbone:
    import keras_hub

    try:
        backbone = keras_hub.models.BertBackbone.from_preset(preset)
        hub_tokenizer = keras_hub.models.BertTokenizer.from_preset(preset)
    except (ValueError, OSError) as error:
        raise UserError(
            f"cannot load keras-hub preset '{preset}': {error}", source=source, key=_KEY
        ) from None
    tokenizer = WordPieceTokenizer(list(hub_tokenizer.get_vocabulary()), hub_tokenizer.lowercase)
    # keras-hub's own presets use its tanh GELU; presets bertkit writes say what they need.
    marker = Path(preset) / PRESET_MARKER
    hidden_act = json.loads(marker.read_text())["hidden_act"] if marker.exists() else "gelu_tanh"
    stated = ("the keras-hub preset's tokenizer says lowercase", "its vocabulary")
    return PretrainedBackbone(backbone, tokenizer, hidden_act, lowercase_stated_by=stated)


def _load_named_preset(preset: str, source) -> PretrainedBackbone:
    import keras_hub

    known = sorted(keras_hub.models.BertBackbone.presets)
    if "://" not in preset and preset not in known:
        close = difflib.get_close_matches(preset, known, n=1)
        hint = f" did you mean '{close[0]}'?" if close else ""
        raise UserError(
            f"unknown preset '{preset}';{hint} keras-hub BERT presets: "
            f"{', '.join(known)}; or give a local folder",
            source=source,
            key=_KEY,
        )
    try:
        return _load_keras_hub(preset, source)
    except UserError:
        raise
    except Exception as error:  # network failures surface as many exception types
        raise UserError(
            f"cannot download preset '{preset}' ({type(error).__name__}: {error}); "
            "without network, give a local folder",
            source=source,
            key=_KEY,
        ) from None


def _check_sequence_length(backbone, sequence_length: int, source) -> None:
    if problem := sequence_length_problem(sequence_length, backbone.max_sequence_length):
        raise UserError(problem, source=source, key="backbone.sequence_length")


def sequence_length_problem(sequence_length: int, max_positions: int) -> str | None:
    """What is wrong with `sequence_length` for a model of `max_positions` positions, or None
    (the rule loading a backbone and `bertkit check` share)."""
    if sequence_length > max_positions:
        return f"{sequence_length} is more than the model's {max_positions} positions"
    return None


def _with_lowercase(tokenizer: WordPieceTokenizer, lowercase, preset, source):
    if lowercase is None or lowercase == tokenizer.lowercase:
        return tokenizer
    cased = vocabulary_is_cased(tokenizer.vocabulary)
    if lowercase and cased or not lowercase and not cased:
        kind = "cased" if cased else "uncased (lowercase)"
        raise UserError(
            f"lowercase: {str(lowercase).lower()} contradicts the {kind} vocabulary of '{preset}'",
            source=source,
            key="backbone.lowercase",
        )
    return tokenizer.with_settings(lowercase=lowercase)


def save_preset(backbone, tokenizer: WordPieceTokenizer, hidden_act: str, directory) -> Path:
    """Writes a keras-hub preset folder that any recipe can use as `backbone.preset`."""
    import keras_hub

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    backbone.save_to_preset(str(directory))
    keras_hub.models.BertTokenizer(
        vocabulary=tokenizer.vocabulary, lowercase=tokenizer.lowercase
    ).save_to_preset(str(directory))
    (directory / PRESET_MARKER).write_text(json.dumps({"hidden_act": hidden_act}))
    return directory
