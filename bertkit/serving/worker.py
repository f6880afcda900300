"""The model's side of `bertkit serve`: its options, and the worker that checks each
request whole and runs the examples of requests that arrive together in one model call
(`DynamicBatcher`), in one thread of its own, off the event loop."""

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
    max_batch: int = 64  # inputs per model call
    max_wait_ms: float = 5.0  # how long a batch waits for more requests
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
        self.batcher = DynamicBatcher(
            self._predict, self.thread, options.max_batch, options.max_wait_ms / 1000
        )
        self._running = None

    def _predict(self, examples: list) -> list[dict]:
        return self.model.predict_examples(examples, batch_size=self.options.max_batch)

    def start(self) -> None:
        self._running = asyncio.get_running_loop().create_task(self.batcher.run())

    async def stop(self) -> None:
        if self._running is not None:
            self._running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._running
        self.thread.shutdown(wait=True)

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
        """The examples' predictions, batched with other requests' (503 when busy)."""
        try:
            return await self.batcher.submit(examples)
        except ServerBusy as busy:
            raise RequestError(503, f"the server is busy: {busy}") from None

    async def answer(self, examples: list, values: dict) -> bytes:
        """`{"predictions": [...]}` for a request's examples, as one JSON line."""
        predictions = await self.predictions(examples)
        if values:
            task = self.model.task
            predictions = [task.apply_predict_options(p, **values) for p in predictions]
        return json_line({"predictions": predictions})
