"""Facts the worker must not lose: published in order, retried until the broker takes them.

A worker cut off from the bus still stops its jobs (after ``lease_ttl``) and must report that once
it is back; ``Bus.publish`` gives up after a few attempts, so facts wait here instead. Each retry
carries the same ``event_id`` (the JetStream dedup key), so a fact whose ack was lost is stored once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import nats.errors

from schemas.base import Event
from schemas.subjects import subject_for
from services.runtime.bus import Bus, BusError

__all__ = ["Outbox"]

log = logging.getLogger("roundhouse.worker")

_RETRY_S = 0.25


class Outbox:
    """An ordered queue of events and the task that publishes them."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Event | Callable[[], None]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.published = 0
        self.retries = 0

    def put(self, event: Event) -> None:
        self._queue.put_nowait(event)

    def then(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once every event put so far is published (e.g. forget a lease's record
        once the fact that ended it is in the stream)."""
        self._queue.put_nowait(callback)

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def start(self, bus: Bus) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(bus), name="worker-outbox")

    async def _run(self, bus: Bus) -> None:
        while True:
            event = await self._queue.get()
            try:
                if not isinstance(event, Event):
                    try:
                        event()
                    except Exception:
                        log.exception("an outbox callback failed")
                    continue
                while True:
                    try:
                        await bus.publish(subject_for(event), event)
                        self.published += 1
                        break
                    except (BusError, nats.errors.Error, TimeoutError) as exc:
                        self.retries += 1
                        log.warning("could not publish %s yet (%r); retrying", type(event).__name__, exc)
                        await asyncio.sleep(_RETRY_S)
            finally:
                self._queue.task_done()

    async def flush(self, timeout_s: float) -> bool:
        """Wait until every queued event is published; False if ``timeout_s`` passed first."""
        try:
            await asyncio.wait_for(self._queue.join(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
