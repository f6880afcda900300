"""The end-of-run report: a Markdown summary and a learning-curve plot."""

from __future__ import annotations

from pathlib import Path


def plot_learning_curve(history: list[dict], path) -> Path | None:
    """Training loss and validation metrics per epoch, as a PNG."""
    if not history:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [h["epoch"] for h in history]
    validation = sorted({k for h in history for k in h if k.startswith("val_")})
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(epochs, [h.get("loss") for h in history], marker="o", label="training loss")
    left.set_xlabel("epoch")
    left.set_title("loss")
    left.legend()
    for name in validation:
        right.plot(epochs, [h.get(name) for h in history], marker="o", label=name[4:])
    right.set_xlabel("epoch")
    right.set_title("validation")
    if validation:
        right.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return Path(path)


def write_report(path, *, recipe: dict, history: list[dict], final: dict, monitor: str,
                 seconds: float) -> None:
    """Writes report.md: setup, final metrics table, per-epoch table, the plot."""
    lines = [f"# bertkit run: {recipe['task']['name']}", "",
             f"- backbone: `{recipe['backbone']['preset']}`, sequence length "
             f"{recipe['backbone']['sequence_length']}",
             f"- training file: `{recipe['data']['train']}`",
             f"- epochs run: {len(history)}, wall time {seconds:.0f} s, best by `{monitor}`", "",
             "## Final metrics", "", "| split | metric | value |", "|---|---|---|"]
    for split, metrics in final.items():
        for name, value in metrics.items():
            if isinstance(value, (int, float)):
                lines.append(f"| {split} | {name} | {value:.4f} |")
    if history:
        columns = [k for k in history[-1] if k != "epoch"]
        lines += ["", "## Per epoch", "", "| epoch | " + " | ".join(columns) + " |",
                  "|---" * (len(columns) + 1) + "|"]
        for h in history:
            cells = [f"{h[c]:.4g}" if isinstance(h.get(c), float) else str(h.get(c, ""))
                     for c in columns]
            lines.append(f"| {h['epoch']} | " + " | ".join(cells) + " |")
        lines += ["", "![learning curve](learning_curve.png)"]
    Path(path).write_text("\n".join(lines) + "\n")
