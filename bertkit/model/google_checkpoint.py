"""Original Google BERT checkpoints (TensorFlow, `bert_config.json`) -> Hugging Face BERT dirs.

The weights get the names of Hugging Face's `BertForPreTraining`: `bert.` for the
encoder (keras-hub finds that prefix by suffix matching) and `cls.` for the pretraining
heads, which a masked-LM task can initialise from. Only this conversion needs TensorFlow.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from bertkit.errors import UserError
from bertkit.model.hf_files import (
    REQUIRED_CONFIG_KEYS,
    SAFETENSORS_FILE,
    VOCAB_FILE,
    load_json,
    require_file,
    write_json,
    write_tokenizer_config,
)

GOOGLE_CONFIG_FILE = "bert_config.json"

# Optional bert_config.json keys, copied with the required ones into config.json.
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
    config_path = require_file(source_dir, GOOGLE_CONFIG_FILE)
    vocab_path = require_file(source_dir, VOCAB_FILE)
    if target_dir.resolve() == source_dir.resolve():
        raise UserError("the target directory must differ from the source", source=source_dir)
    config = _hf_config(load_json(config_path), config_path)
    weights = _read_google_weights(_find_checkpoint(source_dir), config["num_hidden_layers"])
    target_dir.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(target_dir / SAFETENSORS_FILE), metadata={"format": "pt"})
    write_json(target_dir / "config.json", config)
    shutil.copyfile(vocab_path, target_dir / VOCAB_FILE)
    write_tokenizer_config(target_dir, config["max_position_embeddings"], do_lower_case)
    return target_dir


def _hf_config(google_config: dict, source: Path) -> dict:
    for key in REQUIRED_CONFIG_KEYS:
        if key not in google_config:
            raise UserError("missing required key", source=source, key=key)
    merged = {**_CONFIG_DEFAULTS, **google_config}
    values = {key: merged[key] for key in REQUIRED_CONFIG_KEYS + tuple(_CONFIG_DEFAULTS)}
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
