"""TensorFlow SavedModel export: raw strings in, decoded predictions out.

Tokenization (tf-text), the model and the task's decoding all run in the graph, so the
SavedModel needs only `tensorflow` and `tensorflow_text` to serve: no bertkit, Keras or
keras-hub. Labels and tokenizer settings travel inside it (graph constants, assets/bertkit.json).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from bertkit.errors import UserError
from bertkit.files import MAX_INPUT_CHARACTERS, MAX_REQUEST_CHARACTERS
from bertkit.serving.staging import new_export_folder, staging_folder


def export_saved_model(
    task,
    model,
    directory,
    metadata: dict,
    *,
    max_input_characters: int = MAX_INPUT_CHARACTERS,
    max_request_characters: int = MAX_REQUEST_CHARACTERS,
) -> Path:
    """Writes `directory` with a `serving_default` signature of `task.serve`, then loads
    it back and checks its answers (`verify_saved_model`).

    The signature refuses, before tokenizing, an input (a row's texts together) of more
    than `max_input_characters` characters or a request of more than
    `max_request_characters`: an `InvalidArgumentError` naming the limit. Both are
    recorded in `assets/bertkit.json` (`input_limits`).

    The SavedModel is written into a new folder beside `directory` and renamed to it
    once complete: a folder that cannot be written, or a full disk, is a `UserError`
    naming `directory`, and leaves nothing behind.
    """
    directory = checked_export_folder(directory)
    limits = _checked_limits(max_input_characters, max_request_characters)
    import tensorflow as tf

    with staging_folder(directory, "the SavedModel", (tf.errors.OpError,), _reason) as staging:
        _write_saved_model(task, model, staging, {**metadata, "input_limits": limits})
    return directory


def checked_export_folder(directory) -> Path:
    """`new_export_folder(directory)`, once the backend is TensorFlow (else a UserError)."""
    import keras

    if keras.backend.backend() != "tensorflow":
        raise UserError(
            "SavedModel export needs the TensorFlow backend "
            "(unset KERAS_BACKEND or set it to 'tensorflow')"
        )
    return new_export_folder(directory)


def _checked_limits(max_input_characters, max_request_characters) -> dict:
    """The input limits as `assets/bertkit.json` records them, each a whole number of at
    least 1 (a `UserError` naming the key otherwise)."""
    limits = {
        "max_input_characters": max_input_characters,
        "max_request_characters": max_request_characters,
    }
    for key, value in limits.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"expected a whole number of at least 1, got {value!r}", key=key)
    return limits


def check_finite_weights(model, source) -> None:
    """Refuses a model with a NaN or infinite weight (a diverged run): its SavedModel
    would answer NaN. `source` names the weights file the model was loaded from."""
    import keras
    import numpy as np

    for variable in model.weights:
        if not np.isfinite(keras.ops.convert_to_numpy(variable.value)).all():
            raise UserError(
                f"the run's weights are not finite (NaN or infinity in "
                f"'{variable.path}'): training diverged, so there is no model to "
                "export; train again with a lower learning rate",
                source=source,
            )


def _reason(error) -> str:
    """`No space left on device` from TensorFlow's `path; reason` (or eager's
    `reason [Op:SaveV2]`)."""
    reason = (error.message or type(error).__name__).splitlines()[0].rpartition("; ")[2]
    return re.sub(r"\s*\[Op:\w+\]$", "", reason)


def _write_saved_model(task, model, directory: Path, metadata: dict) -> None:
    import tensorflow as tf

    specs = task.serving_inputs()  # name -> tf.TensorSpec(name=name): the signature's keys
    serve = tf.function(
        checked_serve(task, model, list(specs), **metadata["input_limits"]), autograph=False
    )
    signature = serve.get_concrete_function(*(_any_shape(spec) for spec in specs.values()))
    # `tf.saved_model.save` of a module holding only the weights and tokenizer resources
    # `serve` reads: Keras' `ExportArchive` would also save `serve` as a restorable function
    # (traced again, its graphs searched for resources): 1-2 s of a 4 s export.
    exported = tf.Module()
    exported.weights = [variable.value for variable in model.variables]
    exported.tokenizer = task.tokenizer.fast_tokenizer
    exported.normalizer = task.tokenizer.normalizer
    probes = probes_within(**metadata["input_limits"], inputs=len(specs))
    expected = answers(signature, list(specs), probes)  # before saving: it rewrites captures
    tf.saved_model.save(exported, str(directory), signatures={"serving_default": signature})
    verify_saved_model(directory, expected, probes)
    assets = directory / "assets"
    assets.mkdir(exist_ok=True)
    (assets / "bertkit.json").write_text(json.dumps(metadata, indent=2))


# Every built-in task takes these (span QA as question and context, MLM needs a [MASK]).
_PROBES = [
    "[MASK]",
    "The film was [MASK] good , said Anna Smith in Paris .",
    "Who wrote it ? [MASK] wrote it in 1990 .",
]


def probes_within(max_input_characters: int, max_request_characters: int, inputs: int) -> list[str]:
    """The probe texts, in order, that a SavedModel with these limits answers when each of
    its `inputs` inputs is given them (all of them but for tiny limits)."""
    probes, total = [], 0
    for text in _PROBES:
        characters = len(text) * inputs
        if characters <= max_input_characters and total + characters <= max_request_characters:
            probes.append(text)
            total += characters
    return probes


def answers(serve, names: list, probes: list = _PROBES) -> dict:
    """`serve`'s outputs for the probe texts (every input given the same texts)."""
    import numpy as np
    import tensorflow as tf

    texts = tf.constant(probes, tf.string)
    return {key: np.asarray(value) for key, value in serve(*[texts for _ in names]).items()}


def verify_saved_model(directory, expected: dict, probes: list = _PROBES) -> None:
    """Loads the written SavedModel and checks that it answers the probe texts as
    `expected` (`answers` of the traced function it was written from): a file that does
    not load, or lost a weight or a tokenizer resource on the way, fails the export, not
    a server."""
    import concurrent.futures

    import numpy as np
    import tensorflow as tf

    def serve_probes() -> dict:
        loaded = tf.saved_model.load(str(directory)).signatures["serving_default"]
        names = list(loaded.structured_input_signature[1])
        return loaded(**{name: tf.constant(probes, tf.string) for name in names})

    # In a thread of its own, as a server loads it: outside the distribution strategy a
    # data-parallel run exports in (strategy scopes are per thread), which would load the
    # weights as mirrored variables its graph cannot read.
    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        got = thread.submit(serve_probes).result()
    for key, want in expected.items():
        have = np.asarray(got[key])
        same = want.shape == have.shape and (
            np.allclose(want, have, atol=1e-5)
            if want.dtype.kind in "fc"
            else np.array_equal(want, have)
        )
        if not same:
            raise RuntimeError(
                f"the SavedModel in {directory} answers differently from "
                f"the model it was exported from (output '{key}')"
            )


def tensorflow_available() -> bool:
    """TensorFlow and tf-text can be imported (checked without importing them)."""
    return all(
        importlib.util.find_spec(name) is not None for name in ("tensorflow", "tensorflow_text")
    )


def export_in_tensorflow_process(run_dir, directory) -> Path:
    """Exports a run's saved weights from a child process on the TensorFlow backend.

    A run trained on JAX has no TensorFlow model to trace; `bertkit export`
    rebuilds the model on TensorFlow from `model/` (architecture, weights,
    task.json), exactly as it does for any finished run.
    """
    environment = {**os.environ, "KERAS_BACKEND": "tensorflow"}
    result = subprocess.run(
        [sys.executable, "-m", "bertkit.cli", "export", str(run_dir), "--out", str(directory)],
        env=environment,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no message"])[-1]
        last = last.removeprefix("bertkit: error: ")  # printed once, by this process
        raise UserError(f"SavedModel export in a TensorFlow process failed: {last}", source=run_dir)
    return Path(directory)


def _checked_batches(names: list, tensors) -> tuple[list, object]:
    """`tensors` (graph inputs, one per name), each checked to be a 1-D batch of strings
    and to have as many rows as the first (an `InvalidArgumentError` naming the input
    otherwise), and that number of rows."""
    import tensorflow as tf

    checked = []
    for name, tensor in zip(names, tensors, strict=True):
        is_batch = tf.debugging.Assert(
            tf.equal(tf.rank(tensor), 1),
            [
                f"input {name} must be a 1-D batch of strings (shape [batch]), got shape",
                tf.shape(tensor),
            ],
        )
        with tf.control_dependencies([is_batch]):
            # A reshape, not EnsureShape: that would fail first, with its own message.
            checked.append(tf.ensure_shape(tf.reshape(tensor, [-1]), [None]))
    size = tf.shape(checked[0])[0]
    for name, tensor in zip(names[1:], checked[1:], strict=True):
        tf.debugging.assert_equal(
            tf.shape(tensor)[0],
            size,
            message=(f"input {name} must have as many rows as input {names[0]}"),
        )
    return checked, size


# A batch of one placeholder input stands in for an empty batch, whose outputs are then
# cut to 0 rows: the tasks' graphs need not handle empty batches, and every output
# keeps its dtype and inner dimensions. "[MASK]" is a valid input of every built-in task.
_FILLER = "[MASK]"


def checked_serve(
    task,
    model,
    names: list,
    *,
    max_input_characters: int = MAX_INPUT_CHARACTERS,
    max_request_characters: int = MAX_REQUEST_CHARACTERS,
):
    """`task.serve` behind the checks a server needs for every task: each input is a
    1-D batch of strings (a scalar or a 2-D input is an `InvalidArgumentError` naming
    it, never a crash), the inputs have one batch size, the texts are within the limits
    (`within_limits`), and an empty batch gives empty outputs."""
    import tensorflow as tf

    def serve(*tensors):
        checked, size = _checked_batches(names, tensors)
        checked = within_limits(checked, max_input_characters, max_request_characters)
        inputs = {
            name: tf.cond(size > 0, lambda t=tensor: t, lambda: tf.constant([_FILLER]))
            for name, tensor in zip(names, checked, strict=True)
        }
        outputs = task.serve(model, inputs)
        return {key: value[:size] for key, value in outputs.items()}

    return serve


def within_limits(tensors: list, max_input_characters: int, max_request_characters: int):
    """`tensors` (1-D string batches of one size, a request's inputs), to be read only after
    checking their length: a row's texts together at most `max_input_characters`
    characters, all rows at most `max_request_characters`. A longer request fails at once
    with an `InvalidArgumentError` naming the limit, before tokenization spends minutes on
    it (a 600,000-character text took the tagging model 115 s of CPU)."""
    import tensorflow as tf

    # (batch,) characters (Unicode code points, as Python counts them) of each row; int64:
    # a request's total may exceed 2^31
    lengths = tf.add_n(
        [tf.cast(tf.strings.length(t, unit="UTF8_CHAR"), tf.int64) for t in tensors],
        name="characters_per_input",
    )
    total = tf.reduce_sum(lengths, name="characters_per_request")
    checks = [
        tf.debugging.assert_less_equal(
            lengths,
            tf.constant(max_input_characters, tf.int64),
            (
                f"an input (the texts of one row together) is longer than {max_input_characters:,} "
                "characters, the limit per input of this SavedModel (bertkit export "
                "--max-input-characters)"
            ),
        ),
        tf.debugging.assert_less_equal(
            total,
            tf.constant(max_request_characters, tf.int64),
            (
                f"the request is longer than {max_request_characters:,} characters (all its "
                "texts together), the limit per request of this SavedModel (bertkit export "
                "--max-request-characters); send fewer texts per request"
            ),
        ),
    ]
    with tf.control_dependencies(checks):
        return [tf.identity(t) for t in tensors]


def _any_shape(spec):
    """The signature accepts any shape, so that `checked_serve`'s rank check runs in the
    graph: with shape [None], TensorFlow does not check a caller's shape at run time and a
    scalar crashed the process."""
    import tensorflow as tf

    return tf.TensorSpec(None, spec.dtype, name=spec.name)
