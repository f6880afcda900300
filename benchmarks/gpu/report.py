"""The check's figures and its one table.

Sequences per second and MFU come from one FLOP formula for both contenders,
benchmarks/jax_train_throughput.py's `training_flops_per_sequence` (6 N_non-embedding +
12 L s d per token, forward and backward), against the JAX bf16 matmul ceiling measured in
the same run (torch's where JAX's is missing):

- steady-state steps: full-length synthetic rows, FLOPs of the padded shape;
- whole runs: the training rows' real token counts, each row attending to itself only
  (padding and packing cost nothing here), over the training steps' seconds: bertkit's
  `train_steps` phase (the steps after the first, which compiles), transformers' loop.
"""

from __future__ import annotations

ROWS = (
    ("matmul_jax", "matmul ceiling, JAX bf16"),
    ("matmul_torch", "matmul ceiling, torch bf16"),
    ("checkpoint", "random BERT checkpoint (HF format)"),
    ("hf_steps_0", "transformers steps, seq {0}"),
    ("hf_steps_1", "transformers steps, seq {1}"),
    ("bertkit_steps_0", "bertkit steps, seq {0}"),
    ("bertkit_steps_1", "bertkit steps, seq {1}"),
    ("finetune_sst2", "bertkit finetune --features, SST-2, 1 epoch"),
    ("finetune_sst2_warm", "the same SST-2 finetune again (compilation cache warm)"),
    ("hf_sst2", "transformers whole loop, SST-2, 1 epoch"),
    ("finetune_conll", "bertkit finetune --features, CoNLL-2003, 1 epoch"),
)


def derive(results: dict, shape: dict, flops_per_sequence) -> float | None:
    """Adds `sequences_per_second`, `tflops` and `mfu` to the records that train; returns
    the ceiling used. `flops_per_sequence(shape, length)` is None when unavailable."""
    peak = next(
        (
            results[key]["tflops"]
            for key in ("matmul_jax", "matmul_torch")
            if results.get(key, {}).get("status") == "ok"
        ),
        None,
    )
    for key, record in results.items():
        if record.get("status") != "ok":
            continue
        _add_startup(record)
        if "sequence_length" in record:  # steady-state steps
            flops = _flops(flops_per_sequence, shape, {str(record["sequence_length"]): 1})
            _add_rate(record, record["sequences_per_second"], flops, peak)
        elif "train_lengths" in record:  # a whole run
            seconds, share = _training_seconds(key, record)
            if seconds:
                flops = _flops(flops_per_sequence, shape, record["train_lengths"])
                _add_rate(
                    record,
                    share * record["train_rows"] / seconds,
                    flops and flops / record["train_rows"],
                    peak,
                )
    return peak


def _add_startup(record: dict) -> None:
    """A whole run's start-up: process launch until `finetune` was called (bertkit) or torch
    and transformers were imported (transformers)."""
    ready = record.get("finetune_called_at") or record.get("imported_at")
    if ready and "phases" in record:
        record["phases"] = {"start-up": ready - record["launched_at"], **record["phases"]}


def _training_seconds(key: str, record: dict) -> tuple[float | None, float]:
    """The seconds of the timed training steps and the share of the rows they trained."""
    phases = record.get("phases", {})
    if key.startswith("hf_"):
        return phases.get("train"), 1.0
    steps = record.get("steps")
    return phases.get("train_steps"), (1 - 1 / steps) if steps else 1.0


def _flops(flops_per_sequence, shape: dict, lengths: dict) -> float | None:
    if flops_per_sequence is None:
        return None
    return sum(count * flops_per_sequence(shape, int(length)) for length, count in lengths.items())


def _add_rate(
    record: dict, sequences_per_second: float, flops: float | None, peak: float | None
) -> None:
    record["sequences_per_second"] = sequences_per_second
    if flops:
        record["tflops"] = sequences_per_second * flops / 1e12
        if peak:
            record["mfu"] = record["tflops"] / peak


def table(results: dict, sequence_lengths, header: list[str]) -> str:
    """The markdown table, with the header lines above it and the ratios below."""
    lines = [
        *header,
        "",
        "| stage | status | seq/s | MFU | wall s | details |",
        "|---|---|---|---|---|---|",
    ]
    for key, label in ROWS:
        record = results.get(key, {"status": "not run"})
        status = record["status"]
        rate = record.get("sequences_per_second")
        mfu = record.get("mfu")
        wall = record.get("wall_seconds")
        lines.append(
            f"| {label.format(*sequence_lengths)} | {_cell(status)} | "
            f"{f'{rate:,.1f}' if rate else '-'} | "
            f"{f'{100 * mfu:.1f}%' if mfu else '-'} | "
            f"{f'{wall:.1f}' if wall is not None else '-'} | "
            f"{_cell(details(key, record))} |"
        )
    return "\n".join(lines + [""] + ratios(results, sequence_lengths))


def details(key: str, record: dict) -> str:
    """A row's figures beyond the columns: the ceiling, phases, compilation, the score."""
    if record.get("status") != "ok":
        return ""
    if key.startswith("matmul"):
        return f"{record['tflops']:.3g} TFLOP/s ({record['size']}^3), {record.get('device', '?')}"
    if key == "checkpoint":
        return f"written with {record['writer']}, vocabulary {record['vocabulary_size']}"
    if "sequence_length" in record:
        return (
            f"{record['step_ms']:.1f} ms/step, batch {record['batch_size']}, "
            f"{record['steps']} steps after warm-up "
            f"({record['build_and_warmup_seconds']:.1f} s build + warm-up)"
        )
    parts = [
        f"{name} {seconds:.1f}"
        for name, seconds in record.get("phases", {}).items()
        if name != "total" and seconds >= 0.05
    ]
    if record.get("compilation"):
        compiled = record["compilation"]
        parts.append(
            f"compiled {compiled.get('programs')} programs in "
            f"{compiled.get('seconds', 0):.1f} s ({compiled.get('from_cache')} cached)"
        )
        ahead = compiled.get("precompiled")
        if isinstance(ahead, dict):
            parts.append(
                f"{ahead.get('programs')} of them before the first step in "
                f"{ahead.get('seconds', 0):.1f} s"
            )
        late = compiled.get("after_first_step")
        if isinstance(late, dict):
            parts.append(
                f"after it {late.get('compiled')} compiled in {late.get('seconds', 0):.1f} s "
                f"(longest {late.get('longest', {}).get('function')}), "
                f"{late.get('from_cache')} read back"
            )
    score = record.get("validation") or (
        {"accuracy": record["accuracy"]} if "accuracy" in record else None
    )
    if score:
        parts.append(
            "dev " + ", ".join(f"{k} {v:.4f}" for k, v in score.items() if isinstance(v, float))
        )
    elif key.startswith("finetune"):
        parts.append("no validation (decodes with TensorFlow)")
    return f"{record.get('train_rows', '?')} rows, {record.get('steps', '?')} steps; " + ", ".join(
        parts
    )


def ratios(results: dict, sequence_lengths) -> list[str]:
    lines = []
    for index, length in enumerate(sequence_lengths):
        ours, theirs = (
            results.get(f"{who}_steps_{index}", {}).get("sequences_per_second")
            for who in ("bertkit", "hf")
        )
        if ours and theirs:
            lines.append(
                f"- steady-state steps, seq {length}: bertkit / transformers = {ours / theirs:.2f}x"
            )
    theirs = results.get("hf_sst2", {})
    for key, which in (
        ("finetune_sst2", "cold cache"),
        ("finetune_sst2_warm", "warm cache"),
    ):
        ours = results.get(key, {})
        if ours.get("status") == theirs.get("status") == "ok":
            lines.append(
                f"- whole SST-2 epoch ({which}): bertkit {ours['wall_seconds']:.1f} s, "
                f"transformers {theirs['wall_seconds']:.1f} s (transformers / bertkit = "
                f"{theirs['wall_seconds'] / ours['wall_seconds']:.2f}x)"
            )
    return lines


def _cell(text: str) -> str:
    return str(text).replace("|", "/").replace("\n", " ")
