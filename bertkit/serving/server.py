"""`bertkit serve`: a fine-tuned run behind HTTP (Starlette on uvicorn), answering as
`bertkit predict` does, with dynamic batching.

    POST /predict   {"inputs": [...]} -> {"predictions": [...]}, one per input, each the JSON
                    `bertkit predict` prints for that input (task options by keyword:
                    {"inputs": [...], "top_k": 3})
    GET  /health    {"status": "ok"}
    GET  /metadata  the task, its labels, the model card's fields, the server's limits

Why the run's Keras model and not its SavedModel: the answers must be `bertkit predict`'s,
and the SavedModel's cannot be turned into them for any task. It computes in float32 and
pads each request to its own longest row (classification's probabilities are a float32
softmax where `predict`'s is float64: the scores differ in their last digits), and it
takes only raw texts: not a tagging model's list of words (whose answer has `tags`), not
span QA's `{"id", "n_best"}` (nor `best_span` of v2.0), and gives no MLM scores. So the
server runs the model `bertkit predict` runs (`bertkit.load`): featurize, the model
padded to the run's bucket lengths, the task's decoder.

Requests are read and checked on arrival (`bertkit.serving.protocol`; a mistake is a 4xx
with one JSON line `{"error": "..."}`), their examples batched with the requests that
arrive together (`DynamicBatcher`) and run in one worker thread, off the event loop.
"""

from __future__ import annotations

import contextlib
import errno
import signal
import socket
import sys

from bertkit.errors import UserError
from bertkit.serving.worker import ServeOptions


class Stopped(Exception):
    """SIGINT or SIGTERM ended the server, after it finished the requests it had."""


def serve(run_dir, options: ServeOptions | None = None, ready=None, listening=None) -> None:
    """Serves the run in `run_dir` until SIGINT or SIGTERM (or, in a thread, until the
    `uvicorn.Server` handed to `ready(server, address)` is told `should_exit`).

    The port is bound before the model loads (or `listening`, a socket from
    `bind_socket`, is used), so a port in use is one `UserError` at once; so are a
    missing or unfinished run. Then the model loads and answers one input (its first
    call traces the model), and only then does the server answer requests.
    """
    require_server_libraries()
    import uvicorn

    from bertkit.serving.finetuned import FineTunedModel
    from bertkit.serving.routes import build_app

    options = options or ServeOptions()
    check_finished_run(run_dir)
    listening = listening or bind_socket(options.host, options.port)
    model = FineTunedModel.load(run_dir)
    warm_up(model)
    config = uvicorn.Config(
        build_app(model, options),
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=30,
    )
    server = uvicorn.Server(config)
    if ready is not None:
        ready(server, listening.getsockname()[:2])
    with _stop_on_signals():
        server.run(sockets=[listening])


def require_server_libraries() -> None:
    """A `UserError` saying how to install them when Starlette or uvicorn is missing
    (they are the `serve` extra, not needed to train)."""
    import importlib.util

    missing = [name for name in ("starlette", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(
            f"bertkit serve needs {' and '.join(missing)}: pip install 'bertkit[serve]'"
        )


def check_finished_run(run_dir) -> None:
    """A `UserError` unless `run_dir` is a run whose training finished (its trained
    model is what a server must answer with)."""
    from bertkit.run_dir import FINISHED, RunDirectory

    run = RunDirectory.open(run_dir)
    status = run.status()
    if status is not None and status != FINISHED:
        raise UserError(
            f"not a finished run (its run.json says '{status}'): serve it when "
            "`bertkit finetune` has finished",
            source=run.path,
        )


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host:port`; a port in use or an address this machine
    does not have is a `UserError`."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listening = socket.socket(family, socket.SOCK_STREAM)
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind((host, port))
        listening.listen(2048)
    except OSError as error:
        reason = {
            errno.EADDRINUSE: "the port is in use (another server?); pick another --port",
            errno.EADDRNOTAVAIL: "no such address on this machine; pick another --host",
            errno.EACCES: "not allowed to listen there (a port below 1024?)",
        }.get(error.errno, error.strerror or str(error))
        raise UserError(f"cannot listen on {host}:{port}: {reason}") from None
    except socket.gaierror as error:  # pragma: no cover - an unknown host name
        raise UserError(f"cannot listen on {host}:{port}: {error.strerror}") from None
    listening.setblocking(False)
    return listening


def warm_up(model) -> None:
    """One prediction before the first request: the model's first call traces it."""
    for value in ("warm up [MASK] .", ["warm up [MASK] .", "warm up ."]):
        try:
            examples = model.parse_inputs([value])
        except UserError:  # e.g. a pair model given one text: the pair comes next
            continue
        model.predict_examples(examples)
        return


@contextlib.contextmanager
def _stop_on_signals():
    """uvicorn handles SIGINT and SIGTERM while it serves (it finishes the requests it
    has, then stops) and raises the signal again afterwards: here, `Stopped`, instead of
    a KeyboardInterrupt's traceback or the process killed mid-exit."""
    if sys.platform == "win32" or not _in_main_thread():
        yield
        return

    def stopped(number, frame):
        raise Stopped(signal.Signals(number).name)

    before = {number: signal.signal(number, stopped) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
