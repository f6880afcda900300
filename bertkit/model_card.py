"""The model card: README.md in a run directory, the file users of model hubs look for."""

from __future__ import annotations

import os
from pathlib import Path

from bertkit.report import markdown_table

# The training options the card names (the full recipe is recipe.yaml beside it).
_SHOWN_TRAINING = (
    "epochs",
    "batch_size",
    "learning_rate",
    "warmup_ratio",
    "weight_decay",
    "max_grad_norm",
    "seed",
)


def write_model_card(
    path,
    *,
    recipe: dict,
    data_sizes: dict,
    final: dict,
    monitor: str,
    task_description: str,
    best: dict | None,
) -> None:
    """README.md in the run directory, the model card users of model hubs look for."""
    lines = [
        *_about(path, recipe, task_description),
        *_data(data_sizes),
        *_training_recipe(recipe["training"], monitor, best),
        *_metrics(final),
        *_use_and_limits(recipe),
    ]
    Path(path).write_text("\n".join(lines))


def _about(path, recipe: dict, task_description: str) -> list[str]:
    return [
        f"# {Path(recipe.get('output_dir') or path).name}: a bertkit "
        f"{recipe['task']['name']} model",
        "",
        f"{task_description}",
        "",
        "## Base model",
        "",
        f"`{recipe['backbone']['preset']}`, fine-tuned with bertkit "
        f"(sequence length {recipe['backbone']['sequence_length']}).",
        "",
    ]


def _data(data_sizes: dict) -> list[str]:
    rows = [
        [split, f"`{info['file']}`", info["examples"], info["size"]]
        for split, info in data_sizes.items()
    ]
    return ["## Data", "", markdown_table(["split", "file", "examples", "size"], rows), ""]


def _training_recipe(training: dict, monitor: str, best: dict | None) -> list[str]:
    shown = {k: training[k] for k in _SHOWN_TRAINING if k in training}
    return [
        "## Training recipe",
        "",
        ", ".join(f"{k} {v}" for k, v in shown.items())
        + (f"; best epoch {best['epoch']} by `{monitor}`" if best else "")
        + ". The full recipe is `recipe.yaml`.",
        "",
    ]


def _metrics(final: dict) -> list[str]:
    rows = [
        [split, name, value]
        for split, metrics in final.items()
        for name, value in metrics.items()
        if isinstance(value, (int, float))
    ]
    table = (
        markdown_table(["split", "metric", "value"], rows)
        if rows
        else "No validation or test split was evaluated."
    )
    return ["## Metrics", "", table, ""]


def _use_and_limits(recipe: dict) -> list[str]:
    return [
        "## Intended use",
        "",
        f"{recipe['task']['name']} on text like the training data "
        "(same language, domain and label set). Use it with "
        "`bertkit predict <run>`, `bertkit.load(<run>).predict([...])`, or serve "
        "`saved_model/` with TensorFlow and tensorflow-text (raw text in).",
        "",
        "## Limits",
        "",
        "- Measured only on the splits above; expect lower quality on other domains, "
        "languages or label definitions.",
        f"- Inputs longer than {recipe['backbone']['sequence_length']} word pieces are "
        "truncated or windowed by the task.",
        "- It inherits the biases of the base model and of the training data; review "
        "its errors (`report.md`) before relying on it.",
        "",
    ]


def data_size(path, examples: int | None) -> dict:
    """`{"file", "examples", "size"}` of a data file, for the model card."""
    try:
        size = f"{os.path.getsize(path) / 1024:.1f} KiB"
    except (OSError, TypeError):
        size = "?"
    return {
        "file": Path(path).name if path else "-",
        "examples": "?" if examples is None else examples,
        "size": size,
    }
