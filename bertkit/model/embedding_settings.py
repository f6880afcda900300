"""How a text becomes one vector: the pooling, the hidden layers read, normalization.

A sentence-transformers folder declares its own (`modules.json`, `1_Pooling/config.json`, a
`Normalize` module, `sentence_bert_config.json`'s `max_seq_length`); `declared_settings`
reads them, so that `bertkit embed` on such a folder gives `SentenceTransformer.encode`'s
vectors. `parse_layers` reads the `--layers` spec of the feature-based approach.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from bertkit.errors import UserError
from bertkit.model.pooling import POOLINGS

COMBINES = ("concat", "mean")
_MODES = {f"pooling_mode_{name}_tokens": name for name in ("max", "mean")} | {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
}
_UNSUPPORTED_MODES = ("pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")
_KNOWN_MODULES = {"Transformer", "Pooling", "Normalize"}


@dataclasses.dataclass(frozen=True)
class EmbeddingSettings:
    """What `Embedder` computes; None: not declared (the caller's default applies)."""

    poolings: tuple[str, ...] | None = None
    normalize: bool | None = None
    sequence_length: int | None = None


def declared_settings(folder) -> EmbeddingSettings:
    """The pooling, normalization and length a sentence-transformers folder declares;
    empty settings for any other folder (or none).

    Example:
        >>> import json, pathlib, tempfile
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> (folder / "1_Pooling").mkdir()
        >>> _ = (folder / "modules.json").write_text(json.dumps([
        ...     {"path": "", "type": "sentence_transformers.models.Transformer"},
        ...     {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        ...     {"path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
        >>> _ = (folder / "1_Pooling" / "config.json").write_text(
        ...     json.dumps({"pooling_mode_mean_tokens": True}))
        >>> declared_settings(folder)
        EmbeddingSettings(poolings=('mean',), normalize=True, sequence_length=None)
    """
    folder = Path(folder) if folder is not None else None
    if folder is None or not (folder / "modules.json").is_file():
        return EmbeddingSettings()
    modules = _read_json(folder / "modules.json")
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise UserError("expected a list of modules", source=folder / "modules.json")
    kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules}
    unknown = sorted(set(kinds) - _KNOWN_MODULES)
    if unknown:
        raise UserError(
            f"sentence-transformers modules {', '.join(unknown)} are not supported "
            "(bertkit embeds with Transformer, Pooling and Normalize)",
            source=folder / "modules.json",
        )
    poolings = None
    if "Pooling" in kinds:
        poolings = _pooling_modes(folder / str(kinds["Pooling"].get("path", "")) / "config.json")
    return EmbeddingSettings(poolings, "Normalize" in kinds, _max_seq_length(folder))


def _pooling_modes(config_path: Path) -> tuple[str, ...]:
    config = _read_json(config_path)
    if not isinstance(config, dict):
        raise UserError("expected a JSON object", source=config_path)
    unsupported = [key for key in _UNSUPPORTED_MODES if config.get(key)]
    if unsupported:
        raise UserError(f"{unsupported[0]} is not supported", source=config_path)
    modes = tuple(name for key, name in _MODES.items() if config.get(key))
    if not modes:
        raise UserError("declares no pooling mode", source=config_path)
    return tuple(name for name in POOLINGS if name in modes)


def _max_seq_length(folder: Path) -> int | None:
    path = folder / "sentence_bert_config.json"
    if not path.is_file():
        return None
    value = _read_json(path)
    length = value.get("max_seq_length") if isinstance(value, dict) else None
    return length if isinstance(length, int) and length > 1 else None


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError("file not found", source=path) from None
    except (OSError, ValueError, RecursionError) as error:
        raise UserError(f"cannot read it: {error}"[:200], source=path) from None


def parse_poolings(text: str, source="--pooling") -> tuple[str, ...]:
    """`mean`, or several joined by `+` (`cls+mean`), as `POOLINGS` names them.

    Example:
        >>> parse_poolings("mean+cls")
        ('cls', 'mean')
    """
    names = tuple(part.strip() for part in str(text).split("+"))
    for name in names:
        if name not in POOLINGS:
            raise UserError(
                f"unknown pooling {name!r}; choose from {', '.join(POOLINGS)}", source=source
            )
    return tuple(name for name in POOLINGS if name in names)


def parse_layers(spec, num_layers: int, source="--layers") -> tuple[int, ...]:
    """Hidden layers by index as transformers numbers them: 0 the embeddings, 1 to
    `num_layers` the encoder layers, negative from the end (-1 the last). A slice
    `-4:` or a comma list `-4,-3,-2,-1` picks several (in order); None: the last.

    Example:
        >>> parse_layers("-4:", 6), parse_layers("0,-1", 6), parse_layers(None, 6)
        ((3, 4, 5, 6), (0, 6), (6,))
    """
    if spec is None:
        return (num_layers,)
    count = num_layers + 1
    text = str(spec).replace(" ", "")
    try:
        if ":" in text:
            start, _, stop = text.partition(":")
            picked = range(count)[slice(int(start) if start else None, int(stop) if stop else None)]
        else:
            picked = [int(part) for part in text.split(",")]
    except ValueError:
        raise UserError(
            f"expected layer indices such as -1, -4: or -4,-3,-2,-1, got {spec!r}", source=source
        ) from None
    layers = tuple(index % count if -count <= index < count else None for index in picked)
    if not layers or None in layers:
        raise UserError(
            f"{spec!r} picks no layer or one the model lacks: it has hidden layers 0 "
            f"(the embeddings) to {num_layers} (or -{count} to -1)",
            source=source,
        )
    return layers
