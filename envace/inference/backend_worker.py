"""The one thread that calls a ``ChatBackend`` for ``envace.inference.openai_server``.

Local models are not thread-safe, so chat requests go into one queue drained by a single worker thread.
The worker hands the backend every request waiting when it becomes free (up to ``max_batch``) as one
``generate`` call, so concurrent clients share a batch. When a batch fails, its requests are retried
one by one so that one bad request fails alone.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future

from envace.inference.base import ChatBackend, ChatRequest


class BackendWorker:
    """Runs ``backend.generate`` from a single thread, batching whatever requests are waiting."""

    def __init__(self, backend: ChatBackend, max_batch: int, batch_sizes: list[int] | None = None) -> None:
        self.backend = backend
        self.max_batch = max_batch
        self.batch_sizes = [] if batch_sizes is None else batch_sizes  # one entry per generate call
        self._queue: queue.Queue[tuple[ChatRequest, Future] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="openai-server-backend", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def submit(self, request: ChatRequest) -> Future:
        future: Future = Future()
        self._queue.put((request, future))
        return future

    def stop(self, timeout: float = 5.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def _next_batch(self) -> list[tuple[ChatRequest, Future]] | None:
        """The requests waiting now (blocks for the first; None once stopped). Requests whose caller
        gave up (cancelled futures) are dropped; the others are marked running, so they cannot be."""
        batch: list[tuple[ChatRequest, Future]] = []
        while not batch:
            item = self._queue.get()
            if item is None:
                return None
            if item[1].set_running_or_notify_cancel():
                batch.append(item)
        while len(batch) < self.max_batch:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:  # stop after this batch
                self._queue.put(None)
                break
            if item[1].set_running_or_notify_cancel():
                batch.append(item)
        return batch

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            self._answer(batch)
        while True:  # fail whatever arrived after the stop
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None and item[1].set_running_or_notify_cancel():
                item[1].set_exception(RuntimeError("the server is stopping"))

    def _answer(self, batch: list[tuple[ChatRequest, Future]]) -> None:
        self.batch_sizes.append(len(batch))
        try:
            outputs = self.backend.generate([request for request, _ in batch])
            if len(outputs) != len(batch):
                raise RuntimeError(f"backend returned {len(outputs)} outputs for {len(batch)} requests")
        except Exception as exc:  # noqa: BLE001 - reported to the waiting requests
            if len(batch) > 1:  # isolate the request that broke the batch
                for item in batch:
                    self._answer([item])
                return
            batch[0][1].set_exception(exc)
            return
        for (_, future), output in zip(batch, outputs):
            future.set_result(output)
