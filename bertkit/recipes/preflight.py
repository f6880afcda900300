"""Will this run start? The checks `bertkit check` and `finetune` share.

`finetune` runs them before it touches the run directory, and the `bertkit` command before
TensorFlow loads, so a recipe that `finetune` would refuse before its first step is refused
by `bertkit check` too, in a second, for the same reason and with the same message. They
read the data files' existence and the checkpoint's config, never its weights:

- `check_inputs`: the files a recipe reads exist (data files, preset folders);
- `check_backbone_fits`: the settings that must fit the backbone (`sequence_length`,
  `reinit_top_layers`, the LoRA rank) against its sizes, read from the checkpoint folder's
  config (`bertkit.model.sizes`). A named keras-hub preset has no folder to read before
  keras-hub downloads it: `finetune` runs the same check once its backbone is built.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from bertkit.errors import UserError
from bertkit.model.backbone import folder_problem, resolve_preset, sequence_length_problem
from bertkit.model.hf_files import missing_weights
from bertkit.model.lora import LoraConfig, rank_problem
from bertkit.model.reinitialize import count_problem
from bertkit.model.sizes import BackboneSizes, read_sizes
from bertkit.recipes.recipe import Recipe, _resolve_preset
from bertkit.recipes.sections import BackboneConfig


def check_run(recipe: Recipe, *, data_files: bool = True) -> None:
    """Every check a run of `recipe` passes before it trains that needs no framework:
    `check_inputs`, then `check_backbone_fits` where the preset is a local folder.

    Raises a `UserError` naming the recipe's file, line and key.
    """
    check_inputs(recipe, data_files=data_files)
    folder = Path(resolve_preset(recipe.backbone.preset, recipe.source)).expanduser()
    if not folder.is_dir():
        return  # a named keras-hub preset: checked once keras-hub has it
    if problem := folder_problem(folder):
        raise recipe.error(problem, ("backbone", "preset"))
    if not (folder / "metadata.json").exists() and (problem := missing_weights(folder)):
        raise UserError(problem, source=folder)
    sizes = read_sizes(folder)
    if sizes is not None:
        check_backbone_fits(recipe, sizes, folder)
        _check_search_fits(recipe, sizes, folder)


def check_backbone_fits(recipe: Recipe, sizes: BackboneSizes, folder=None) -> None:
    """The recipe's settings that must fit its backbone, checked against `sizes`: from the
    checkpoint's config (`check_run`) or from the built backbone (`finetune`)."""
    origin = recipe
    if sizes.model_type != "bert":
        message = f"'{folder}' is a '{sizes.model_type}' model, not BERT"
        raise origin.error(message, ("backbone", "preset"))
    training, lora = recipe.training, recipe.training.lora
    problems = {
        ("backbone", "sequence_length"): sequence_length_problem(
            recipe.backbone.sequence_length, sizes.max_positions
        ),
        ("training", "reinit_top_layers"): count_problem(
            training.reinit_top_layers, sizes.num_layers
        ),
        ("training", "lora", "rank"): lora
        and rank_problem(lora, sizes.hidden_dim, sizes.intermediate_dim),
    }
    for path, problem in problems.items():
        if problem:
            raise origin.error(problem, path)


# the searched keys `check_backbone_fits` checks (with one preset: a searched preset has
# sizes of its own)
_SIZED_KEYS = ("backbone.sequence_length", "training.reinit_top_layers", "training.lora.rank")


def _check_search_fits(recipe: Recipe, sizes: BackboneSizes, folder) -> None:
    """Each choice (or the `high` end of a range) of a searched `_SIZED_KEYS` value fits the
    backbone, as `check_backbone_fits` checks a trial's recipe."""
    dimensions = recipe.search.dimensions if recipe.search else ()
    if any(dimension.key == "backbone.preset" for dimension in dimensions):
        return
    for dimension in (d for d in dimensions if d.key in _SIZED_KEYS):
        named = (
            dict(enumerate(dimension.choices))
            if dimension.choices is not None
            else {"high": dimension.high}
        )
        for where, value in named.items():
            try:
                check_backbone_fits(_with_value(recipe, dimension.key, value), sizes, folder)
            except UserError as error:
                raise recipe.error(error.message, ("search", dimension.key, where)) from None


def _with_value(recipe: Recipe, key: str, value) -> Recipe:
    """`recipe` with one of `_SIZED_KEYS` set to `value`, as a trial's `--set` sets it."""
    section, name = key.split(".", 1)
    if name == "lora.rank":
        lora = recipe.training.lora or LoraConfig()
        training = dataclasses.replace(recipe.training, lora=dataclasses.replace(lora, rank=value))
        return dataclasses.replace(recipe, training=training)
    part = dataclasses.replace(getattr(recipe, section), **{name: value})
    return dataclasses.replace(recipe, **{section: part})


def check_inputs(recipe: Recipe, *, data_files: bool = True) -> None:
    """Checks that the files a recipe reads exist, without reading them or importing TensorFlow.

    Data files (every `path` field of the task's data section; skipped with
    `data_files=False`, as when training from a features file) must be readable files,
    and a local or `package:` preset must be a folder, as must those the `search:`
    section chooses from.
    """
    origin = recipe
    for field in dataclasses.fields(recipe.data) if data_files else ():
        value = getattr(recipe.data, field.name)
        if not field.metadata.get("path") or not isinstance(value, str):
            continue
        path = Path(value)
        if not path.exists():
            raise origin.error(f"file not found: {value}", ("data", field.name))
        if not path.is_file() or not os.access(path, os.R_OK):
            raise origin.error(f"not a readable file: {value}", ("data", field.name))
    _check_preset(recipe.backbone.preset, origin, ("backbone", "preset"))
    for dimension in recipe.search.dimensions if recipe.search else ():
        for index, choice in enumerate(dimension.choices or ()):
            if dimension.key == "backbone.preset":  # a trial sets it as --set does
                choice = _resolve_preset(BackboneConfig(choice), Path.cwd()).preset
                _check_preset(choice, origin, ("search", dimension.key, index))


def _check_preset(preset: str, origin, path: tuple) -> None:
    """A local or `package:` preset is a folder (keras-hub's named presets are checked
    when the backbone loads: listing them imports Keras)."""
    try:
        folder = resolve_preset(preset)
    except UserError as error:
        raise origin.error(error.message, path) from None
    if folder.startswith("/") and not Path(folder).is_dir():
        problem = "is not a folder" if Path(folder).exists() else "not found"
        named = f" (from '{preset}')" if folder != preset else ""
        raise origin.error(f"preset folder {problem}: {folder}{named}", path)
