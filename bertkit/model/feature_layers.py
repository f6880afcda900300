"""BERT's feature-based approach: a frozen encoder, and heads that read chosen hidden layers.

`backbone.trainable: false` freezes the encoder (`freeze_encoder`): no gradients, no optimizer
state, no dropout inside it, only the head trains. `backbone.features` makes the heads that
read `sequence_output` (tagging, span QA) read a combination of hidden layers instead
(`with_feature_layers`): BERT's paper reached 96.1 CoNLL-2003 dev F1 with the last four
layers concatenated from a frozen BERT-base, against 96.4 fine-tuned.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from bertkit.errors import UserError

FEATURES_LAYER = "feature_layers"  # the combining layer's name: a head that reads it has one


@dataclasses.dataclass(frozen=True)
class FeatureLayersConfig:
    layers: tuple[int, ...] = dataclasses.field(
        default=(-4, -3, -2, -1),
        metadata={
            "help": "hidden layers the head reads: 0 the embeddings, 1 to N the encoder "
            "layers, negative from the end (-1 the last)"
        },
    )
    combine: Literal["concat", "mean"] = dataclasses.field(
        default="concat", metadata={"help": "the layers concatenated (BERT's best) or averaged"}
    )


def freeze_encoder(backbone) -> None:
    """No weight of `backbone` trains, and its dropout is off (features as at inference).

    Example:
        >>> import tempfile
        >>> from bertkit.model.backbone import load_pretrained
        >>> from bertkit.testing.tiny import write_tiny_checkpoint
        >>> backbone = load_pretrained(str(write_tiny_checkpoint(tempfile.mkdtemp())),
        ...                            sequence_length=16).backbone
        >>> freeze_encoder(backbone)
        >>> len(backbone.trainable_weights), backbone.embeddings_dropout.rate
        (0, 0.0)
    """
    import keras

    backbone.trainable = False
    for layer in backbone._flatten_layers(include_self=False):
        if isinstance(layer, keras.layers.Dropout):
            layer.rate = 0.0


def with_feature_layers(backbone, features):
    """`backbone` whose `output["sequence_output"]` is the chosen hidden layers combined
    (`features`: a `FeatureLayersConfig`, its record in a run's `model/task.json`, or None:
    `backbone` as it is). Everything else is the backbone's own, so a task builds its
    model on it as on the backbone."""
    if not features:
        return backbone
    if isinstance(features, dict):
        features = FeatureLayersConfig(tuple(features["layers"]), features["combine"])
    return _FeatureBackbone(backbone, _combined(backbone, features))


def build_on_features(task, backbone, features, source):
    """`task`'s model on `backbone`, its head reading `features` (`with_feature_layers`);
    features with a head that never reads the sequence output are one line."""
    model = task.build_model(with_feature_layers(backbone, features))
    if features and not any(layer.name == FEATURES_LAYER for layer in model.layers):
        raise UserError(
            f"the {task.name} head does not read the sequence output, so the layers it "
            "names would not be used (tagging and span_qa read them)",
            source=source,
            key="backbone.features",
        )
    return model


def freeze_as_configured(backbone, config, description: dict) -> dict:
    """Freezes the encoder when `config` (the recipe's `backbone` section) says
    `trainable: false`; returns the run's task description with the features record that
    rebuilds the model (`bertkit.load`)."""
    if not config.trainable:
        freeze_encoder(backbone)
    if not config.features:
        return description
    record = {"layers": list(config.features.layers), "combine": config.features.combine}
    return {**description, "features": record}


def _combined(backbone, features: FeatureLayersConfig):
    import keras

    count = backbone.num_layers + 1
    for index in features.layers:
        if not -count <= index < count:
            raise UserError(
                f"layer {index}: the backbone has hidden layers 0 to {count - 1} (or {-count} "
                "to -1)",
                key="backbone.features.layers",
            )
    states = [
        backbone.get_layer("embeddings_dropout").output
        if index % count == 0
        else backbone.transformer_layers[index % count - 1].output
        for index in features.layers
    ]
    if len(states) == 1:
        return keras.layers.Identity(name=FEATURES_LAYER)(states[0])
    if features.combine == "concat":
        return keras.layers.Concatenate(axis=-1, name=FEATURES_LAYER)(states)
    return keras.layers.Average(name=FEATURES_LAYER)(states)


class _FeatureBackbone:
    """The backbone as a task sees it, with another `sequence_output`."""

    def __init__(self, backbone, sequence_output):
        self._backbone, self._sequence_output = backbone, sequence_output

    def __getattr__(self, name):
        return getattr(self._backbone, name)

    @property
    def output(self) -> dict:
        return {**self._backbone.output, "sequence_output": self._sequence_output}
