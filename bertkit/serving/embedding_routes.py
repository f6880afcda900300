"""The embedding routes of `bertkit serve` on an `embedding` run, in the two shapes vector
databases' clients speak: text-embeddings-inference's `POST /embed` and OpenAI's
`POST /v1/embeddings`. Both answer from the same batched model calls as `POST /predict`.

    POST /embed          {"inputs": "a text" | [texts], "normalize": true, "truncate": true}
                         -> [[0.01, ...], ...]
    POST /v1/embeddings  {"input": "a text" | [texts], "model": "...",
                          "encoding_format": "float" | "base64"}
                         -> {"object": "list", "data": [{"object": "embedding", "index": 0,
                             "embedding": [...]}], "model": "...", "usage": {...}}
"""

from __future__ import annotations

import base64

import numpy as np

from bertkit.serving.protocol import RequestError, json_line, json_object, kind

_TEI_FIELDS = ("inputs", "normalize", "truncate")
_OPENAI_FIELDS = ("input", "model", "encoding_format", "dimensions", "user")


def read_tei(body: bytes) -> tuple[list, bool]:
    """(texts, normalize) of a `POST /embed` body. Texts longer than the model's sequence
    length are always cut, as `truncate: true` asks (`false` is taken the same way).

    Example:
        >>> read_tei(b'{"inputs": "a text", "normalize": false}')
        (['a text'], False)
    """
    request = _fields(body, _TEI_FIELDS)
    for flag in ("normalize", "truncate"):
        if not isinstance(request.get(flag, True), bool):
            raise RequestError(400, f"'{flag}' must be true or false, got {kind(request[flag])}")
    return _texts(request, "inputs"), request.get("normalize", True)


def read_openai(body: bytes) -> tuple[list, str | None, str, int | None]:
    """(texts, model, encoding format, dimensions asked) of a `POST /v1/embeddings` body.

    Example:
        >>> read_openai(b'{"input": ["a", "b"], "model": "m"}')
        (['a', 'b'], 'm', 'float', None)
    """
    request = _fields(body, _OPENAI_FIELDS)
    encoding = request.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        message = f"'encoding_format' must be 'float' or 'base64', got {encoding!r:.40}"
        raise RequestError(400, message)
    dimensions = request.get("dimensions")
    if dimensions is not None and (type(dimensions) is not int or dimensions < 1):
        raise RequestError(400, f"'dimensions' must be a whole number, got {kind(dimensions)}")
    model = request.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(400, f"'model' must be a text, got {kind(model)}")
    return _texts(request, "input"), model, encoding, dimensions


def check_dimensions(vectors: np.ndarray, dimensions: int | None) -> None:
    """The vectors are as long as a request asked (`dimensions`): they are never cut."""
    if dimensions is not None and dimensions != vectors.shape[1]:
        message = f"'dimensions': this model's vectors have {vectors.shape[1]}, got {dimensions}"
        raise RequestError(400, message)


def tei_answer(vectors: np.ndarray, normalize: bool) -> list:
    """The `POST /embed` answer: one list of floats per text."""
    if normalize:
        vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return vectors.tolist()


def openai_answer(vectors: np.ndarray, model: str, encoding: str, tokens: int) -> dict:
    """The `POST /v1/embeddings` answer; base64 is the float32 vector's little-endian bytes,
    as OpenAI's clients decode it."""

    def encoded(vector):
        if encoding == "base64":
            return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
        return vector.tolist()

    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": index, "embedding": encoded(vector)}
            for index, vector in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _fields(body: bytes, known: tuple) -> dict:
    request = json_object(body)
    unknown = sorted(set(request) - set(known))
    if unknown:
        taken = ", ".join(f"'{name}'" for name in known)
        raise RequestError(400, f"unknown field '{unknown[0]:.40}'; expected {taken}")
    return request


def _texts(request: dict, field: str) -> list:
    if field not in request:
        raise RequestError(400, f"missing field '{field}': a text or a list of texts")
    texts = request[field]
    texts = [texts] if isinstance(texts, str) else texts
    if not isinstance(texts, list) or not texts:
        raise RequestError(400, f"'{field}' must be a text or a non-empty list of texts")
    for number, text in enumerate(texts, 1):
        if not isinstance(text, str):  # OpenAI's token-id arrays too: texts only here
            raise RequestError(422, f"input {number}: expected a text, got {kind(text)}")
    return texts


def endpoints(worker) -> dict:
    """`{path: answer(body) -> bytes}` of the two routes, over `worker`'s batched model."""
    from starlette.concurrency import run_in_threadpool

    model = worker.model
    name = getattr(model, "name", None) or model.run.path.resolve().name  # --embed: the source

    async def vectors(texts: list) -> np.ndarray:
        if len(texts) > worker.options.max_request_inputs:
            limit = worker.options.max_request_inputs
            raise RequestError(413, f"{len(texts):,} inputs, over the limit of {limit:,} a request")
        examples = await run_in_threadpool(worker.parse, texts)
        predictions = await worker.predictions(examples)
        return np.array([p["embedding"] for p in predictions], np.float32)

    async def embed(body: bytes) -> bytes:
        texts, normalize = read_tei(body)
        return json_line(tei_answer(await vectors(texts), normalize))

    async def openai(body: bytes) -> bytes:
        texts, asked, encoding, dimensions = read_openai(body)
        found = await vectors(texts)
        check_dimensions(found, dimensions)
        tokens = await run_in_threadpool(token_count, model, texts)
        return json_line(openai_answer(found, asked or name, encoding, tokens))

    return {"embed": embed, "v1/embeddings": openai}


def token_count(model, texts: list) -> int:
    """The word pieces the model read of `texts`, [CLS] and [SEP] included (OpenAI's usage)."""
    length = model.description["sequence_length"]
    token_ids, _ = model.task.tokenizer.encode(texts, sequence_length=length)
    return sum(len(ids) for ids in token_ids)
