"""Recipes: the YAML file that says what to fine-tune, on what, and how.

Loading a recipe imports neither TensorFlow nor Keras, so a bad recipe is
answered at once (`bertkit check`). A recipe names the task and overrides only
what differs from the defaults below::

    schema: 1
    task: classification            # or {name: classification, <task options>}
    backbone: {preset: ../models/minilm, sequence_length: 128}
    data: {train: ../data/train.tsv, validation: ../data/dev.tsv, text: sentence}
    training: {epochs: 3, batch_size: 32, learning_rate: 3.0e-5}
    output_dir: ../runs/sst2

Relative paths in a recipe resolve against the recipe's folder; relative paths
given with `--set` or `--output` resolve against the current directory.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import yaml

from bertkit.batching.plan import BatchPlan
from bertkit.errors import UserError
from bertkit.model.lora import check_targets
from bertkit.recipes import schema
from bertkit.recipes.overrides import apply_overrides
from bertkit.recipes.presets import expand_preset
from bertkit.recipes.run_folder import resolve_run_folder
from bertkit.recipes.search_space import SearchSpace, parse_search
from bertkit.recipes.search_space import json_schema as search_json_schema
from bertkit.recipes.sections import BackboneConfig, ExportConfig, TrainingConfig
from bertkit.recipes.yaml_source import load_yaml
from bertkit.registry import load_task, task_names

SCHEMA_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A validated recipe; `task_options` and `data` are instances of the task's classes."""

    schema: int
    task: str
    task_options: object
    backbone: BackboneConfig
    data: object
    training: TrainingConfig
    output_dir: str
    source: str = "<recipe>"
    search: SearchSpace | None = None  # the `search:` section, for `bertkit tune`
    export: ExportConfig = ExportConfig()  # the `export:` section
    # where each value came from (the file's line, `--set`), for the errors of later checks
    origin: object = dataclasses.field(default=None, compare=False, repr=False)
    # {dotted key: value} that `training.preset` filled in (`bertkit.recipes.presets`)
    preset_values: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def error(self, message: str, path: tuple) -> UserError:
        """A `UserError` about the value at key `path`, located where that value came from."""
        if self.origin is None:
            return schema.Origin(self.source).error(message, path)
        return self.origin.error(message, path)

    def to_dict(self) -> dict:
        """The fully resolved recipe, as written into the run directory."""
        return {
            "schema": self.schema,
            "task": {"name": self.task, **schema.to_plain(self.task_options)},
            "backbone": schema.to_plain(self.backbone),
            "data": schema.to_plain(self.data),
            "training": schema.to_plain(self.training),
            "output_dir": self.output_dir,
            **({"export": schema.to_plain(self.export)} if self.export != ExportConfig() else {}),
            **({"search": self.search.to_plain()} if self.search else {}),
        }

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def task_class(self):
        return load_task(self.task)

    def with_output_dir(self, folder, source: str = "output_dir") -> Recipe:
        """This recipe writing its run into `folder` (`--output`; see `resolve_run_folder`),
        a `UserError` from `source` when it cannot."""
        try:
            resolved = resolve_run_folder(folder)
        except UserError as error:
            raise UserError(error.message, source=source) from None
        return dataclasses.replace(self, output_dir=str(resolved))


_SECTIONS = ("schema", "task", "backbone", "data", "training", "output_dir", "search", "export")


def load_recipe(
    recipe, overrides: list[str] | None = None, *, called_as: str = "load_recipe", **sections
) -> Recipe:
    """Reads and validates a recipe file (or mapping), with overrides applied.

    Args:
        recipe: path of a YAML recipe, or a mapping with the same content.
        overrides: `"training.epochs=3"`-style strings, as given to `--set`.
        called_as: the function the user called with `sections`, named by their errors:
            `finetune(training=...): training.epochs: expected an integer, got 'x'`.
        **sections: mappings merged into the recipe's sections, as in
            `load_recipe("r.yaml", training={"epochs": 1})`.

    Example:
        >>> r = load_recipe({"schema": 1, "task": "classification",
        ...                  "backbone": {"preset": "bert_tiny_en_uncased"},
        ...                  "data": {"train": "train.tsv"}}, ["training.epochs=1"])
        >>> r.task, r.training.epochs, r.training.batch_size
        ('classification', 1, 32)
    """
    if isinstance(recipe, (str, Path)):
        raw, lines = load_yaml(recipe)
        origin = schema.Origin(str(recipe), lines, Path(recipe).resolve().parent)
        default_output = Path("runs") / Path(recipe).stem
    else:
        raw, origin = copy.deepcopy(recipe), schema.Origin("<recipe>", {}, Path.cwd())
        default_output = Path("runs") / "run"
    if not isinstance(raw, dict):
        raise UserError(
            "a recipe is a mapping of sections: " + ", ".join(_SECTIONS),
            source=origin.source,
            line=1,
        )
    overridden = _override_origins(apply_overrides(raw, overrides or [], sections), called_as)
    return _build_recipe(raw, origin, overridden, default_output)


def _override_origins(labels: dict, called_as: str) -> dict:
    """{key path: its `Origin`}: `--set`, or `finetune(training=...)` for a keyword."""
    origins = {
        label: schema.Origin(
            label if label == "--set" else f"{called_as}({label}...)", {}, Path.cwd()
        )
        for label in set(labels.values())
    }
    return {path: origins[label] for path, label in labels.items()}


def _build_recipe(raw: dict, file_origin, overridden: dict, default_output) -> Recipe:
    origin = schema.MixedOrigin(file_origin, overridden)
    _check_top_level(raw, origin)
    task_name, task_options = _task_section(raw, origin)
    where = origin.error("", ("task",))
    task_class = load_task(task_name, source=where.source, line=where.line)
    fields = [f.name for f in dataclasses.fields(task_class.Options)]
    raw["training"], task_options, filled = expand_preset(
        raw.get("training") or {}, task_options, fields, origin
    )
    options = schema.build(task_class.Options, task_options, origin, ("task",))
    data, backbone, training = _build_sections(raw, origin, task_class, options)
    search = None
    if raw.get("search") is not None:
        search = parse_search(
            raw["search"],
            origin,
            {"training": TrainingConfig, "task": task_class.Options, "backbone": BackboneConfig},
        )
    return Recipe(
        schema=SCHEMA_VERSION,
        task=task_name,
        task_options=options,
        backbone=backbone,
        data=data,
        training=training,
        output_dir=_output_dir(raw, origin, default_output),
        source=file_origin.source,
        search=search,
        export=_export_section(raw, origin, task_class),
        origin=origin,
        preset_values=filled,
    )


def _check_top_level(raw: dict, origin) -> None:
    """Known sections only, and the schema version this bertkit reads."""
    for key in raw:
        if key not in _SECTIONS:
            message = schema._unknown_key_message(key, dict.fromkeys(_SECTIONS))
            raise origin.error(message, (key,))
    if "schema" not in raw:
        raise origin.error(
            f"missing required key 'schema' (this bertkit reads schema {SCHEMA_VERSION})",
            ("schema",),
        )
    if raw["schema"] != SCHEMA_VERSION:
        raise origin.error(
            f"unsupported schema {raw['schema']!r}; this bertkit reads schema {SCHEMA_VERSION}",
            ("schema",),
        )


def _build_sections(raw: dict, origin, task_class, options) -> tuple:
    """The `data`, `backbone` (its preset resolved) and `training` sections, checked."""
    for section in ("backbone", "data"):
        if not isinstance(raw.get(section), dict):
            problem = (
                "missing required section" if raw.get(section) is None else "expected a mapping for"
            )
            raise origin.error(f"{problem} '{section}'", (section,))
    data = schema.build(task_class.Data, raw["data"], origin, ("data",))
    if data.train is None:
        raise origin.error("missing required key 'train'", ("data", "train"))
    backbone = schema.build(BackboneConfig, raw["backbone"], origin, ("backbone",))
    backbone = _resolve_preset(backbone, origin.base_dir_for(("backbone", "preset")))
    training = schema.build(TrainingConfig, raw.get("training") or {}, origin, ("training",))
    BatchPlan.check_recipe(
        training,
        task_class,
        lambda message, key: origin.error(message, ("training", key)),
        spans_batch=task_class.loss_spans_batch(options),
        options=options,
    )
    _check_feature_based(backbone, training, origin)
    lora_path = ("training", "lora")
    check_targets(training.lora, lambda message, path: origin.error(message, lora_path + path))
    return data, backbone, training


def _check_feature_based(backbone: BackboneConfig, training: TrainingConfig, origin) -> None:
    """A frozen encoder (`backbone.trainable: false`) and read layers (`backbone.features`)
    with the training options they contradict."""
    if not backbone.trainable and training.lora is not None:
        message = "false freezes the whole encoder, LoRA trains part of it: remove training.lora"
        raise origin.error(message, ("backbone", "trainable"))
    if not backbone.trainable and training.reinit_top_layers:
        message = "false keeps the encoder as loaded: training.reinit_top_layers would stay random"
        raise origin.error(message, ("backbone", "trainable"))
    if not backbone.trainable and training.layer_lr_decay not in (None, 1.0):
        message = "false trains no backbone layer: remove training.layer_lr_decay"
        raise origin.error(message, ("backbone", "trainable"))
    if backbone.features is not None and training.packing is True:
        message = "packed training reads the last layer only: set training.packing to false"
        raise origin.error(message, ("backbone", "features"))


def _export_section(raw: dict, origin, task_class) -> ExportConfig:
    export = schema.build(ExportConfig, raw.get("export") or {}, origin, ("export",))
    if export.quantize is not None and task_class.int8_max_drop is None:
        message = f"the {task_class.name} task offers no int8 export; remove export.quantize"
        raise origin.error(message, ("export", "quantize"))
    return export


def _output_dir(raw: dict, origin, default_output: Path) -> str:
    if "output_dir" not in raw:
        return str(default_output.resolve())
    value = raw["output_dir"]
    if value is None:  # `output_dir: ~` too: YAML's null, not the home folder
        message = "expected a folder path, got null (a bare ~ is YAML's null too; write $HOME/...)"
        raise origin.error(message, ("output_dir",))
    if not isinstance(value, str) or not value:
        raise origin.error(f"expected a folder path, got {value!r}", ("output_dir",))
    try:
        return str(resolve_run_folder(value, origin.base_dir_for(("output_dir",))))
    except UserError as error:
        raise origin.error(error.message, ("output_dir",)) from None


def _task_section(raw: dict, origin) -> tuple[str, dict]:
    task = raw.get("task")
    if isinstance(task, str):
        return task, {}
    if isinstance(task, dict) and isinstance(task.get("name"), str):
        return task["name"], {k: v for k, v in task.items() if k != "name"}
    if task is None:
        raise origin.error(
            f"missing required key 'task' (one of: {', '.join(task_names())})", ("task",)
        )
    raise origin.error("expected a task name or a mapping with 'name'", ("task",))


def _resolve_preset(backbone: BackboneConfig, base_dir: Path | None) -> BackboneConfig:
    preset = backbone.preset
    looks_like_path = preset.startswith((".", "/", "~")) or ("/" in preset and ":" not in preset)
    if base_dir is not None and (looks_like_path or (base_dir / preset).is_dir()):
        resolved = (base_dir / Path(preset).expanduser()).resolve()
        return dataclasses.replace(backbone, preset=str(resolved))
    return backbone


def recipe_json_schema() -> dict:
    """JSON Schema of recipes for all installed tasks (for editor completion)."""
    task_variants, data_variants = _task_schemas()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "bertkit recipe",
        "type": "object",
        "additionalProperties": False,
        "required": ["schema", "task", "backbone", "data"],
        "properties": {
            "schema": {"const": SCHEMA_VERSION, "description": "the recipe format's version"},
            "task": {"anyOf": task_variants, "description": "the task plugin and its options"},
            "backbone": {
                **schema.json_schema(BackboneConfig),
                "description": "the pretrained model and how texts are tokenized for it",
            },
            "data": {"anyOf": data_variants, "description": "the task's data files"},
            "training": {
                **schema.json_schema(TrainingConfig),
                "description": "how the model is trained",
            },
            "output_dir": {
                "type": "string",
                "description": "the run directory; a relative path is read from the recipe's "
                "folder (default: runs/<the recipe's file name without .yaml>, in the current "
                "folder)",
            },
            "search": search_json_schema(),
            "export": {
                **schema.json_schema(ExportConfig),
                "description": "what `bertkit finetune` exports at the end of the run",
            },
        },
    }


def _task_schemas() -> tuple[list, list]:
    """The `task:` variants (a name alone, or its options) and the `data:` variants of every
    installed task, each titled with the task's name (editors and the generated recipe
    reference show it)."""
    from bertkit.registry import describe_tasks

    task_variants, data_variants = [], []
    for info in describe_tasks():
        if info.error:
            continue
        task_class = load_task(info.name)
        options = schema.json_schema(task_class.Options)
        options["properties"] = {
            "name": {"const": info.name, "description": "the task's name"},
            **options["properties"],
        }
        options["required"] = ["name", *options.get("required", [])]
        task_variants += [{"const": info.name}, {"title": info.name, **options}]
        data_variants.append({"title": info.name, **schema.json_schema(task_class.Data)})
    return task_variants, data_variants
