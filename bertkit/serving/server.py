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

With an API key (`ServeOptions.api_key`; `bertkit serve --api-key KEY` or the environment
variable `BERTKIT_API_KEY`), every request but to `/health` needs the header
`Authorization: Bearer KEY`, else a 401 (`bertkit.serving.routes.RequireApiKey`). Without
one, listening beyond this machine warns (`open_to_others_warning`). Each path also
answers with a trailing slash (`/predict/`); any other path is a JSON 404.

Requests are read and checked on arrival (`bertkit.serving.protocol`; a mistake is a 4xx
with one JSON line `{"error": "..."}`), featurized in a preparing thread, their rows
batched with the requests that arrive together (`DynamicBatcher`) and run in one model
thread, off the event loop, and decoded in a preparing thread again (`ModelWorker`).
"""

from __future__ import annotations

import contextlib
import errno
import signal
import socket
import sys
from pathlib import Path

from bertkit.errors import UserError
from bertkit.serving.worker import ServeOptions


class Stopped(Exception):
    """SIGINT or SIGTERM ended the server, after it finished the requests it had."""


class StoppedLoading(SystemExit):
    """SIGINT or SIGTERM came before the server answered requests (the model loading):
    nothing to finish. A `SystemExit` of status 128 + the signal's number, as a shell has
    it (130, 143), as `Preempted` is: no `except Exception` on the way swallows it."""

    def __init__(self, number: int):
        super().__init__(128 + number)
        self.signal_name = signal.Signals(number).name


# The signals that came while loading: a library that catches every exception (some
# imports do) can swallow `StoppedLoading`, so `serve` looks here before it answers.
_SIGNALS_WHILE_LOADING: list[int] = []


def serve(
    run_dir, options: ServeOptions | None = None, ready=None, listening=None, embed=False
) -> None:
    """Serves the run in `run_dir` until SIGINT or SIGTERM (or, in a thread, until the
    `uvicorn.Server` handed to `ready(server, address)` is told `should_exit`). With
    `embed`, `run_dir` may be any backbone preset or run, served as a sentence encoder
    (`bertkit.serving.embedding_service`).

    The port is bound before the model loads (or `listening`, a socket from
    `bind_socket`, is used), so a port in use is one `UserError` at once; so are a
    missing or unfinished run. Then the model loads and answers one input (its first
    call traces the model), and only then does the server answer requests.
    """
    require_server_libraries()
    import uvicorn

    from bertkit.serving.routes import build_app

    options = options or ServeOptions()
    check_api_key(options.api_key)
    if not embed and not serves_onnx(run_dir):
        check_finished_run(run_dir)
    if listening is None:
        listening = bind_socket(options.host, options.port)
        warn_if_open(options.host, options.api_key)
    model = _load(run_dir, embed)
    warm_up(model)
    if _SIGNALS_WHILE_LOADING:
        raise StoppedLoading(_SIGNALS_WHILE_LOADING[0])
    config = uvicorn.Config(
        build_app(model, options),
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=30,
    )
    server = uvicorn.Server(config)
    with _stop_on_signals():
        if ready is not None:
            ready(server, listening.getsockname()[:2])
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


def serves_onnx(source) -> bool:
    """Whether `source` is an ONNX folder (`bertkit export --format onnx`), served by
    onnxruntime without TensorFlow, rather than a run."""
    from bertkit.serving.onnx_runtime import METADATA_FILE

    return (Path(source) / METADATA_FILE).is_file()


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


def check_api_key(api_key: str | None, origin: str = "api_key") -> None:
    """A `UserError` (which never shows the key) unless `api_key` is None or a key that
    travels in an HTTP header as it is: visible ASCII, no spaces."""
    if api_key is None:
        return
    if not api_key:
        raise UserError(f"{origin} is empty; expected the key that requests must send")
    if not all("!" <= character <= "~" for character in api_key):
        raise UserError(
            f"{origin}: the key must be visible ASCII characters without spaces (it is "
            "sent in an HTTP header)"
        )


def open_to_others_warning(host: str, api_key: str | None) -> str | None:
    """The line `bertkit serve` warns with when it listens beyond this machine (not
    127.0.0.0/8, ::1 or localhost) and no key is required; None otherwise.

    Example:
        >>> open_to_others_warning("127.0.0.1", None) is None
        True
        >>> open_to_others_warning("0.0.0.0", None)[:50]
        'bertkit serve: warning: listening on 0.0.0.0 witho'
    """
    if api_key is not None or _loopback(host):
        return None
    return (
        f"bertkit serve: warning: listening on {host} without an API key: anyone who can "
        "reach this address can use the model; set BERTKIT_API_KEY (or pass --api-key KEY) "
        "to require the header 'Authorization: Bearer KEY'"
    )


def warn_if_open(host: str, api_key: str | None) -> None:
    """Prints `open_to_others_warning` on stderr, if there is one."""
    warning = open_to_others_warning(host, api_key)
    if warning is not None:
        print(warning, file=sys.stderr, flush=True)


def _loopback(host: str) -> bool:
    import ipaddress

    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may stand for any address
        return False


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host:port`; a port in use or an address this machine
    does not have is a `UserError`."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP, not 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on
        # connections whose socket names TCP, and with it on, a response's body waits for
        # the client's delayed ACK of its headers: 40 ms a request on Linux.
        listening = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
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


def _load(source, embed: bool):
    """The fine-tuned model of a run or an ONNX folder, or with `embed` the source's
    encoder."""
    if embed:
        from bertkit.serving.embedding_service import EmbeddingService

        return EmbeddingService.load(source)
    if serves_onnx(source):
        from bertkit.serving.onnx_service import OnnxService

        return OnnxService.load(source)
    from bertkit.serving.finetuned import FineTunedModel

    return FineTunedModel.load(source)


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
def stop_while_loading():
    """SIGINT or SIGTERM raises `StoppedLoading` inside (from the main thread): before a
    server answers (binding, importing TensorFlow, loading and tracing the model) there is
    nothing to finish, and the default actions would end the process without a word or
    with a KeyboardInterrupt's traceback. `serve` hands both to uvicorn once it answers."""
    if sys.platform == "win32" or not _in_main_thread():
        yield
        return

    def stopped(number, frame):
        _SIGNALS_WHILE_LOADING.append(number)
        raise StoppedLoading(number)

    numbers = (signal.SIGINT, signal.SIGTERM)
    before = {number: signal.signal(number, stopped) for number in numbers}
    try:
        yield
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


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
