"""Pipelined publishing of verdicts: send now, confirm JetStream's ack behind, retry what failed.

Awaiting each ``job.accepted``'s JetStream ack before taking the next arrival caps admission at
one broker round trip per job (about 700 jobs/s on a loaded 2-core machine). The outbox sends a
verdict and returns at once; JetStream's acks come back on one inbox subscription and settle the
verdicts they name, and a background task republishes (same ``Nats-Msg-Id``, so JetStream stores
it once) any verdict whose ack reported an error or did not come within ``ack_timeout_s``.

This means an arrival may be acked before its verdict is stored. That is safe because the stream
is admission's source of truth: on start it replays ``job.arrived`` and the verdicts, and judges
every arrival that has no verdict (``service.py``), so a verdict lost in a crash is decided again.
``flush()`` waits until every verdict sent so far is stored (used on stop).

Why not nats-py's ``publish_async``: it costs, per message, a future with a done-callback, a
semaphore acquired through ``wait_for``, a random token and a parsed ``PubAck``; at thousands of
verdicts a second that was a quarter of admission's CPU. Here a verdict is one ``publish`` with a
reply subject ending in a sequence number, an entry in an insertion-ordered dict (so the oldest
unconfirmed verdict is always first, and the time-out scan stops at the first young one), and an
ack is a dict pop; only an ack that reports an error is parsed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from schemas.base import Event
from schemas.codec import encode
from services.runtime.bus import MSG_ID_HEADER, Bus, PublishError

log = logging.getLogger("roundhouse.admission.outbox")

_Sent = tuple[str, Event, float]
"""(subject, verdict, monotonic time it was sent)."""


class VerdictOutbox:
    """Sends durable events without waiting for each ack; confirms them in the background."""

    def __init__(
        self,
        bus: Bus,
        *,
        ack_timeout_s: float = 5.0,
        retry_delay_s: float = 0.5,
        max_pending: int = 4096,
    ) -> None:
        self.bus = bus
        self.ack_timeout_s = ack_timeout_s
        self.retry_delay_s = retry_delay_s
        self.max_pending = max_pending
        """``send`` waits while this many verdicts are unconfirmed (back-pressure)."""
        self.sent = 0
        self.confirmed = 0
        self.retried = 0
        self._seq = 0
        self._prefix = ""
        self._unconfirmed: dict[int, _Sent] = {}
        self._failed: list[_Sent] = []
        self._retrying = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._room = asyncio.Event()
        self._room.set()
        self._wake = asyncio.Event()
        self._sub: Subscription | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._prefix = self.bus.nc.new_inbox() + "."
        self._sub = await self.bus.nc.subscribe(self._prefix + "*", cb=self._on_ack)
        self._task = asyncio.create_task(self._confirm(), name="admission-outbox")

    async def send(self, subject: str, event: Event) -> None:
        """Publish ``event`` on the durable ``subject``; returns once it is on the wire (waits only
        while ``max_pending`` verdicts are unconfirmed)."""
        self.bus.spec(subject)  # an unknown subject fails here, in the caller
        while len(self._unconfirmed) >= self.max_pending:
            self._room.clear()
            await self._room.wait()
        self._seq += 1
        seq = self._seq
        self._unconfirmed[seq] = (subject, event, time.monotonic())
        self._idle.clear()
        self.sent += 1
        self.bus.stats.published += 1
        try:
            await self.bus.nc.publish(
                self.bus.wire(subject), encode(event), reply=self._prefix + str(seq),
                headers={MSG_ID_HEADER: str(event.event_id)},
            )  # fmt: skip
        except nats.errors.Error as exc:
            # Not on the wire (disconnected, buffer full): the confirm task publishes it again.
            log.warning("verdict %s not sent (%r); publishing it again", event.event_id, exc)
            self._fail(seq)

    async def _on_ack(self, msg: Msg) -> None:
        try:
            seq = int(msg.subject[len(self._prefix) :])
        except ValueError:
            return
        if seq not in self._unconfirmed:
            return  # answered already (a late ack of a verdict we republished)
        data = msg.data
        # An ack is {"stream":..,"seq":..[,"duplicate":true]}; an error carries "error", and "no
        # responders" (no stream for the subject) comes as an empty status message.
        if not data or b'"error"' in data:
            log.warning("JetStream refused verdict #%d: %s", seq, data[:200].decode(errors="replace") or "no stream")
            self._fail(seq)
            return
        del self._unconfirmed[seq]
        self.confirmed += 1
        self._settled()

    def _fail(self, seq: int) -> None:
        sent = self._unconfirmed.pop(seq, None)
        if sent is not None:
            self._failed.append(sent)
            self._wake.set()

    def _settled(self) -> None:
        if len(self._unconfirmed) < self.max_pending:
            self._room.set()
        if not self._unconfirmed and not self._failed and not self._retrying:
            self._idle.set()

    async def _confirm(self) -> None:
        interval = min(0.5, self.ack_timeout_s / 4)
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), interval)
            self._wake.clear()
            cutoff = time.monotonic() - self.ack_timeout_s
            late: list[int] = []
            for seq, (_, _, sent_at) in self._unconfirmed.items():
                if sent_at > cutoff:
                    break  # insertion order: every later verdict was sent later still
                late.append(seq)
            for seq in late:
                subject, event, _ = self._unconfirmed.pop(seq)
                log.warning("no ack for %s %s within %.1f s; publishing it again", subject, event.event_id,
                            self.ack_timeout_s)  # fmt: skip
                self._failed.append((subject, event, 0.0))
            failed, self._failed = self._failed, []
            self._retrying = len(failed)
            for subject, event, _ in failed:
                await self._republish(subject, event)
                self.confirmed += 1
                self._retrying -= 1
            self._settled()

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
        await self._idle.wait()

    @property
    def in_flight(self) -> int:
        return len(self._unconfirmed) + len(self._failed) + self._retrying

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
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
            self._sub = None
