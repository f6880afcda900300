"""The `search:` section of a recipe: which recipe values a hyperparameter search tries.

Keys with a dot name a recipe value and map it to a space; keys without one are the
search's own settings::

    search:
      trials: 12
      training.learning_rate: {low: 1.0e-5, high: 1.0e-4, log: true}   # a range
      training.batch_size: [16, 32]                                     # choices
      training.epochs: [2, 3, 4]
      task.dropout: {low: 0.0, high: 0.3}
      training.lora.rank: [4, 8, 16]     # turns LoRA on in every trial

A range is searched as an integer when the recipe value is an integer, else as a
number; every bound and choice is checked against the recipe schema of the value it
sets, so a trial's recipe is valid before any trial runs. Pure: Optuna is used only
through the `trial` object given to `SearchSpace.suggest`, and imported only by
`Dimension.distribution` (what a study records of a value, to compare with it).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Literal

from bertkit.recipes import schema

_field = dataclasses.field
_SCALARS = (bool, int, float, str, type(None))  # what Optuna's categorical choices may be


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """The search's own settings: the keys of `search:` without a dot."""

    trials: int = _field(
        default=20,
        metadata={"min": 1, "help": "finished (complete or pruned) trials the study ends with"},
    )
    timeout: float | None = _field(
        default=None,
        metadata={
            "min_exclusive": 0.0,
            "help": "seconds after which no worker starts another trial",
        },
    )
    sampler: Literal["tpe", "random"] = _field(
        default="tpe", metadata={"help": "Optuna's TPESampler, or RandomSampler"}
    )
    seed: int | None = _field(
        default=None,
        metadata={
            "min": 0,
            "max": 2**32 - 1,  # as training.seed: what NumPy's seeds take
            "help": "the sampler's seed (give several workers none, or they sample alike)",
        },
    )
    pruner: Literal["median", "hyperband", "none"] = _field(
        default="median",
        metadata={
            "help": "stops trials whose validation metric falls behind: Optuna's MedianPruner, "
            "HyperbandPruner, or no pruning"
        },
    )
    pruner_startup_trials: int = _field(
        default=2,
        metadata={"min": 0, "help": "median: trials that finish before any trial is pruned"},
    )
    pruner_warmup_epochs: int = _field(
        default=0,
        metadata={"min": 0, "help": "median: epochs a trial always trains before it may be pruned"},
    )


@dataclasses.dataclass(frozen=True)
class _Range:
    low: float = _field(metadata={"help": "the smallest value searched"})
    high: float = _field(metadata={"help": "the largest value searched"})
    log: bool = _field(default=False, metadata={"help": "sample on a log scale (low > 0)"})
    step: float | None = _field(
        default=None,
        metadata={"min_exclusive": 0.0, "help": "search low, low + step, ... only (not with log)"},
    )


@dataclasses.dataclass(frozen=True)
class Dimension:
    """One searched recipe value: a range (`low`..`high`) or a list of `choices`."""

    key: str  # dotted recipe key, "training.learning_rate"
    integer: bool = False
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple | None = None

    def suggest(self, trial):
        if self.choices is not None:
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.integer:
            return trial.suggest_int(
                self.key, self.low, self.high, step=self.step or 1, log=self.log
            )
        return trial.suggest_float(self.key, self.low, self.high, step=self.step, log=self.log)

    def distribution(self):
        """The Optuna distribution `suggest` draws from, as a study records it."""
        from optuna import distributions

        if self.choices is not None:
            return distributions.CategoricalDistribution(list(self.choices))
        if self.integer:
            return distributions.IntDistribution(
                self.low, self.high, step=self.step or 1, log=self.log
            )
        return distributions.FloatDistribution(self.low, self.high, step=self.step, log=self.log)

    def to_plain(self):
        if self.choices is not None:
            return list(self.choices)
        plain = {"low": self.low, "high": self.high}
        return {
            **plain,
            **({"log": True} if self.log else {}),
            **({"step": self.step} if self.step is not None else {}),
        }


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """A validated `search:` section.

    Example:
        >>> import optuna
        >>> from bertkit.recipes.recipe import load_recipe
        >>> recipe = load_recipe({"schema": 1, "task": "classification",
        ...     "backbone": {"preset": "bert_tiny_en_uncased"}, "data": {"train": "t.tsv"},
        ...     "search": {"trials": 4, "training.epochs": [2, 3],
        ...                "training.learning_rate": {"low": 1e-5, "high": 1e-4, "log": True}}})
        >>> space = recipe.search
        >>> space.options.trials, [d.key for d in space.dimensions]
        (4, ['training.epochs', 'training.learning_rate'])
        >>> trial = optuna.trial.FixedTrial({"training.epochs": 3,
        ...                                  "training.learning_rate": 2e-5})
        >>> space.overrides(space.suggest(trial))
        ['training.epochs=3', 'training.learning_rate=2e-05']
    """

    options: SearchOptions
    dimensions: tuple[Dimension, ...]

    def suggest(self, trial) -> dict:
        """{dotted key: value} for one trial, drawn by an Optuna trial's `suggest_*`."""
        return {dimension.key: dimension.suggest(trial) for dimension in self.dimensions}

    @staticmethod
    def overrides(values: dict) -> list[str]:
        """Values as `--set` strings (JSON is YAML, so each reads back as the same value)."""
        return [f"{key}={json.dumps(value)}" for key, value in values.items()]

    def to_plain(self) -> dict:
        return {
            **schema.to_plain(self.options),
            **{dimension.key: dimension.to_plain() for dimension in self.dimensions},
        }


def parse_search(raw, origin, sections: dict[str, type]) -> SearchSpace:
    """Validates a `search:` mapping; `sections` maps a recipe section to its dataclass.

    Every mistake is a `UserError` naming the file, line and key, as for the rest
    of the recipe.
    """
    path = ("search",)
    if not isinstance(raw, dict):
        raise origin.error(f"expected a mapping, got {schema._describe(raw)}", path)
    settings = {key: value for key, value in raw.items() if "." not in key}
    options = schema.build(SearchOptions, settings, origin, path)
    dimensions = tuple(
        _dimension(key, value, origin, sections) for key, value in raw.items() if "." in key
    )
    if not dimensions:
        raise origin.error(
            "names no recipe value to search; add e.g. "
            "'training.learning_rate: {low: 1.0e-5, high: 1.0e-4, log: true}'",
            path,
        )
    return SearchSpace(options, dimensions)


def _dimension(key: str, value, origin, sections: dict[str, type]) -> Dimension:
    path = ("search", key)
    hint, field = _target(key, origin, sections)
    if isinstance(value, list):
        return Dimension(key, choices=_choices(value, hint, field, origin, path))
    if isinstance(value, dict):
        return _range(key, value, hint, field, origin)
    raise origin.error(
        "expected a range {low: ..., high: ...} or a list of choices, got "
        f"{schema._describe(value)}",
        path,
    )


def _target(key: str, origin, sections: dict[str, type]):
    """The type hint and dataclass field of the recipe value a dotted key names; a key
    may go down into a section's own sections (`training.lora.rank`)."""
    path = ("search", key)
    section, *names = key.split(".")
    if section not in sections:
        raise origin.error(
            f"cannot search '{section}' values; searchable sections: {', '.join(sections)}", path
        )
    owner, prefix = sections[section], section
    for depth, name in enumerate(names):
        fields = {f.name: f for f in dataclasses.fields(owner) if f.init}
        if name not in fields:
            keys = [f"{prefix}.{field}" for field in fields]
            raise origin.error(
                schema._unknown_key_message(f"{prefix}.{name}", dict.fromkeys(keys)), path
            )
        hint = typing.get_type_hints(owner)[name]
        if depth == len(names) - 1:
            return hint, fields[name]
        owner, prefix = _section_type(hint), f"{prefix}.{name}"
        if owner is None:
            raise origin.error(f"{prefix} is a value, not a section of values", path)
    raise AssertionError("unreachable: a key with a dot names at least one value")


def _section_type(hint):
    """The dataclass a recipe value holds (`LoraConfig | None` -> LoraConfig), else None."""
    options = set(typing.get_args(hint)) - {type(None)} if typing.get_args(hint) else {hint}
    sections = [option for option in options if dataclasses.is_dataclass(option)]
    return sections[0] if len(sections) == 1 else None


def _choices(values: list, hint, field, origin, path) -> tuple:
    if not values:
        raise origin.error("expected at least one choice, got an empty list", path)
    checked = []
    for index, value in enumerate(values):
        if not isinstance(value, _SCALARS):
            raise origin.error(
                f"choices are numbers, strings, true/false or null, got {schema._describe(value)}",
                path + (index,),
            )
        checked.append(schema.check_value(hint, field, value, origin, path + (index,)))
    return tuple(checked)


def _range(key: str, value: dict, hint, field, origin) -> Dimension:
    path = ("search", key)
    kind = _numeric_type(hint)
    if kind is None:
        raise origin.error(
            f"a range needs a numeric value, and {key} is not a number; give a list of choices",
            path,
        )
    bounds = schema.build(_Range, value, origin, path)
    low, high = (
        schema.check_value(kind, field, value[name], origin, path + (name,))
        for name in ("low", "high")
    )
    if low >= high:
        raise origin.error(f"low must be less than high, got {low} and {high}", path)
    if bounds.log and low <= 0:
        raise origin.error(f"a log range needs low > 0, got {low}", path + ("low",))
    if bounds.log and bounds.step is not None:
        raise origin.error("a range takes log or step, not both", path)
    if kind is int and bounds.step is not None and bounds.step != int(bounds.step):
        raise origin.error(f"expected an integer step, got {bounds.step}", path + ("step",))
    step = None if bounds.step is None else kind(bounds.step)
    return Dimension(key, integer=kind is int, low=low, high=high, log=bounds.log, step=step)


def _numeric_type(hint):
    """int or float when a recipe value is a number (possibly optional), else None."""
    options = set(typing.get_args(hint)) - {type(None)} if typing.get_args(hint) else {hint}
    if options == {int}:
        return int
    if options <= {int, float} and float in options:
        return float
    return None


def json_schema() -> dict:
    """JSON Schema of the `search:` section (for `bertkit schema`)."""
    scalar = {"type": ["number", "string", "boolean", "null"]}
    space = {
        "anyOf": [
            {
                **schema.json_schema(_Range),
                "description": "a range, searched as an integer for integer values",
            },
            {"type": "array", "items": scalar, "minItems": 1, "description": "a list of choices"},
        ]
    }
    options = schema.json_schema(SearchOptions)
    return {
        "type": "object",
        "description": "hyperparameter search ('bertkit tune'): dotted "
        "recipe keys mapped to ranges or choices",
        "properties": options["properties"],
        "patternProperties": {r"^(training|task|backbone)(\.[A-Za-z_]+)+$": space},
        "additionalProperties": False,
    }
