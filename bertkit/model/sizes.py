"""A backbone's sizes, read from a checkpoint folder's config without loading its weights.

`bertkit check` and `finetune` (before it touches the run directory or loads TensorFlow)
check the recipe's settings that must fit the backbone, such as `reinit_top_layers` or the
LoRA rank, against these (`bertkit.recipes.preflight`); a named keras-hub preset has no
folder to read until keras-hub downloads it, and is checked once its backbone is built
(`BackboneSizes.of`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

# config key of each size: (keras-hub preset's config.json, Hugging Face and Google BERT)
_KEYS = {
    "num_layers": ("num_layers", "num_hidden_layers"),
    "hidden_dim": ("hidden_dim", "hidden_size"),
    "intermediate_dim": ("intermediate_dim", "intermediate_size"),
    "max_positions": ("max_sequence_length", "max_position_embeddings"),
}


@dataclasses.dataclass(frozen=True)
class BackboneSizes:
    """The sizes of a BERT backbone that recipe settings must fit."""

    num_layers: int
    hidden_dim: int
    intermediate_dim: int
    max_positions: int
    model_type: str = "bert"

    @classmethod
    def of(cls, backbone) -> BackboneSizes:
        """The sizes of a built keras-hub `BertBackbone`."""
        return cls(
            backbone.num_layers,
            backbone.hidden_dim,
            backbone.intermediate_dim,
            backbone.max_sequence_length,
        )


def read_sizes(folder) -> BackboneSizes | None:
    """The sizes a checkpoint folder's config declares; None where it has no readable config
    with every size (loading the backbone then reports what is wrong).

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "config.json").write_text(json.dumps({"num_hidden_layers": 6,
        ...     "hidden_size": 384, "intermediate_size": 1536, "max_position_embeddings": 512}))
        >>> read_sizes(folder)
        BackboneSizes(num_layers=6, hidden_dim=384, intermediate_dim=1536, max_positions=512, \
model_type='bert')
    """
    folder = Path(folder)
    if (folder / "metadata.json").is_file():  # a keras-hub preset: {"config": {...}}
        config, column = _read_config(folder / "config.json").get("config"), 0
    elif (folder / "config.json").is_file():
        config, column = _read_config(folder / "config.json"), 1
    else:
        config, column = _read_config(folder / "bert_config.json"), 1
    if not isinstance(config, dict):
        return None
    sizes = {name: config.get(keys[column]) for name, keys in _KEYS.items()}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes.values()):
        return None
    model_type = config.get("model_type", "bert")
    return BackboneSizes(**sizes, model_type=model_type if isinstance(model_type, str) else "bert")


def _read_config(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # ValueError: bad JSON or UTF-8
        return {}
    return value if isinstance(value, dict) else {}
