"""The model's side of `bertkit serve`: its options, and the worker that checks each
request whole, prepares (featurizes) it on arrival, runs the rows of requests that arrive
together in one model call (`DynamicBatcher`) in a thread of its own, and decodes each
request's outputs; preparing and decoding run in other threads, off the event loop, while
the model thread runs the model."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses

from bertkit.errors import UserError
from bertkit.files import MAX_INPUT_CHARACTERS, MAX_REQUEST_CHARACTERS
from bertkit.serving.batcher import DynamicBatcher, ServerBusy
from bertkit.serving.protocol import (
    MAX_REQUEST_INPUTS,
    RequestError,
    check_request_characters,
    json_line,
    read_request,
)


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    """Where the server listens, how it batches, and what one request may hold."""

    host: str = "127.0.0.1"  # loopback: reachable from this machine only
    port: int = 8080  # 0: any free port
    max_batch: int = 64  # model rows per call
    # A padded batch's most tokens (rows x its longest row; None: no bound), as TEI's
    # --max-batch-tokens: long inputs make smaller batches, short ones fuller.
    max_batch_tokens: int | None = 16384
    # How long a batch waits for more requests: none, as requests that arrive while a
    # batch runs make the next one (a wait only delays the lone request).
    max_wait_ms: float = 0.0
    max_request_inputs: int = MAX_REQUEST_INPUTS
    max_input_characters: int = MAX_INPUT_CHARACTERS
    max_request_characters: int = MAX_REQUEST_CHARACTERS
    # Requests need `Authorization: Bearer <api_key>` (None: no key; /health is open).
    api_key: str | None = dataclasses.field(default=None, repr=False)


class ModelWorker:
    """The model's side of the server: one worker thread running batches of examples,
    fed by a `DynamicBatcher`."""

    def __init__(self, model, options: ServeOptions):
        self.model, self.options = model, options
        self.thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="bertkit-model")
        self.preparing = concurrent.futures.ThreadPoolExecutor(
            2, thread_name_prefix="bertkit-prepare"
        )
        self.batcher = DynamicBatcher(
            self._run,
            self.thread,
            options.max_batch,
            options.max_wait_ms / 1000,
            max_batch_tokens=options.max_batch_tokens,
        )
        self._running = None

    def _run(self, requests: list) -> list:
        return self.model.run_prepared(requests, batch_size=self.options.max_batch)

    def start(self) -> None:
        self._running = asyncio.get_running_loop().create_task(self.batcher.run())

    async def stop(self) -> None:
        if self._running is not None:
            self._running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._running
        self.thread.shutdown(wait=True)
        self.preparing.shutdown(wait=True)

    def read(self, body: bytes):
        """`(examples, options)` of a request body, checked whole: a `RequestError`
        (4xx) names the first mistake."""
        keywords = [option.keyword for option in self.model.task.predict_options]
        inputs, values = read_request(body, keywords, self.options.max_request_inputs)
        return self.parse(inputs), values

    def parse(self, inputs: list) -> list:
        """The task's examples of a request's inputs, checked whole (413, 422)."""
        check_request_characters(inputs, self.options.max_request_characters)
        try:
            return self.model.parse_inputs(
                inputs, max_input_characters=self.options.max_input_characters
            )
        except UserError as error:
            raise RequestError(422, str(error)) from None

    async def predictions(self, examples: list) -> list[dict]:
        """The examples' predictions, their rows batched with other requests' (503 when
        busy)."""
        loop = asyncio.get_running_loop()
        request = await loop.run_in_executor(self.preparing, self.model.prepare, examples)
        try:
            (outputs,) = await self.batcher.submit([request], request.rows, request.longest)
        except ServerBusy as busy:
            raise RequestError(503, f"the server is busy: {busy}") from None
        return await loop.run_in_executor(self.preparing, self.model.finish, request, outputs)

    async def answer(self, examples: list, values: dict) -> bytes:
        """`{"predictions": [...]}` for a request's examples, as one JSON line."""
        predictions = await self.predictions(examples)
        if values:
            task = self.model.task
            predictions = [task.apply_predict_options(p, **values) for p in predictions]
        return json_line({"predictions": predictions})
