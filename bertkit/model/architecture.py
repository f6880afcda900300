"""What a backbone is besides its pretrained weights: the loaded bundle (`PretrainedBackbone`),
the GELU variant its checkpoint was trained with, and the architecture file a run directory
carries so that the fine-tuned weights can be loaded without the original checkpoint.

Loading from presets and checkpoints is `bertkit.model.backbone`'s; it re-exports these names.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from bertkit.errors import UserError
from bertkit.model.tokenizer import WordPieceTokenizer

_EXACT_GELU = {"gelu", "gelu_python"}


@dataclasses.dataclass
class PretrainedBackbone:
    """A loaded backbone, its tokenizer, and where they came from."""

    backbone: object  # keras_hub.models.BertBackbone
    tokenizer: WordPieceTokenizer
    hidden_act: str
    weights_dir: Path | None = None  # Hugging Face folder holding extra (head) tensors
    # where the checkpoint states its casing, e.g. ("tokenizer_config.json says
    # do_lower_case", "vocab.txt"); None: it does not, and the vocabulary decided
    lowercase_stated_by: tuple[str, str] | None = None

    def checkpoint_tensors(self) -> dict:
        """All tensors of a Hugging Face-format source (for pretrained heads), else {}."""
        path = self.weights_dir and self.weights_dir / "model.safetensors"
        if not path or not path.exists():
            return {}
        from safetensors.numpy import load_file

        return load_file(str(path))


def gelu_exact(x):
    import keras

    return keras.activations.gelu(x, approximate=False)


def prepare_layers(backbone, hidden_act: str) -> None:
    """What bertkit changes in keras-hub's `BertBackbone` after building it: the GELU the
    checkpoint was trained with, a segment embedding whose gradient is fast on GPUs
    (`bertkit.model.segment_embedding`) and, on JAX with a GPU, fused attention where no
    dropout applies (`bertkit.model.attention`). None changes a variable."""
    from bertkit.model.attention import use_fused_attention
    from bertkit.model.segment_embedding import use_sum_over_rows

    set_activation(backbone, hidden_act)
    use_sum_over_rows(backbone)
    use_fused_attention(backbone)


def set_activation(backbone, hidden_act: str) -> None:
    """Uses the GELU variant the checkpoint was trained with in every encoder layer."""
    if hidden_act not in _EXACT_GELU:
        return
    for layer in backbone.transformer_layers:
        layer.activation = gelu_exact
        layer._feedforward_intermediate_dense.activation = gelu_exact


# ---- run directories: the backbone's architecture travels with the fine-tuned weights
def save_architecture(loaded: PretrainedBackbone, directory) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {"bert_backbone": loaded.backbone.get_config(), "hidden_act": loaded.hidden_act}
    (directory / "backbone.json").write_text(json.dumps(config, indent=2))
    loaded.tokenizer.save(directory)


def load_architecture(directory) -> PretrainedBackbone:
    """Rebuilds a backbone (random weights) and tokenizer saved by `save_architecture`."""
    from bertkit.run_dir import read_json

    directory = Path(directory)
    path = directory / "backbone.json"
    config = read_json(path, "backbone architecture")
    if not isinstance(config, dict) or not isinstance(config.get("hidden_act"), str):
        raise UserError("lacks 'hidden_act' (the feed-forward activation)", source=path)
    backbone = _backbone_from_config(config.get("bert_backbone"), path)
    prepare_layers(backbone, config["hidden_act"])
    return PretrainedBackbone(backbone, WordPieceTokenizer.load(directory), config["hidden_act"])


# What `BertBackbone` cannot be built without (the other arguments have defaults).
_ARCHITECTURE_SIZES = (
    "vocabulary_size",
    "num_layers",
    "num_heads",
    "hidden_dim",
    "intermediate_dim",
)


def _backbone_from_config(config, path: Path):
    """keras-hub's `BertBackbone` from `backbone.json`'s `bert_backbone`; a key it lacks or
    a value it cannot take is a `UserError` naming the file."""
    import keras_hub

    from bertkit.model.checkpoints import size_problem

    if not isinstance(config, dict):
        raise UserError("lacks 'bert_backbone' (keras-hub's BertBackbone config)", source=path)
    for key in _ARCHITECTURE_SIZES:
        if problem := size_problem(config, key):
            raise UserError(problem, source=path, key="bert_backbone")
    if config["hidden_dim"] % config["num_heads"]:
        raise UserError(
            f"hidden_dim {config['hidden_dim']} is not a multiple of num_heads "
            f"{config['num_heads']}",
            source=path,
            key="bert_backbone",
        )
    try:
        return keras_hub.models.BertBackbone.from_config(config)
    except (TypeError, ValueError, KeyError) as error:
        problem = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UserError(
            f"cannot rebuild the backbone: {problem}", source=path, key="bert_backbone"
        ) from None
