"""The end-of-run report (report.md, learning_curve.png) and the task's error analysis, written
by `finetune` and by `bertkit evaluate`; their Markdown and plotting helpers. The model card is
`bertkit.model_card`'s; `bertkit.training.run_results.write_run_report` writes them all."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def markdown_table(header: list, rows: list[list]) -> str:
    """A Markdown table; floats to 4 decimals, `|` in cells escaped.

    Example:
        >>> print(markdown_table(["type", "F1"], [["PER", 0.91234]]))
        | type | F1 |
        |---|---|
        | PER | 0.9123 |
    """

    def cell(value) -> str:
        text = f"{value:.4f}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(map(cell, header)) + " |", "|---" * len(header) + "|"]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
    return "\n".join(lines)


def best_epoch(history: list[dict], monitor: str, mode: str) -> dict | None:
    """The epoch the run kept: best `monitor` (first of equals), else the last."""
    scored = [h for h in history if monitor in h]
    if not scored:
        return history[-1] if history else None
    return (max if mode == "max" else min)(scored, key=lambda h: h[monitor])


def plot_learning_curve(
    history: list[dict],
    path,
    steps: list[dict] | None = None,
    monitor: str | None = None,
    mode: str = "max",
) -> Path | None:
    """Left: training loss per logged step with the learning rate; right: the validation
    metric per epoch with the best epoch marked. Epochs on both x axes."""
    if not history:
        return None
    plt = pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    _plot_loss(left, history, steps or [])
    _plot_validation(right, history, monitor, mode)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return Path(path)


def _plot_loss(axes, history, steps) -> None:
    if steps:
        axes.plot(
            [s["progress"] for s in steps],
            [s["loss"] for s in steps],
            color="tab:blue",
            linewidth=1,
            label="training loss (per logged step)",
        )
    axes.plot(
        [h["epoch"] for h in history],
        [h.get("loss") for h in history],
        "o",
        color="tab:blue",
        label="training loss (epoch mean)",
    )
    axes.set_xlabel("epoch")
    axes.set_ylabel("loss")
    axes.set_title("training")
    axes.set_xlim(0, max(h["epoch"] for h in history) + 0.05)
    _epoch_ticks(axes, history)
    if steps:
        rate = axes.twinx()
        rate.plot(
            [s["progress"] for s in steps],
            [s["learning_rate"] for s in steps],
            color="tab:orange",
            linewidth=1,
            label="learning rate",
        )
        rate.set_ylabel("learning rate", color="tab:orange")
        rate.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        rate.legend(loc="upper right", fontsize="small")
    axes.legend(loc="lower left" if steps else "best", fontsize="small")


def _plot_validation(axes, history, monitor, mode) -> None:
    axes.set_xlabel("epoch")
    _epoch_ticks(axes, history)
    if not monitor or not any(monitor in h for h in history):
        axes.set_title("validation (no validation split)")
        return
    scored = [h for h in history if monitor in h]
    name = monitor.removeprefix("val_")
    axes.plot(
        [h["epoch"] for h in scored],
        [h[monitor] for h in scored],
        marker="o",
        color="tab:green",
        label=name,
    )
    best = best_epoch(history, monitor, mode)
    axes.scatter(
        [best["epoch"]],
        [best[monitor]],
        s=250,
        marker="*",
        color="tab:red",
        zorder=3,
        label=f"best: epoch {best['epoch']}, {best[monitor]:.4f}",
    )
    axes.set_title(f"validation {name} ({'higher' if mode == 'max' else 'lower'} is better)")
    axes.legend(fontsize="small")


def _epoch_ticks(axes, history) -> None:
    last = max(h["epoch"] for h in history)
    axes.set_xticks(range(0 if axes.get_xlim()[0] < 0.5 else 1, last + 1, max(1, last // 10)))


def write_report(
    path,
    *,
    recipe: dict,
    history: list[dict],
    final: dict,
    monitor: str,
    seconds: float,
    mode: str = "max",
    steps: list[dict] | None = None,
    task_section: str | None = None,
    lora: dict | None = None,
) -> None:
    """Writes report.md: setup, final metrics, per-epoch table, the plot, the task's section.
    `lora`: a LoRA run's record (`model/task.json`), for its trained share of the weights."""
    best = best_epoch(history, monitor, mode)
    kept = f", best epoch {best['epoch']}" if best and monitor in best else ""
    lines = [
        *_setup(recipe, history, monitor, seconds, kept, lora),
        *_final_metrics(final),
        *(_per_epoch(history, best, kept, steps) if history else []),
    ]
    if task_section:
        lines += ["", "# Validation error analysis (best epoch)", "", task_section]
    Path(path).write_text("\n".join(lines) + "\n")


def _setup(recipe: dict, history, monitor: str, seconds: float, kept: str, lora) -> list[str]:
    """report.md's title and the run's setup, one line each."""
    lines = [
        f"# bertkit run: {recipe['task']['name']}",
        "",
        f"- backbone: `{recipe['backbone']['preset']}`, sequence length "
        f"{recipe['backbone']['sequence_length']}",
        f"- training file: `{recipe['data']['train']}`",
        f"- epochs run: {len(history)}, wall time {seconds:.0f} s, best by `{monitor}`{kept}",
    ]
    if lora:
        lines.append(
            f"- LoRA rank {lora['rank']}, alpha {lora['alpha']:g} on "
            f"{', '.join(lora['targets'])}; {describe_trainable(lora)}"
        )
    return lines


def _final_metrics(final: dict) -> list[str]:
    lines = ["", "## Final metrics", "", "| split | metric | value |", "|---|---|---|"]
    for split, metrics in final.items():
        for name, value in metrics.items():
            if isinstance(value, (int, float)):
                lines.append(f"| {split} | {name} | {value:.4f} |")
    return lines


def _per_epoch(history: list[dict], best, kept: str, steps) -> list[str]:
    """The per-epoch table, the learning curve and how often the loss was logged."""
    columns = [k for k in history[-1] if k != "epoch"]
    rows = [
        [
            f"{h['epoch']}{' (best)' if h is best and kept else ''}",
            *(f"{h[c]:.4g}" if isinstance(h.get(c), float) else str(h.get(c, "")) for c in columns),
        ]
        for h in history
    ]
    lines = [
        "",
        "## Per epoch",
        "",
        markdown_table(["epoch", *columns], rows),
        "",
        "![learning curve](learning_curve.png)",
        "",
    ]
    if steps:
        every = _every(steps)
        lines.append(
            f"Training loss logged every {f'{every} steps' if every > 1 else 'step'}"
            f" ({len(steps)} points, in `steps.json`), with the learning rate."
        )
    return lines


def describe_trainable(record: dict) -> str:
    """`record`'s trained share of the weights, for reports.

    Example:
        >>> describe_trainable({"trainable_weights": 148_000, "weights": 22_700_000})
        'trainable: 148k of 22.7M weights (0.65%)'
    """

    def count(number: int) -> str:
        for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
            if number >= size:
                return f"{number / size:.3g}{suffix}"
        return str(number)

    trained, total = record["trainable_weights"], record["weights"]
    return f"trainable: {count(trained)} of {count(total)} weights ({100 * trained / total:.2g}%)"


def _every(steps: list[dict]) -> int:
    return steps[1]["step"] - steps[0]["step"] if len(steps) > 1 else 1


def write_task_report(
    task, examples: list, predictions: list[dict], directory, *, title: str, metrics: dict
) -> str | None:
    """The task's error analysis (`Task.report`) as `directory/report.md`; returns it."""
    directory = Path(directory)
    section = task.report(examples, predictions, directory)
    rows = [[name, value] for name, value in metrics.items() if isinstance(value, (int, float))]
    text = (
        "\n".join(
            [
                f"# {title}",
                "",
                f"{len(examples)} examples.",
                "",
                markdown_table(["metric", "value"], rows),
                "",
                section or "",
            ]
        )
        + "\n"
    )
    (directory / "report.md").write_text(text)
    return section
