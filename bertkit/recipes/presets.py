"""Named sets of recipe values (`training.preset`), and the hint that names one.

`training.preset: small_data` is the small-data recipe of `docs/training/small-data.md` for
any task: longer training with early stopping, the head at its own learning rate, the top
layer re-initialised, and balanced class weights where the task has them (tagging's
`task.class_weights`). A preset fills only the keys the recipe leaves out: a key the recipe
(or `--set`) gives wins. The values it filled are the recipe's `preset_values` (`run.json`
records them), and the resolved recipe (`bertkit check`, the run's `recipe.yaml`) shows them.
"""

from __future__ import annotations

import difflib

# what each preset sets: {section: {key: value}}; "task" keys only where the task has them
PRESETS = {
    "small_data": {
        "training": {
            "epochs": 10,
            "early_stopping_patience": 3,
            "head_learning_rate": 1e-3,
            "reinit_top_layers": 1,
        },
        "task": {"class_weights": "balanced"},
    },
}
# Under this many training examples a run is told of `small_data`: it was measured on
# WNUT-16's 2,394 tweets and on 1,000-sentence slices (docs/benchmarks/small-data.md),
# nothing above.
SMALL_DATA_EXAMPLES = 3000
# What the preset measured, per task, against transformers trained as long (10 epochs with
# its early stopping): the hint says it; a task without a row says what was measured elsewhere.
SMALL_DATA_MEASURED = {
    "tagging": "+6.5 test entity F1 over transformers trained as long on WNUT-16 "
    "(42.7 vs 36.2) and +4.5 on CoNLL-2003's first 1,000 sentences (77.4 vs 72.9)",
    "classification": "+1.3 accuracy over transformers trained as long on SST-2's first 1,000 "
    "sentences (82.5 vs 81.2) and +1.9 on RTE (59.4 vs 57.5)",
}


def expand_preset(training: dict, task_options: dict, task_fields, origin) -> tuple:
    """The `training:` and task options mappings with `training.preset`'s values filled in
    where absent; with {dotted key: value} of those it filled (empty without a preset).

    Example:
        >>> from bertkit.recipes.schema import Origin
        >>> training, task, filled = expand_preset(
        ...     {"preset": "small_data", "epochs": 4}, {}, ["class_weights"], Origin("r.yaml"))
        >>> training["epochs"], training["reinit_top_layers"], task["class_weights"]
        (4, 1, 'balanced')
        >>> sorted(filled)  # doctest: +NORMALIZE_WHITESPACE
        ['task.class_weights', 'training.early_stopping_patience',
         'training.head_learning_rate', 'training.reinit_top_layers']
        >>> expand_preset({"preset": "smalldata"}, {}, [], Origin("r.yaml"))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        bertkit.errors.UserError: r.yaml: training.preset: unknown preset 'smalldata'; did you ...
    """
    name = training.get("preset")
    if name is None:
        return training, task_options, {}
    if name not in PRESETS:
        close = difflib.get_close_matches(str(name), list(PRESETS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ";"
        message = f"unknown preset {name!r}{hint} available: {', '.join(PRESETS)}"
        raise origin.error(message, ("training", "preset"))
    preset, filled = PRESETS[name], {}
    training, task_options = dict(training), dict(task_options)
    for key, value in preset["training"].items():
        if key not in training:
            training[key] = filled[f"training.{key}"] = value
    for key, value in preset["task"].items():
        if key in task_fields and key not in task_options:
            task_options[key] = filled[f"task.{key}"] = value
    return training, task_options, filled


def small_data_hint(recipe, examples: int) -> str | None:
    """The line that names `small_data` to a run of few training `examples` that does not
    use it, or None: a status line of `finetune` (stdout, as its other lines: stderr stays
    for errors) and a comment under `bertkit check`'s recipe. It gives what the preset
    measured on the recipe's task (`SMALL_DATA_MEASURED`), or says it was not measured there.

    Example:
        >>> from types import SimpleNamespace
        >>> recipe = SimpleNamespace(task="tagging", training=SimpleNamespace(preset=None))
        >>> print(small_data_hint(recipe, 2394))  # doctest: +ELLIPSIS
        small data: 2,394 training examples: 'training.preset: small_data' scored +6.5 test ...
        >>> small_data_hint(recipe, 5000) is None
        True
    """
    if examples >= SMALL_DATA_EXAMPLES or recipe.training.preset == "small_data":
        return None
    measured = SMALL_DATA_MEASURED.get(recipe.task)
    if measured is None:
        tagging = SMALL_DATA_MEASURED["tagging"]
        measured = f"was not measured on {recipe.task}; on tagging it scored {tagging}"
    else:
        measured = f"scored {measured}"
    return (
        f"small data: {examples:,} training examples: 'training.preset: small_data' "
        f"{measured} (docs/training/small-data.md)"
    )
