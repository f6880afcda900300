"""LoRA (low-rank adaptation) on a task model's backbone: the recipe section, switching it
on, the adapter file and the merged model.

`training.lora: {rank: 8, alpha: 16, targets: [query, value]}` gives each targeted layer
of every encoder layer Keras' own LoRA (`EinsumDense`/`Dense.enable_lora(rank,
lora_alpha)`: `kernel + alpha / rank * a @ b`, `b` zero at first) and freezes the rest of
the backbone, the targeted layers' kernels and biases included (PEFT's `bias: none`). The
task head and any layers the task adds stay trainable. keras-hub's
`Backbone.enable_lora` cannot set alpha, so the layers are enabled here, by the same
layer names.

Saving: Keras saves a LoRA layer's kernel with the update merged and, on loading,
zeroes both factors; with `a` and `b` both zero their gradients are zero, so a run
resumed from such a checkpoint would train its adapters no further, and the adapter
could not be saved after the best weights are reloaded. Here each LoRA layer saves its
variables as they are (pretrained kernel, bias, `a`, `b`: Keras' base `Layer`
behaviour), so checkpoints, resume and the best-epoch weights (`model/model.weights.h5`)
keep the adapters exactly, and `bertkit.load` rebuilds the model with LoRA on (the
record in `model/task.json`) before loading them.

Serving: `merged_model` folds each update into its kernel in a model built without LoRA,
which `FineTunedModel` holds: predictions and the SavedModel run the plain architecture
(no extra matmuls), and the adapted MLM backbone preset is a plain keras-hub preset.
`save_adapter` writes `model/lora.weights.h5`: the factors and the head, what the run
trained (a head-less adapter is PEFT's most reported loss), readable with `load_adapter`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from pathlib import Path
from typing import Literal

from bertkit.errors import UserError

# recipe name -> keras-hub's layer name in each `TransformerEncoder`
TARGET_LAYERS = {
    "query": "query",
    "key": "key",
    "value": "value",
    "attention_output": "attention_output",
    "intermediate": "feedforward_intermediate_dense",
    "output": "feedforward_output_dense",
}
Target = Literal["query", "key", "value", "attention_output", "intermediate", "output"]
ADAPTER_FILE = "lora.weights.h5"
_FACTORS = ("lora_kernel_a", "lora_kernel_b")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """`training.lora` of a recipe (here, beside its user: recipes import no Keras)."""

    rank: int = dataclasses.field(
        default=8, metadata={"min": 1, "max": 4096, "help": "rank of each layer's low-rank update"}
    )
    alpha: float = dataclasses.field(
        default=16.0,
        metadata={"min_exclusive": 0.0, "help": "the update is scaled by alpha / rank"},
    )
    targets: tuple[Target, ...] = dataclasses.field(
        default=("query", "value"),
        metadata={
            "help": "the layers of each encoder layer that get LoRA; the rest of the backbone "
            "is frozen, the task head trained fully"
        },
    )


def check_targets(lora: LoraConfig | None, error) -> None:
    """A recipe's `training.lora.targets` name each layer once, and at least one;
    `error(message, path)` makes the `UserError` for the key path below `training.lora`.

    A duplicate is refused, not dropped: `[query, query]` is more likely a slip for another
    layer than a wish to adapt `query` twice.
    """
    if lora is None:
        return
    if not lora.targets:
        raise error(
            "lists no layer, and LoRA would train the task head alone; give one or more of: "
            + ", ".join(TARGET_LAYERS),
            ("targets",),
        )
    for index, target in enumerate(lora.targets):
        if target in lora.targets[:index]:
            raise error(f"'{target}' is listed twice", ("targets", index))


def rank_problem(lora: LoraConfig, hidden_dim: int, intermediate_dim: int) -> str | None:
    """What is wrong with `lora.rank` for a backbone of these widths, or None: a rank above
    the smaller side of a layer's kernel (its input and output widths) adds no capacity,
    only weights. The rule `bertkit check` (from the checkpoint's config) and `finetune`
    share.

    Example:
        >>> rank_problem(LoraConfig(rank=4096), hidden_dim=384, intermediate_dim=1536)
        'must be at most 384, the narrower side of the query layers it adapts (384 x 384), got 4096'
    """
    widths = {
        "intermediate": (hidden_dim, intermediate_dim),
        "output": (intermediate_dim, hidden_dim),
    }
    shapes = {target: widths.get(target, (hidden_dim, hidden_dim)) for target in lora.targets}
    target = min(shapes, key=lambda name: min(shapes[name]), default=None)
    if target is None or lora.rank <= min(shapes[target]):
        return None
    fan_in, fan_out = shapes[target]
    return (
        f"must be at most {min(fan_in, fan_out)}, the narrower side of the {target} layers it "
        f"adapts ({fan_in} x {fan_out}), got {lora.rank}"
    )


def enable_lora(model, backbone, lora, description: dict) -> dict:
    """Switches LoRA on in `backbone` (a layer of `model`) and freezes the rest of it.

    Args:
        lora: a `LoraConfig`, the `lora` record of a run's `model/task.json`, or None
            (LoRA off: nothing changes).
        description: the run's task description.

    Returns:
        `description`, with the `lora` record (rank, alpha, targets, trainable_weights,
        weights) when LoRA is on.
    """
    if not lora:
        return description
    if isinstance(lora, dict):
        lora = LoraConfig(lora["rank"], lora["alpha"], tuple(lora["targets"]))
    names = {TARGET_LAYERS[target] for target in lora.targets}
    layers = backbone._flatten_layers(include_self=False)  # as keras-hub's `enable_lora`
    for layer in layers:
        layer.trainable = False
    for layer in (layer for layer in layers if layer.name in names and layer.weights):
        layer.trainable = True
        layer.enable_lora(lora.rank, lora_alpha=lora.alpha)  # freezes the kernel
        if layer.bias is not None:
            layer.bias.trainable = False
        _save_unmerged(layer)
    record = {
        **dataclasses.asdict(lora),
        "targets": list(lora.targets),
        "trainable_weights": _size(model.trainable_weights),
        "weights": _size(model.weights),
    }
    if "lora" not in description:  # a run being built (not a trained one being loaded)
        from bertkit.progress import say
        from bertkit.report import describe_trainable

        say(f"LoRA rank {lora.rank} on {', '.join(lora.targets)}: {describe_trainable(record)}")
    return {**description, "lora": record}


def _save_unmerged(layer) -> None:
    """Saves and loads `layer`'s variables as they are (see the module docstring)."""
    import keras

    layer.save_own_variables = functools.partial(keras.layers.Layer.save_own_variables, layer)
    layer.load_own_variables = functools.partial(keras.layers.Layer.load_own_variables, layer)


def _size(variables) -> int:
    return sum(math.prod(variable.shape) for variable in variables)


def lora_layers(model) -> list:
    """The layers of `model` with LoRA on."""
    return [layer for layer in model._flatten_layers() if getattr(layer, "lora_enabled", False)]


def merged_model(task, model, model_dir, features=None):
    """`model` with each LoRA update folded into its kernel, in the same task model built
    without LoRA from `model_dir` (`model/backbone.json`) and the layers its head reads
    (`features`, `bertkit.model.feature_layers`); `model` itself if it has no LoRA layers."""
    if not lora_layers(model):
        return model
    from bertkit.model.backbone import load_architecture
    from bertkit.model.feature_layers import with_feature_layers

    plain = task.build_model(with_feature_layers(load_architecture(model_dir).backbone, features))
    plain.set_weights(_merged_weights(model))
    return plain


def finish_lora(model, backbone, model_dir):
    """A run's end: with LoRA, writes the adapter file into `model_dir` (`save_adapter`)
    and returns `backbone` merged, as it is served (e.g. the MLM task's adapted preset);
    without, returns `backbone`."""
    if not lora_layers(model):
        return backbone
    from bertkit.model.backbone import load_architecture

    save_adapter(model, model_dir)
    plain = load_architecture(model_dir).backbone
    plain.set_weights(_merged_weights(backbone))
    return plain


def _merged_weights(model) -> list:
    """`model.weights` as NumPy arrays without the LoRA factors, each LoRA layer's kernel
    with its update added: the weights of the same model without LoRA, in its order."""
    layers = lora_layers(model)
    factors = {id(getattr(layer, name)) for layer in layers for name in _FACTORS}
    kernels = {id(_raw_kernel(layer)): layer for layer in layers}
    return [
        _numpy(kernels[id(v)].kernel if id(v) in kernels else v)  # `kernel`: merged
        for v in model.weights
        if id(v) not in factors
    ]


def _raw_kernel(layer):
    """The kernel variable of a LoRA layer (its `kernel` property adds the update)."""
    return next(v for v in layer.weights if v.name == "kernel")


def _numpy(value):
    import keras

    return keras.ops.convert_to_numpy(value)


def adapter_variables(model) -> list:
    """What a LoRA run trains: the LoRA factors and the task head (the trainable weights)."""
    return list(model.trainable_weights)


def save_adapter(model, directory) -> Path | None:
    """Writes `directory/lora.weights.h5`: each of `adapter_variables` under its path, and
    the LoRA settings as attributes; None (nothing written) for a model without LoRA."""
    import h5py

    layers = lora_layers(model)
    if not layers:
        return None
    path = Path(directory) / ADAPTER_FILE
    temporary = path.with_name(".partial." + path.name)
    with h5py.File(temporary, "w") as file:
        file.attrs["lora"] = json.dumps(
            {"rank": layers[0].lora_rank, "alpha": float(layers[0].lora_alpha)}
        )
        for variable in adapter_variables(model):
            file[variable.path] = _numpy(variable)
    temporary.replace(path)
    return path


def load_adapter(model, path) -> None:
    """Loads a `save_adapter` file into `model`, a task model with the same LoRA settings
    on its (pretrained) backbone: the adapter's factors and head replace the model's.

    Raises a `UserError` naming the file when a variable is missing or of another shape.
    """
    import h5py

    with h5py.File(path, "r") as file:
        for variable in adapter_variables(model):
            stored = file.get(variable.path)
            if stored is None or tuple(stored.shape) != tuple(variable.shape):
                raise UserError(
                    f"holds no {tuple(variable.shape)} weight '{variable.path}': "
                    "an adapter of another model or LoRA setting",
                    source=path,
                )
            variable.assign(stored[()])
