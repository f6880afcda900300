"""The reading matter of a seeds run (`bertkit.training.seeds`): report.md with each seed's
metrics and their mean ± sd, learning_curve.png with one curve per seed, and the model
card (the kept seed's, with a `## Seeds` section)."""

from __future__ import annotations

from pathlib import Path

from bertkit.report import markdown_table, pyplot
from bertkit.run_dir import read_json


def write_seeds_report(directory, recipe, metrics: dict) -> None:
    """report.md, learning_curve.png and README.md of the seeds run in `directory`."""
    directory = Path(directory)
    runs = {entry["seed"]: directory / entry["run"] for entry in metrics["seeds"]}
    histories = {seed: read_json(run / "metrics.json")["epochs"] for seed, run in runs.items()}
    plot_seed_curves(
        histories, directory / "learning_curve.png", metrics["monitor"], metrics["kept_seed"]
    )
    (directory / "report.md").write_text(report_text(recipe, metrics))
    card = runs[metrics["kept_seed"]] / "README.md"
    if card.exists():
        (directory / "README.md").write_text(
            model_card(card.read_text(), directory.name, recipe.task, metrics)
        )


def report_text(recipe, metrics: dict) -> str:
    seeds, kept = metrics["seeds"], metrics["kept_seed"]
    lines = [
        f"# bertkit run: {recipe.task}, {len(seeds)} seeds",
        "",
        f"- backbone: `{recipe.backbone.preset}`, sequence length "
        f"{recipe.backbone.sequence_length}",
        f"- training file: `{recipe.data.train}`",
        f"- seeds {seeds[0]['seed']} to {seeds[-1]['seed']}, each an ordinary run in "
        "`seeds/seed-<seed>/` (with its own report.md)",
        f"- kept model (`model/`, `saved_model/`): seed {kept}, {_kept_how(metrics)}",
        "",
        f"## Mean ± sd over {len(seeds)} seeds",
        "",
        seeds_table(metrics),
        "",
        "sd: the sample standard deviation (n - 1).",
        "",
    ]
    if metrics["failed_seeds"]:
        lines += ["## Failed seeds", "", *(f"- {line}" for line in metrics["failed_seeds"]), ""]
    lines += ["## Learning curves", "", "![one curve per seed](learning_curve.png)", ""]
    return "\n".join(lines)


def _kept_how(metrics: dict) -> str:
    if metrics["monitor"] == "loss":
        return "the first (no validation split to choose by)"
    return f"the {metrics['keep_seed']} by `{metrics['monitor']}`"


def seeds_table(metrics: dict) -> str:
    """A row per seed (kept and failed ones marked), then the mean ± sd of each column."""
    columns = [(split, name) for split, values in metrics["mean"].items() for name in values]
    rows = []
    for entry in metrics["seeds"]:
        mark = (" (kept)" if entry["seed"] == metrics["kept_seed"] else "") + (
            " (failed)" if entry.get("failed") else ""
        )
        rows.append(
            [f"{entry['seed']}{mark}", *(float(entry[split][name]) for split, name in columns)]
        )
    rows.append(["mean ± sd", *(mean_sd(metrics, split, name) for split, name in columns)])
    return markdown_table(["seed", *(f"{split} {name}" for split, name in columns)], rows)


def mean_sd(metrics: dict, split: str, name: str) -> str:
    """`0.8123 ± 0.0100` (the mean alone while there is one seed)."""
    sd = metrics["sd"][split][name]
    return f"{metrics['mean'][split][name]:.4f}" + ("" if sd is None else f" ± {sd:.4f}")


def summary_line(metrics: dict, monitor: str) -> str:
    """The line `finetune` prints at the end of a seeds run."""
    seeds, split = metrics["seeds"], "validation" if "validation" in metrics["mean"] else None
    if split is None or monitor not in metrics["mean"][split]:
        return f"{len(seeds)} seeds; kept seed {metrics['kept_seed']}{_failed(metrics)}"
    each = ", ".join(f"{e['seed']}: {e[split][monitor]:.4f}" for e in seeds[:10])
    return (
        f"{len(seeds)} seeds: {split} {monitor} {mean_sd(metrics, split, monitor)} "
        f"({each}{', ...' if len(seeds) > 10 else ''}); kept seed {metrics['kept_seed']} "
        f"({metrics['keep_seed']}){_failed(metrics)}"
    )


def _failed(metrics: dict) -> str:
    failed = [str(e["seed"]) for e in metrics["seeds"] if e.get("failed")]
    return f"; did not learn: seed {', '.join(failed)} (report.md)" if failed else ""


def model_card(kept_card: str, name: str, task: str, metrics: dict) -> str:
    """The kept seed's model card, titled as the run, with a `## Seeds` section."""
    seeds = metrics["seeds"]
    rows = [
        [split, metric, mean_sd(metrics, split, metric)]
        for split, values in metrics["mean"].items()
        for metric in values
    ]
    section = "\n".join(
        [
            "## Seeds",
            "",
            f"Trained with {len(seeds)} seeds of the same recipe ({seeds[0]['seed']} to "
            f"{seeds[-1]['seed']}); this model is seed {metrics['kept_seed']}, "
            f"{_kept_how(metrics)}. Mean ± sd (sample) over the seeds; each seed's metrics "
            "are in `metrics.json` and `report.md`:",
            "",
            markdown_table(["split", "metric", "mean ± sd"], rows),
            "",
            *(f"- {line}" for line in metrics["failed_seeds"]),
            "",
            "",
        ]
    )
    body = kept_card.split("\n", 1)[1] if "\n" in kept_card else ""
    how = "first" if metrics["monitor"] == "loss" else metrics["keep_seed"]
    title = (
        f"# {name}: a bertkit {task} model (seed {metrics['kept_seed']}, {how} of "
        f"{len(seeds)} seeds)"
    )
    if "## Intended use" in body:
        body = body.replace("## Intended use", section + "## Intended use", 1)
    else:
        body += "\n" + section
    return f"{title}\n{body}"


def plot_seed_curves(histories: dict, path, monitor: str, kept: int) -> None:
    """Left: training loss per epoch; right: the validation monitor per epoch; a line per
    seed, the kept one thicker."""
    plt = pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for seed, history in histories.items():
        width = 2.5 if seed == kept else 1.0
        epochs = [h["epoch"] for h in history]
        left.plot(
            epochs,
            [h.get("loss") for h in history],
            marker="o",
            linewidth=width,
            label=f"seed {seed}",
        )
        scored = [h for h in history if monitor in h]
        right.plot(
            [h["epoch"] for h in scored],
            [h[monitor] for h in scored],
            marker="o",
            linewidth=width,
            label=f"seed {seed}{' (kept)' if seed == kept else ''}",
        )
    left.set(xlabel="epoch", ylabel="loss", title="training loss (epoch mean)")
    right.set(xlabel="epoch", title=f"validation {monitor.removeprefix('val_')}")
    for axes in (left, right):
        axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
