"""SavedModels called as a server calls them: in a fresh Python that imports only
TensorFlow and tf-text, with good requests and with badly shaped ones."""

from __future__ import annotations

import json

# One request per stdin line, one JSON reply per stdout line. The process imports only
# TensorFlow and tf-text, and says after each request whether anything imported keras-hub or
# bertkit since.
_SERVING_PROCESS_SCRIPT = """
import json, sys, traceback
import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the tf-text ops the graph uses)

def plain(value):
    value = value.numpy()
    if value.dtype.kind in "SO":  # UTF-8 bytes
        return np.char.decode(value.astype(bytes), "utf-8").tolist()
    return value.tolist()

def signature(directory):
    return tf.saved_model.load(directory).signatures["serving_default"]

def serve(requests):
    replies = []
    for directory, inputs in requests:
        outputs = signature(directory)(**{k: tf.constant(v) for k, v in inputs.items()})
        replies.append({k: plain(v) for k, v in outputs.items()})
    return replies

def shapes(outputs):
    return {key: [str(v.dtype.name), v.shape.as_list()] for key, v in outputs.items()}

def bad_requests(directory, names, example):
    serve = signature(directory)
    report = {}
    for case, value in (("scalar", example), ("matrix", [[example, example]]), ("empty", [])):
        try:
            report[case] = shapes(serve(**{n: tf.constant(value, dtype=tf.string) for n in names}))
        except tf.errors.InvalidArgumentError as error:
            report[case] = "InvalidArgumentError: " + error.message[:3000]
    report["one"] = shapes(serve(**{name: tf.constant([example]) for name in names}))
    return report

for line in sys.stdin:
    request = json.loads(line)
    try:
        if request["kind"] == "serve":
            reply = {"outputs": serve(request["requests"])}
        else:
            reply = {"outputs": bad_requests(*request["arguments"])}
    except Exception:
        reply = {"error": traceback.format_exc()[-3000:]}
    reply["imported"] = sorted(m for m in ("keras_hub", "keras_nlp", "bertkit") if m in sys.modules)
    print(json.dumps(reply), flush=True)
"""


def serve_in_fresh_process(saved_model_dir, inputs: dict) -> dict:
    """Runs a SavedModel's `serving_default` in a Python that imports only TensorFlow and
    tf-text, as a server does; returns its outputs as lists (strings decoded).

    Raises AssertionError if keras-hub or bertkit got imported there. (Keras itself
    is always imported: `tensorflow_text` builds Keras layers at import time.) That Python
    starts once per test process and serves every call after it (TensorFlow's start-up
    is seconds of CPU).
    """
    return serve_each_in_fresh_process([(saved_model_dir, inputs)])[0]


def serve_each_in_fresh_process(requests: list) -> list[dict]:
    """`serve_in_fresh_process` for several (SavedModel folder, inputs) pairs in one
    request: the outputs of each, in order."""
    requests = [[str(directory), inputs] for directory, inputs in requests]
    return _SERVER.ask({"kind": "serve", "requests": requests})


def serve_bad_requests(saved_model_dir, names: list[str], example: str = "[MASK] is here") -> dict:
    """Calls a SavedModel in the TensorFlow-only process with a scalar, a 2-D input and an
    empty batch (`example` in each of the inputs `names`), and one good row; returns for
    each case the outputs' {name: [dtype, shape]}, or the InvalidArgumentError's message."""
    return _SERVER.ask({"kind": "bad", "arguments": [str(saved_model_dir), names, example]})


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


class _ServingProcess:
    """The TensorFlow-only Python the functions above send their requests to, started at
    the first request and again after it died."""

    def __init__(self):
        self.process = None

    def ask(self, request: dict):
        process = self._running()
        process.stdin.write(json.dumps(request) + "\n")
        process.stdin.flush()
        line = process.stdout.readline()
        if not line:
            process.wait()
            self.process = None
            self.stderr.seek(0)
            raise AssertionError(
                f"serving crashed ({process.returncode}):\n{self.stderr.read()[-3000:]}"
            )
        reply = json.loads(line)
        assert reply["imported"] == [], f"the SavedModel needed {reply['imported']}"
        if "error" in reply:
            raise AssertionError(f"serving failed:\n{reply['error']}")
        return reply["outputs"]

    def _running(self):
        import atexit
        import os
        import subprocess
        import sys
        import tempfile

        if self.process is None:
            self.stderr = tempfile.TemporaryFile(mode="w+")
            self.process = subprocess.Popen(
                [sys.executable, "-c", _SERVING_PROCESS_SCRIPT],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.stderr,
                text=True,
                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
            )
            atexit.register(self.process.kill)
        return self.process


_SERVER = _ServingProcess()
