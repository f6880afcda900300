"""The files of a Hugging Face BERT directory, as keras-hub's `BertBackbone.from_preset`
reads it: their names, the config keys every BERT has, JSON in and out, and the
`tokenizer_config.json` that says whether the vocabulary is uncased.

Shared by the converters (`bertkit.model.google_checkpoint`, `bertkit.model.checkpoints`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from bertkit.errors import UserError

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"  # Sharded safetensors, read by keras-hub.
TORCH_BIN_FILE = "pytorch_model.bin"
VOCAB_FILE = "vocab.txt"

# The sizes every BERT config.json holds (Google's bert_config.json has the same keys).
REQUIRED_CONFIG_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
)
# [CLS], [unused0] or <S> keep their capitals in uncased vocabularies too.
_SPECIAL_TOKEN = re.compile(r"\[[^\]]*\]|<[^>]*>")


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


def missing_weights(source_dir: Path) -> str | None:
    """What says a Hugging Face or Google BERT folder has no weights, or None (the rule
    `bertkit.model.checkpoints.prepare_hf_dir` and `bertkit check` share)."""
    names = (SAFETENSORS_FILE, SAFETENSORS_INDEX, TORCH_BIN_FILE)
    if any((source_dir / name).is_file() for name in names) or any(source_dir.glob("*.index")):
        return None
    return f"found no {SAFETENSORS_FILE}, {TORCH_BIN_FILE} or TensorFlow checkpoint (*.ckpt.index)"


def require_file(directory: Path, name: str) -> Path:
    """`directory / name`, which must be a file."""
    if not (directory / name).is_file():
        raise UserError(f"missing {name}", source=directory)
    return directory / name


def load_json(path: Path) -> dict:
    """A JSON file's content; invalid JSON is a `UserError` with its line."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise UserError(f"invalid JSON: {error.msg}", source=path, line=error.lineno) from None


def write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_tokenizer_config(directory: Path, max_length: int | None, do_lower_case) -> None:
    """Writes `tokenizer_config.json`, with `do_lower_case` read from vocab.txt if None."""
    if do_lower_case is None:
        # One token a line; str.splitlines would also split at \x1c, \u2028 and the like.
        lines = (directory / VOCAB_FILE).read_text(encoding="utf-8").split("\n")
        do_lower_case = infer_do_lower_case(line.rstrip("\r") for line in lines if line)
    write_json(
        directory / "tokenizer_config.json",
        {
            "do_lower_case": do_lower_case,
            "model_max_length": max_length,
            "tokenizer_class": "BertTokenizer",
        },
    )
