"""int8 export behind a quality gate: `bertkit export RUN --quantize int8`, a recipe's
`export.quantize: int8`, `model.export(folder, quantize="int8")`.

Keras quantizes the model (`Model.quantize("int8")`): every `Dense`, `EinsumDense` and
`Embedding` layer, which in a BERT task model is every matmul of the encoder, the token
and segment embeddings, the pooler and the head, keeps an int8 kernel with one float
scale per output channel and quantizes its input per call (abs-max); the position
embeddings and the LayerNorms stay float. A LoRA run is quantized after its adapters
are merged (`FineTunedModel` holds the merged model).

The quantized model is scored on the run's validation data by the task's own evaluation,
as `bertkit evaluate` scores it. If the task's `monitor` is worse than the float model's
by more than the budget (`Task.int8_max_drop` points, or `max_metric_drop`), the export
is refused: a `UserError` with both figures, and nothing is written. Otherwise the int8
raw-text SavedModel is written and verified like every export, and `quantization` in its
`assets/bertkit.json` (and `int8_export.json` in the run, when it may be written) records
size on disk, the metric before and after and the CPU latency of both SavedModels.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import sys
import time
import uuid
from pathlib import Path

from bertkit.errors import UserError
from bertkit.files import MAX_INPUT_CHARACTERS, MAX_REQUEST_CHARACTERS
from bertkit.run_dir import write_json
from bertkit.serving.staging import replace_folder, write_error_reason

QUANTIZATIONS = ("int8",)
RECORD_FILE = "int8_export.json"  # in the run directory, beside report.md
LATENCY_REQUESTS = 200
# One request of one sentence (each input of a pair task gets it): 15 words, 17 word pieces.
LATENCY_SENTENCE = "The film was surprisingly good , said Anna Smith after the show in Paris ."


def quality_budget(task, max_metric_drop: float | None = None) -> float:
    """The points of `task.monitor` an int8 model may lose: `max_metric_drop`, else the
    task's `int8_max_drop`; a task that declares none (MLM) offers no int8 export."""
    if task.int8_max_drop is None:
        raise UserError(
            f"the {task.name} task offers no int8 export (it declares no int8_max_drop, "
            "the metric an int8 model may lose); export it as float"
        )
    budget = task.int8_max_drop if max_metric_drop is None else max_metric_drop
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget >= 0:
        raise UserError(f"expected a number of points of at least 0, got {budget!r}")
    return float(budget)


def metric_drop(task, before: float, after: float) -> float:
    """How many points of `task.monitor` the int8 model lost (negative: it gained)."""
    lost = before - after if task.mode == "max" else after - before
    return lost * task.monitor_points


def check_quality(task, before: float, after: float, budget: float) -> None:
    """Refuses, in one line naming both figures, an int8 model more than `budget` points
    worse than the float model (or whose metric is not a number)."""
    drop = metric_drop(task, before, after)
    if math.isfinite(drop) and drop <= budget:
        return
    raise UserError(
        f"int8 export refused: validation {task.monitor} {_points(task, before)} (float) -> "
        f"{_points(task, after)} (int8), {points_changed(drop)}, over the budget of "
        f"{budget:g} (--max-drop, recipe export.max_metric_drop); nothing written"
    )


def points_changed(drop: float) -> str:
    """A `metric_drop` in words: a drop is points lost, a negative drop points gained.

    Example:
        >>> points_changed(0.4), points_changed(-2.5), points_changed(-0.001)
        ('0.40 points lost', '+2.50 points gained', '0.00 points lost')
    """
    if round(drop, 2) < 0:
        return f"+{-drop:.2f} points gained"
    return f"{max(drop, 0.0):.2f} points lost"  # -0.001 is no gain; NaN stays NaN


def gate_line(task, saved_model_dir) -> str:
    """One line on an int8 SavedModel the gate passed: the validation metric of the float
    and the int8 model, the points lost or gained, the budget and the folder, as
    `bertkit finetune` prints it."""
    record = _read_record(saved_model_dir)
    monitor = record["monitor"]
    before, after = record["float"][monitor], record["int8"][monitor]
    return (
        f"int8 export passed the gate: validation {monitor} {_points(task, before)} (float) "
        f"-> {_points(task, after)} (int8), {points_changed(record['drop_points'])}, within "
        f"the budget of {record['budget_points']:g}; wrote {saved_model_dir}"
    )


def _read_record(saved_model_dir) -> dict:
    metadata = json.loads((Path(saved_model_dir) / "assets" / "bertkit.json").read_text())
    return metadata["quantization"]


def _points(task, value: float) -> str:
    return f"{value * task.monitor_points:.2f}" if task.monitor_points != 1 else f"{value:.2f}"


def quantized(finetuned, quantize: str = "int8"):
    """A second `FineTunedModel` of `finetuned`'s run, its model quantized (Keras)."""
    import warnings

    model = type(finetuned).load(finetuned.run.path)  # FineTunedModel, which imports this
    with warnings.catch_warnings(), _one_garbage_collection():
        warnings.simplefilter("ignore", UserWarning)  # "Layer Add has no `quantize` method"
        model.model.quantize(quantize)
    return model


@contextlib.contextmanager
def _one_garbage_collection():
    """Keras' `Layer.__delattr__` runs `gc.collect()` for each float kernel it replaces:
    with TensorFlow loaded, about 1 s each, 11 of the 12 s quantizing a one-layer model
    took. Here they are one collection, at the end."""
    import gc

    collect = gc.collect
    gc.collect = lambda generation=2: 0
    try:
        yield
    finally:
        gc.collect = collect
        gc.collect()


def export_quantized(
    finetuned,
    directory,
    quantize: str = "int8",
    *,
    max_metric_drop: float | None = None,
    max_input_characters: int = MAX_INPUT_CHARACTERS,
    max_request_characters: int = MAX_REQUEST_CHARACTERS,
) -> Path:
    """Quantizes `finetuned` (a `FineTunedModel`), scores it against the float model on
    the run's validation data and, within the budget (`quality_budget`), writes its
    SavedModel to `directory` with the record `quantization`; else a `UserError` and
    nothing written. Returns `directory`."""
    from bertkit.serving.export import checked_export_folder

    if quantize not in QUANTIZATIONS:
        raise UserError(f"unknown quantization {quantize!r}; available: int8", key="quantize")
    budget = quality_budget(finetuned.task, max_metric_drop)
    directory = checked_export_folder(directory)
    limits = {
        "max_input_characters": max_input_characters,
        "max_request_characters": max_request_characters,
    }
    with _staging(directory) as staging:  # first: a folder it cannot write fails at once
        before, after, int8 = _gate(finetuned, quantize, budget)
        int8.export(staging / "int8", **limits)
        with _float_saved_model(finetuned, staging / "float", limits) as float_dir:
            record = _record(finetuned.task, quantize, budget, (before, after), float_dir)
        record["int8"].update(_measured(staging / "int8"))
        _add_to_assets(staging / "int8", {"quantization": record})
        replace_folder(staging / "int8", directory)
    _write_run_record(finetuned.run, {**record, "saved_model": str(directory)})
    return directory


def _gate(finetuned, quantize: str, budget: float) -> tuple:
    """The validation metric of the float and the quantized model, and the quantized
    `FineTunedModel`, once it is within `budget` (`check_quality`)."""
    monitor = finetuned.task.monitor
    before = finetuned.evaluate()[monitor]
    int8 = quantized(finetuned, quantize)
    after = int8.evaluate()[monitor]
    check_quality(finetuned.task, before, after, budget)
    return before, after, int8


def _record(task, quantize: str, budget: float, metrics: tuple, float_dir: Path) -> dict:
    before, after = metrics
    return {
        "quantization": quantize,
        "monitor": task.monitor,
        "budget_points": budget,
        "drop_points": round(metric_drop(task, before, after), 4),
        "float": {task.monitor: before, **_measured(float_dir)},
        "int8": {task.monitor: after},
        "latency_requests": LATENCY_REQUESTS,
    }


def _measured(saved_model_dir: Path) -> dict:
    return {
        "size_bytes": folder_size(saved_model_dir),
        "latency_p50_ms": latency_p50_ms(saved_model_dir),
    }


@contextlib.contextmanager
def _staging(directory: Path):
    """A new hidden folder beside `directory` (same file system: the finished SavedModel
    is renamed into place), removed with what is left in it when the block ends. What
    fails to be written in it is a `UserError` naming `directory`, not the folder."""
    staging = directory.with_name(f".{directory.name}.{uuid.uuid4().hex[:8]}.partial")
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
        yield staging
    except OSError as error:
        reason = write_error_reason(error, staging)
        raise UserError(f"cannot write the SavedModel: {reason}", source=directory) from None
    except UserError as error:  # an export inside it: say where the user asked for it
        if not (error.source or "").startswith(str(staging)):
            raise
        raise UserError(error.message, source=directory, key=error.key) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _float_saved_model(finetuned, fresh: Path, limits: dict):
    """The float SavedModel to measure: the run's `saved_model/`, else one exported to
    `fresh` for the measurement."""
    written = finetuned.run.saved_model_dir
    if (written / "saved_model.pb").is_file():
        yield written
        return
    # a model of its own, whose tokenizer no other export has traced
    yield type(finetuned).load(finetuned.run.path).export(fresh, **limits)


def folder_size(path) -> int:
    """Bytes of the files under `path`, as `du --apparent-size` counts them."""
    return sum(file.stat().st_size for file in Path(path).rglob("*") if file.is_file())


def latency_p50_ms(saved_model_dir, requests: int = LATENCY_REQUESTS) -> float:
    """Median milliseconds of `requests` one-sentence requests to the SavedModel's
    `serving_default`, one after another on this process's CPU threads, after 5 unmeasured
    requests."""
    import numpy as np
    import tensorflow as tf

    serve = tf.saved_model.load(str(saved_model_dir)).signatures["serving_default"]
    request = {
        name: tf.constant([LATENCY_SENTENCE]) for name in serve.structured_input_signature[1]
    }
    seconds = []
    for _ in range(requests + 5):
        start = time.perf_counter()
        serve(**request)
        seconds.append(time.perf_counter() - start)
    return round(float(np.median(seconds[5:])) * 1000, 3)


def _add_to_assets(saved_model_dir: Path, values: dict) -> None:
    path = saved_model_dir / "assets" / "bertkit.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}, indent=2))


def _write_run_record(run, record: dict) -> None:
    """`int8_export.json` in the run; a run this user may not write keeps none (a warning:
    the SavedModel holds the record too)."""
    try:
        write_json(run.path / RECORD_FILE, record)
    except OSError as error:
        print(
            f"bertkit: warning: {RECORD_FILE} not written in {run.path}: {error.strerror}",
            file=sys.stderr,
        )


def describe(saved_model_dir) -> str:
    """The record of an int8 SavedModel in a few lines, as `bertkit export --quantize int8`
    prints it."""
    record = _read_record(saved_model_dir)
    monitor = record["monitor"]
    lines = [f"{'':6} {monitor:>10} {'size (MB)':>10} {'p50 (ms)':>9}"]
    for name in ("float", "int8"):
        values = record[name]
        lines.append(
            f"{name:6} {values[monitor]:>10.4f} {values['size_bytes'] / 1e6:>10.1f} "
            f"{values['latency_p50_ms']:>9.2f}"
        )
    lines.append(
        f"{points_changed(record['drop_points'])}, within the budget of "
        f"{record['budget_points']:g}: passed"
    )
    return "\n".join(lines)
