"""The HTTP side of `bertkit serve`: the Starlette app, its three routes, and every error
as one JSON line `{"error": "..."}` with its status (see `bertkit.serving.server`)."""

from __future__ import annotations

import contextlib
import hmac
import logging

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.responses import Response
from starlette.routing import Route

from bertkit.run_dir import read_json
from bertkit.serving.protocol import MAX_BODY_BYTES, RequestError, json_line
from bertkit.serving.worker import ModelWorker, ServeOptions

log = logging.getLogger("bertkit.serve")
_JSON = "application/json"


def build_app(model, options: ServeOptions | None = None) -> Starlette:
    """The app serving `model` (a `FineTunedModel`): its batcher runs while the app does."""
    options = options or ServeOptions()
    worker = ModelWorker(model, options)
    about = json_line(metadata(model, options))

    async def health(request) -> Response:
        return Response(json_line({"status": "ok"}), media_type=_JSON)

    async def about_model(request) -> Response:
        return Response(about, media_type=_JSON)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        worker.start()
        try:
            yield
        finally:
            await worker.stop()

    async def http_error(request, error: HTTPException) -> Response:
        return error_response(error.status_code, error.detail)

    app = Starlette(
        routes=_routes(_posted(worker), {"health": health, "metadata": about_model}),
        middleware=_key_check(options.api_key),
        exception_handlers={HTTPException: http_error},
        lifespan=lifespan,
    )
    app.router.redirect_slashes = False  # any other path: a JSON 404
    app.state.batcher = worker.batcher  # its batch sizes tell how requests were grouped
    return app


def _posted(worker: ModelWorker) -> dict:
    """The POST routes: `/predict`, and for an embedding model `/embed` and `/v1/embeddings`."""
    endpoints = {"predict": _endpoint(_predict(worker))}
    if worker.model.task.name == "embedding":  # its predictions are vectors
        from bertkit.serving.embedding_routes import endpoints as embedding_endpoints

        endpoints.update({p: _endpoint(e) for p, e in embedding_endpoints(worker).items()})
    return endpoints


def _key_check(api_key: str | None) -> list[Middleware]:
    return [] if api_key is None else [Middleware(RequireApiKey, api_key=api_key)]


def _routes(posted: dict, got: dict) -> list[Route]:
    """`POST /predict` (and the embedding routes), `GET /health` and `GET /metadata`, each
    with a trailing slash too: Starlette's answer to `/predict/`, an empty 307 redirect, is
    lost on a client that does not send a POST's body again after a redirect (curl
    without -L)."""
    methods = {**dict.fromkeys(posted, "POST"), **dict.fromkeys(got, "GET")}
    return [
        Route(f"/{path}{slash}", endpoint, methods=[methods[path]])
        for path, endpoint in {**posted, **got}.items()
        for slash in ("", "/")
    ]


class RequireApiKey:
    """ASGI middleware: every request but to `/health` needs `Authorization: Bearer KEY`
    (TEI's and OpenAI's header), else a 401 `{"error": ...}`. The key is compared in
    constant time (`hmac.compare_digest`): the answer's timing tells nothing of it."""

    OPEN_PATHS = ("/health", "/health/")  # a load balancer's probe has no key to send

    def __init__(self, app, api_key: str):
        self.app, self.expected = app, api_key.encode("utf-8")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in self.OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = bearer_token(scope["headers"])
        if given is not None and hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        message = (
            "missing API key: send the header 'Authorization: Bearer <key>'"
            if given is None
            else "wrong API key"
        )
        response = error_response(401, message)
        response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, send)


def bearer_token(headers) -> bytes | None:
    """The token of the first `Authorization: Bearer <token>` header (the scheme in any
    case, as RFC 6750 has it), or None.

    Example:
        >>> bearer_token([(b"authorization", b"bearer s3cret")])
        b's3cret'
    """
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" and token.strip() else None
    return None


async def read_body(request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The request's body, refused (413) once it passes `limit` bytes: a client cannot
    make the server hold more."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"the body is over {limit:,} bytes, the limit a request")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"the body is over {limit:,} bytes, the limit a request")
        chunks.append(chunk)
    return b"".join(chunks)


def _predict(worker: ModelWorker):
    async def predict(body: bytes) -> bytes:
        # json.loads and the inputs' checks of a large request take milliseconds:
        # off the event loop, which keeps answering the other clients
        examples, values = await run_in_threadpool(worker.read, body)
        return await worker.answer(examples, values)

    return predict


def _endpoint(answer):
    """A POST route: the body read (413 past the limit), then `answer(body)`'s JSON; a
    `RequestError` is its 4xx, anything else a 500 for this request alone."""

    async def endpoint(request) -> Response:
        try:
            return Response(await answer(await read_body(request)), media_type=_JSON)
        except RequestError as error:
            return error_response(error.status, error.message)
        except Exception as error:  # noqa: BLE001 - one request fails, the server serves on
            log.exception("bertkit serve: a request failed")
            return error_response(500, f"the model failed on this request: {error}"[:300])

    return endpoint


def error_response(status: int, message: str) -> Response:
    return Response(json_line({"error": message}), status_code=status, media_type=_JSON)


def metadata(model, options: ServeOptions) -> dict:
    """What `GET /metadata` answers: the task, its labels, the model card's fields (base
    model, sequence length, training options, validation and test metrics) and the
    server's limits."""
    if not hasattr(model, "run"):  # an encoder (`serve --embed`) or an ONNX folder
        return model.metadata(limits(options))
    task, run = model.task, model.run
    recipe = _recipe(run.recipe_file)
    return {
        "task": task.name,
        "description": type(task).description,
        "labels": list(getattr(task, "labels", None) or []) or None,
        "takes_text_pairs": model.takes_text_pairs,
        "predict_options": [option.keyword for option in task.predict_options],
        "model_card": {
            "name": run.path.resolve().name,
            "base_model": recipe.get("backbone", {}).get("preset"),
            "sequence_length": model.description["sequence_length"],
            "training": recipe.get("training"),
            "metrics": _numbers(_json_or_empty(run.metrics_file).get("final", {})),
            "best_epoch": _json_or_empty(run.run_file).get("best_epoch"),
        },
        "limits": limits(options),
    }


def limits(options: ServeOptions) -> dict:
    return {
        "max_batch": options.max_batch,
        "max_batch_tokens": options.max_batch_tokens,
        "max_wait_ms": options.max_wait_ms,
        "max_request_inputs": options.max_request_inputs,
        "max_input_characters": options.max_input_characters,
        "max_request_characters": options.max_request_characters,
    }


def _recipe(path) -> dict:
    import yaml

    try:
        recipe = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):  # the card is then shorter
        return {}
    return recipe if isinstance(recipe, dict) else {}


def _json_or_empty(path) -> dict:
    try:
        value = read_json(path)
    except Exception:  # noqa: BLE001 - a missing or damaged file leaves its fields out
        return {}
    return value if isinstance(value, dict) else {}


def _numbers(final: dict) -> dict:
    """{split: {metric: number}} of the final metrics (tables such as per_type left out,
    as the model card leaves them)."""
    return {
        split: {name: value for name, value in metrics.items() if isinstance(value, (int, float))}
        for split, metrics in final.items()
        if isinstance(metrics, dict)
    }
