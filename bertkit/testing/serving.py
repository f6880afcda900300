"""SavedModels called as a server calls them: in a fresh Python that imports only
TensorFlow and tf-text, with good requests and with badly shaped ones."""

from __future__ import annotations

import json

_FRESH_PROCESS_SCRIPT = """
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the tf-text ops the graph uses)
def plain(value):
    value = value.numpy()
    return value.astype(str).tolist() if value.dtype.kind in "SO" else value.tolist()
replies = []
for directory, inputs in json.loads(sys.stdin.read()):
    serve = tf.saved_model.load(directory).signatures["serving_default"]
    outputs = serve(**{name: tf.constant(values) for name, values in inputs.items()})
    replies.append({k: plain(v) for k, v in outputs.items()})
loaded = sorted(m for m in ("keras_hub", "keras_nlp", "bertkit") if m in sys.modules)
print(json.dumps({"outputs": replies, "imported": loaded}))
"""

_BAD_REQUESTS_SCRIPT = """
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401
serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
names, example = json.loads(sys.argv[2]), json.loads(sys.argv[3])
report = {}
for case, value in (("scalar", example), ("matrix", [[example, example]]), ("empty", [])):
    try:
        tensors = {name: tf.constant(value, dtype=tf.string) for name in names}
        outputs = serve(**tensors)
        report[case] = {key: [str(v.dtype.name), v.shape.as_list()] for key, v in outputs.items()}
    except tf.errors.InvalidArgumentError as error:
        report[case] = "InvalidArgumentError: " + error.message[:3000]
one = serve(**{name: tf.constant([example]) for name in names})
report["one"] = {key: [str(v.dtype.name), v.shape.as_list()] for key, v in one.items()}
print(json.dumps(report))
"""


def serve_in_fresh_process(saved_model_dir, inputs: dict) -> dict:
    """Runs a SavedModel's `serving_default` in a new Python that imports only TensorFlow
    and tf-text; returns its outputs as lists (strings decoded).

    Raises AssertionError if keras-hub or bertkit got imported there. (Keras itself
    is always imported: `tensorflow_text` builds Keras layers at import time.)
    """
    return serve_each_in_fresh_process([(saved_model_dir, inputs)])[0]


def serve_each_in_fresh_process(requests: list) -> list[dict]:
    """`serve_in_fresh_process` for several (SavedModel folder, inputs) pairs, all in one
    new Python (one TensorFlow start-up): the outputs of each, in order."""
    requests = [[str(directory), inputs] for directory, inputs in requests]
    result = _run_fresh_python(_FRESH_PROCESS_SCRIPT, stdin=json.dumps(requests))
    if result.returncode != 0:
        raise AssertionError(f"serving failed:\n{result.stderr[-3000:]}")
    reply = json.loads(result.stdout.strip().splitlines()[-1])
    assert reply["imported"] == [], f"the SavedModel needed {reply['imported']}"
    return reply["outputs"]


def serve_bad_requests(saved_model_dir, names: list[str], example: str = "[MASK] is here") -> dict:
    """Calls a SavedModel in a fresh process with a scalar, a 2-D input and an empty batch
    (`example` in each of the inputs `names`), and one good row; returns for each case the
    outputs' {name: [dtype, shape]}, or the InvalidArgumentError's message."""
    result = _run_fresh_python(
        _BAD_REQUESTS_SCRIPT, str(saved_model_dir), json.dumps(names), json.dumps(example)
    )
    if result.returncode != 0:
        raise AssertionError(f"serving crashed ({result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def assert_serving_refuses_bad_shapes(saved_model_dir, names: list[str], **kwargs) -> None:
    """A scalar or 2-D input is an error naming the input; an empty batch gives empty
    outputs of the dtypes and inner shapes of a one-row batch."""
    report = serve_bad_requests(saved_model_dir, names, **kwargs)
    for case in ("scalar", "matrix"):
        assert isinstance(report[case], str), (case, report[case])
        assert f"input {names[0]} must be a 1-D batch of strings" in report[case], report[case]
    assert set(report["empty"]) == set(report["one"])
    for key, (dtype, shape) in report["empty"].items():
        one_dtype, one_shape = report["one"][key]
        assert dtype == one_dtype and shape[0] == 0 and one_shape[0] == 1, (key, report)


def _run_fresh_python(script: str, *args: str, stdin: str | None = None):
    """`python -c script *args` with TensorFlow's C++ logging off; the CompletedProcess."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run(
        [sys.executable, "-c", script, *args], input=stdin, capture_output=True, text=True, env=env
    )
