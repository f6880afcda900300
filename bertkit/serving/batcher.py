"""Dynamic batching for a server: requests that arrive together share one model call.

Each request brings a list of items and its size: `rows` (the model rows it needs; its
item count unless given) and `longest` (its longest row's tokens). A batch starts with the
oldest waiting request and takes the requests behind it, in arrival order, while their
rows fit in `max_batch` and, with `max_batch_tokens`, the padded batch (all its rows as
long as its longest) fits in that many tokens, as TEI's `--max-batch-tokens` bounds a
batch; a request larger than that goes alone. It waits at most `max_wait_seconds` after
its first request arrived for more to come (0, the server's default: not at all), and no
longer once it is full. The batch runs in `executor` (one worker thread: the event loop
keeps accepting, preparing and answering requests meanwhile), and each request gets its
own slice of the results back. Requests that arrive while a batch runs form the next one
as soon as it ends: under load the batches fill themselves without any wait.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses


class ServerBusy(Exception):
    """More rows are waiting than the batcher queues: the request is refused (503)."""


@dataclasses.dataclass
class _Waiting:
    items: list
    rows: int
    longest: int
    arrived: float  # the event loop's clock
    answer: asyncio.Future


class DynamicBatcher:
    """Runs `predict(items) -> results` (one result per item, in order) over the items of
    the requests that arrive together.

    Example:
        >>> import asyncio, concurrent.futures
        >>> async def main():
        ...     with concurrent.futures.ThreadPoolExecutor(1) as thread:
        ...         batcher = DynamicBatcher(lambda items: [2 * i for i in items], thread)
        ...         running = asyncio.create_task(batcher.run())
        ...         answers = await asyncio.gather(batcher.submit([1, 2]), batcher.submit([3]))
        ...         running.cancel()
        ...         return answers, batcher.batch_sizes
        >>> asyncio.run(main())
        ([[2, 4], [6]], [3])
    """

    def __init__(
        self,
        predict,
        executor,
        max_batch: int = 64,
        max_wait_seconds: float = 0.005,
        max_waiting_items: int | None = None,
        max_batch_tokens: int | None = None,
    ):
        self.predict, self.executor = predict, executor
        self.max_batch, self.max_wait_seconds = max_batch, max_wait_seconds
        self.max_batch_tokens = max_batch_tokens
        self.max_waiting_items = max_waiting_items or 64 * max_batch
        self.batch_sizes: list[int] = []  # rows per model call, for tests and statistics
        self._waiting: collections.deque[_Waiting] = collections.deque()
        self._waiting_items = 0
        self._arrived = asyncio.Event()

    async def submit(self, items: list, rows: int | None = None, longest: int = 0) -> list:
        """The results for `items`, once the batch they joined has run; the exception
        `predict` raised for them otherwise. `ServerBusy` when too much is waiting."""
        rows = len(items) if rows is None else rows
        if self._waiting_items + rows > self.max_waiting_items:
            raise ServerBusy(f"{self._waiting_items:,} inputs are waiting; try again shortly")
        loop = asyncio.get_running_loop()
        waiting = _Waiting(list(items), rows, longest, loop.time(), loop.create_future())
        self._waiting.append(waiting)
        self._waiting_items += rows
        self._arrived.set()
        return await waiting.answer

    async def run(self) -> None:
        """Forms and runs batches until cancelled (the server's lifetime)."""
        while True:
            await self._arrived.wait()
            await self._gather()
            batch = self._take_batch()
            # _gather may have cleared the event while requests that did not fit wait on.
            if self._waiting:
                self._arrived.set()
            else:
                self._arrived.clear()
            if batch:
                await self._run_batch(batch)

    async def _gather(self) -> None:
        """Waits until the oldest request has waited `max_wait_seconds` or a full batch is
        waiting."""
        loop = asyncio.get_running_loop()
        while self._waiting and self._waiting_items < self.max_batch:
            left = self._waiting[0].arrived + self.max_wait_seconds - loop.time()
            if left <= 0:
                return
            self._arrived.clear()
            try:  # an Event's wait is safe to cancel: nothing is lost on a timeout
                await asyncio.wait_for(self._arrived.wait(), left)
            except asyncio.TimeoutError:
                return

    def _take_batch(self) -> list[_Waiting]:
        """The oldest waiting requests that fit in one batch (at least one request; those
        whose client left are dropped)."""
        batch, rows, longest = [], 0, 0
        while self._waiting:
            waiting = self._waiting[0]
            if batch and not self._fits(rows + waiting.rows, max(longest, waiting.longest)):
                break
            self._waiting.popleft()
            self._waiting_items -= waiting.rows
            if not waiting.answer.done():  # cancelled: its client disconnected
                batch.append(waiting)
                rows, longest = rows + waiting.rows, max(longest, waiting.longest)
        return batch

    def _fits(self, rows: int, longest: int) -> bool:
        if rows > self.max_batch:
            return False
        return self.max_batch_tokens is None or rows * longest <= self.max_batch_tokens

    async def _run_batch(self, batch: list[_Waiting]) -> None:
        items = [item for waiting in batch for item in waiting.items]
        self.batch_sizes.append(sum(waiting.rows for waiting in batch))
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(self.executor, self.predict, items)
        except Exception as error:  # noqa: BLE001 - handed to the requests, never lost
            await self._run_each_alone(batch, error)
            return
        start = 0
        for waiting in batch:
            _answer(waiting, results[start : start + len(waiting.items)])
            start += len(waiting.items)

    async def _run_each_alone(self, batch: list[_Waiting], error: Exception) -> None:
        """After a failed batch: each request again on its own, so that one request the
        model cannot answer fails alone and the others still get their answers."""
        if len(batch) == 1:
            _answer(batch[0], error=error)
            return
        loop = asyncio.get_running_loop()
        for waiting in batch:
            try:
                results = await loop.run_in_executor(self.executor, self.predict, waiting.items)
            except Exception as alone:  # noqa: BLE001
                _answer(waiting, error=alone)
            else:
                _answer(waiting, results)


def _answer(waiting: _Waiting, results=None, error: Exception | None = None) -> None:
    if waiting.answer.done():  # the client left meanwhile
        return
    if error is not None:
        waiting.answer.set_exception(error)
    else:
        waiting.answer.set_result(results)
