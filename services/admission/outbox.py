"""Pipelined publishing of verdicts: send now, confirm JetStream's ack behind, retry what failed.

Awaiting each ``job.accepted``'s JetStream ack before taking the next arrival caps admission at
one broker round trip per job (about 700 jobs/s on a loaded 2-core machine). The outbox sends a
verdict with ``publish_async`` and returns at once; a background task awaits the acks in order and
republishes (same ``Nats-Msg-Id``, so JetStream stores it once) any that failed or timed out.

This means an arrival may be acked before its verdict is stored. That is safe because the stream
is admission's source of truth: on start it replays ``job.arrived`` and the verdicts, and judges
every arrival that has no verdict (``service.py``), so a verdict lost in a crash is decided again.
``flush()`` waits until every verdict sent so far is stored (used on stop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nats.js.api import PubAck

from schemas.base import Event
from schemas.codec import encode
from services.runtime.bus import MSG_ID_HEADER, Bus, PublishError

log = logging.getLogger("roundhouse.admission.outbox")

_CONFIRM_BATCH = 1024
_Sent = tuple[str, Event, "asyncio.Future[PubAck]"]


class VerdictOutbox:
    """Sends durable events without waiting for each ack; confirms them in order in the background."""

    def __init__(self, bus: Bus, *, ack_timeout_s: float = 5.0, retry_delay_s: float = 0.5) -> None:
        self.bus = bus
        self.ack_timeout_s = ack_timeout_s
        self.retry_delay_s = retry_delay_s
        self.sent = 0
        self.confirmed = 0
        self.retried = 0
        self._queue: asyncio.Queue[_Sent] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._confirm(), name="admission-outbox")

    async def send(self, subject: str, event: Event) -> None:
        """Publish ``event`` on the durable ``subject``; returns once it is on the wire (waits only
        when too many acks are outstanding, nats-py's back-pressure)."""
        self.bus.spec(subject)  # an unknown subject fails here, in the caller
        future = await self.bus.js.publish_async(
            self.bus.wire(subject), encode(event), headers={MSG_ID_HEADER: str(event.event_id)}
        )
        self.sent += 1
        self.bus.stats.published += 1
        self._queue.put_nowait((subject, event, future))

    async def _confirm(self) -> None:
        queue = self._queue
        while True:
            batch = [await queue.get()]
            while len(batch) < _CONFIRM_BATCH and not queue.empty():
                batch.append(queue.get_nowait())
            # One wait for the whole batch: far cheaper than a wait_for per verdict.
            _, late = await asyncio.wait([future for _, _, future in batch], timeout=self.ack_timeout_s)
            for subject, event, future in batch:
                failed = future in late or future.exception() is not None
                if failed:
                    reason = "timed out" if future in late else repr(future.exception())
                    log.warning("no ack for %s %s (%s); publishing it again", subject, event.event_id, reason)
                    await self._republish(subject, event)
                self.confirmed += 1
                queue.task_done()

    async def _republish(self, subject: str, event: Event) -> None:
        while True:
            self.retried += 1
            try:
                await self.bus.publish(subject, event)
                return
            except PublishError as exc:
                # The broker is away; the verdict must not be dropped (the arrival was acked).
                log.error("verdict %s on %s still not stored: %s", event.event_id, subject, exc)
                await asyncio.sleep(self.retry_delay_s)

    async def flush(self) -> None:
        """Wait until every verdict sent so far has been acked by JetStream."""
        await self._queue.join()

    @property
    def in_flight(self) -> int:
        return self._queue.qsize()

    async def stop(self, timeout_s: float) -> None:
        """Confirm what is in flight (up to ``timeout_s``), then stop."""
        try:
            await asyncio.wait_for(self.flush(), timeout_s)
        except TimeoutError:
            log.error("%d verdicts unconfirmed at stop; they are decided again on the next start", self.in_flight)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
