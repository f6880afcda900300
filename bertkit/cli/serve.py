"""`bertkit serve RUN_DIR`: the run's model behind HTTP, answering as `bertkit predict`
does, requests that arrive together batched (`bertkit.serving.server.serve`)."""

from __future__ import annotations

import sys

from bertkit.cli.arguments import add_command, positive


def add_to(commands) -> None:
    sub = add_command(
        commands,
        "serve",
        run,
        "serve the run's model over HTTP: POST /predict, GET /health, GET /metadata",
    )
    sub.epilog = (
        'POST /predict {"inputs": [...]} takes the inputs `bertkit predict` takes (texts, '
        "[text, text_pair] pairs, question and context objects) and answers "
        '{"predictions": [...]}, each what `bertkit predict` prints for that input. '
        "SIGINT or SIGTERM: the requests in progress are answered, then the server stops. "
        "With an API key (--api-key KEY, or the environment variable BERTKIT_API_KEY), "
        "every request but GET /health needs the header 'Authorization: Bearer KEY'."
    )
    sub.add_argument(
        "run_dir",
        help="a run directory of `bertkit finetune`, or an ONNX folder of `bertkit export "
        "--format onnx` (served by onnxruntime, without TensorFlow); with --embed: any "
        "backbone preset",
    )
    sub.add_argument(
        "--embed",
        action="store_true",
        help="serve the source's encoder as sentence embeddings (POST /embed, /v1/embeddings, "
        "/predict), pooled as bertkit embed pools it: a preset needs no run",
    )
    _add_address_options(sub)
    _add_batching_options(sub)


def _add_batching_options(sub) -> None:
    """How requests that arrive together are batched into one model call."""
    sub.add_argument(
        "--max-batch",
        type=positive,
        default=64,
        metavar="N",
        help="the most model rows one call takes (default: 64; 1 turns batching off)",
    )
    sub.add_argument(
        "--max-batch-tokens",
        type=positive,
        default=16384,
        metavar="N",
        help="the most tokens of a padded batch, its rows times its longest row (default: "
        "16384; a request past it runs alone)",
    )
    sub.add_argument(
        "--max-wait-ms",
        type=_milliseconds,
        default=0.0,
        metavar="MS",
        help="how long a batch waits for more requests after its first (default: 0: "
        "requests that arrive while a batch runs make the next one)",
    )


def _add_address_options(sub) -> None:
    """Where the server listens, and the key its requests must send."""
    sub.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default: 127.0.0.1, this machine only; "
        "0.0.0.0 for every network)",
    )
    sub.add_argument(
        "--port", type=_port, default=8080, help="the port (default: 8080; 0 picks a free one)"
    )
    sub.add_argument(
        "--api-key",
        metavar="KEY",
        help="requests must send 'Authorization: Bearer KEY' (GET /health excepted); "
        "default: the environment variable BERTKIT_API_KEY, which other users of this "
        "machine cannot read from the process list as they can a flag",
    )


def run(args) -> int:
    from bertkit.serving.server import StoppedLoading, stop_while_loading

    try:
        with stop_while_loading():
            return _serve(args)
    except StoppedLoading as stopped:  # nothing was served: nothing to finish
        print(
            f"bertkit serve: stopped while loading the model ({stopped.signal_name})",
            file=sys.stderr,
        )
        return stopped.code
    except KeyboardInterrupt:  # where no handler could be set (not the main thread)
        print("bertkit serve: stopped while loading the model (SIGINT)", file=sys.stderr)
        return 130


def _serve(args) -> int:
    from bertkit.cli.quiet_import import import_tensorflow_quietly
    from bertkit.serving.server import (
        ServeOptions,
        Stopped,
        bind_socket,
        check_api_key,
        check_finished_run,
        require_server_libraries,
        serve,
        serves_onnx,
        warn_if_open,
    )

    # Before TensorFlow loads (seconds): a wrong path or a port in use is said at once.
    require_server_libraries()
    api_key, origin = _api_key(args)
    check_api_key(api_key, origin)
    onnx = not args.embed and serves_onnx(args.run_dir)
    if not args.embed and not onnx:
        check_finished_run(args.run_dir)
    listening = bind_socket(args.host, args.port)
    warn_if_open(args.host, api_key)
    if not onnx:  # an ONNX folder is served by onnxruntime alone
        import_tensorflow_quietly()
    options = ServeOptions(
        host=args.host,
        port=args.port,
        max_batch=args.max_batch,
        max_batch_tokens=args.max_batch_tokens,
        max_wait_ms=args.max_wait_ms,
        api_key=api_key,
    )
    try:
        serve(args.run_dir, options, ready=_say_where, listening=listening, embed=args.embed)
    except Stopped as stopped:  # while serving: the requests in progress were answered
        print(f"bertkit serve: stopped ({stopped})", file=sys.stderr)
    return 0


def _api_key(args) -> tuple[str | None, str]:
    """The key requests must send and where it came from: --api-key, else BERTKIT_API_KEY."""
    import os

    if args.api_key is not None:
        return args.api_key, "--api-key"
    return os.environ.get("BERTKIT_API_KEY"), "BERTKIT_API_KEY"


def _say_where(server, address) -> None:
    host, port = address
    shown = f"[{host}]" if ":" in host else host
    print(
        f"bertkit serve: http://{shown}:{port} (POST /predict, GET /health, GET /metadata; "
        "an embedding run also POST /embed and /v1/embeddings; Ctrl-C stops)",
        file=sys.stderr,
        flush=True,
    )


def _port(text: str) -> int:
    import argparse

    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"expected a port, 0 to 65535, got {text!r}")
    return int(text)


def _milliseconds(text: str) -> float:
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or not 0 <= value <= 10_000:
        raise argparse.ArgumentTypeError(f"expected milliseconds, 0 to 10000, got {text!r}")
    return value
