"""Rebuild an in-memory view from the lifecycle stream, then keep it current.

Admission and placement keep their views (admitted demand, cluster inventory, allocations) in
memory and rebuild them after a restart from the facts stored on JetStream (docs/control-plane.md,
Processes). Two steps, with no gap and no overlap between them:

* :func:`replay` reads every stored message on the given subjects, oldest first, up to the
  stream's last sequence at the time of the call, and returns that sequence;
* :class:`StreamFollower` then reads from the next sequence on, in a background task, for as long
  as the service runs.

Both use an *ephemeral* pull consumer that acknowledges nothing (``AckPolicy.NONE``): each replica
of a service reads the whole stream for itself and leaves no state on the server, unlike a durable
consumer, whose messages a group of replicas would share. The follower tracks the last sequence it
handled and re-creates its consumer from the one after it whenever the connection comes back or a
fetch fails (an ephemeral consumer need not survive a broker restart), so nothing is skipped or
delivered twice. Malformed messages are counted and skipped: the durable consumer that owns them
dead-letters them (``consumer.py``); a view only needs the valid facts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from schemas.base import Event
from schemas.codec import MalformedMessageError, decode
from schemas.subjects import UnknownSubjectError
from services.runtime.bus import Bus
from services.runtime.consumer import Puller, PullError

log = logging.getLogger("roundhouse.replay")

EventHandler = Callable[[Event], Awaitable[None]]
"""Called once per valid message, in stream order; the event's type tells its subject."""

_INACTIVE_S = 60.0
"""The server removes a reader's consumer this long after its last fetch (e.g. after a crash)."""


@dataclass(slots=True)
class ReaderStats:
    handled: int = 0
    malformed: int = 0
    handler_errors: int = 0
    fetch_errors: int = 0
    restarts: int = 0
    last_seq: int = 0
    """Stream sequence of the last message read (handled or skipped)."""


def stream_seq(msg: Msg) -> int:
    """The stream sequence of a delivered JetStream message, read off its ack subject.

    ``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ts>.<pending>``, or the
    newer form with domain and account hash in front (12 tokens or more). ``Msg.metadata`` parses
    every field into dataclasses on each access: a tenth of a view's CPU when it follows every
    arrival. Anything else falls back to it.
    """
    reply = msg.reply
    tokens = reply.split(".")
    if tokens[0] == "$JS" and tokens[1] == "ACK":
        if len(tokens) == 9:
            return int(tokens[5])
        if len(tokens) >= 12:
            return int(tokens[7])
    return int(msg.metadata.sequence.stream)


class _Reader:
    """One ephemeral pull consumer over ``subjects`` from a start sequence."""

    def __init__(self, bus: Bus, subjects: Sequence[str], handler: EventHandler, stats: ReaderStats, *,
                 batch: int, fetch_timeout_s: float) -> None:  # fmt: skip
        if not subjects:
            raise ValueError("a stream reader needs at least one subject")
        self.bus = bus
        self.subjects = [bus.wire(s) for s in subjects]
        self.handler = handler
        self.stats = stats
        self.batch = batch
        self.fetch_timeout_s = fetch_timeout_s
        self._sub: nats.js.JetStreamContext.PullSubscription | None = None
        self._puller: Puller | None = None

    async def open(self, start_seq: int) -> None:
        """(Re)create the consumer so that its first message is ``start_seq`` (>= 1)."""
        await self.close()
        config = ConsumerConfig(
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=max(1, start_seq),
            filter_subjects=list(self.subjects),
            inactive_threshold=_INACTIVE_S,
            mem_storage=True,
        )
        self._sub = await self.bus.js.pull_subscribe(self.subjects[0], stream=self.bus.stream_name, config=config)
        # Pulled with the durable consumers' own requests (consumer.py): nats-py's fetch costs two
        # tasks and a uuid per message, and a view follows every job's arrival.
        name = (await self._sub.consumer_info()).name
        self._puller = Puller(self.bus.nc, self.bus.stream_name, name, batch=self.batch,
                               expires_s=self.fetch_timeout_s)  # fmt: skip
        await self._puller.start()

    async def close(self) -> None:
        puller, self._puller = self._puller, None
        if puller is not None:
            await puller.stop()
        sub, self._sub = self._sub, None
        if sub is None:
            return
        with contextlib.suppress(nats.errors.Error, nats.js.errors.Error, TimeoutError):
            info = await sub.consumer_info()
            await self.bus.js.delete_consumer(self.bus.stream_name, info.name)
        with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
            await sub.unsubscribe()

    async def fetch(self) -> list[Msg]:
        """The next batch (possibly empty after ``fetch_timeout_s``)."""
        assert self._puller is not None, "open() first"
        try:
            return await self._puller.take()
        except PullError as exc:
            # The ephemeral consumer is gone (inactive too long, broker restarted): re-open.
            raise nats.js.errors.NotFoundError(description=str(exc)) from exc

    async def pending(self) -> int:
        assert self._sub is not None, "open() first"
        info = await self._sub.consumer_info()
        return int(info.num_pending or 0)

    async def handle(self, msg: Msg, seq: int) -> None:
        """Decode and hand over one message; ``seq`` is its stream sequence (parsed once by the caller:
        ``Msg.metadata`` re-parses the reply subject on every access)."""
        self.stats.last_seq = seq
        subject = self.bus.unwire(msg.subject)
        try:
            event = decode(subject, msg.data)
        except (MalformedMessageError, UnknownSubjectError) as exc:
            self.stats.malformed += 1
            log.debug("replay skipped a malformed message on %s: %s", subject, exc)
            return
        try:
            await self.handler(event)
        except Exception:
            # A view must not stop following the stream because one fact could not be applied.
            self.stats.handler_errors += 1
            log.exception("stream reader: handler failed on %s (seq %d)", subject, self.stats.last_seq)
            return
        self.stats.handled += 1


async def replay(bus: Bus, subjects: Sequence[str], handler: EventHandler, *, batch: int = 2048,
                 fetch_timeout_s: float = 0.5, stats: ReaderStats | None = None) -> int:  # fmt: skip
    """Hand every stored message on ``subjects`` to ``handler``, oldest first; return the sequence
    read up to (the stream's last sequence when called). Follow on with
    ``StreamFollower(..., start_seq=returned + 1)``."""
    stats = stats if stats is not None else ReaderStats()
    info = await bus.js.stream_info(bus.stream_name)
    target = int(info.state.last_seq or 0)
    if target == 0:
        return 0
    reader = _Reader(bus, subjects, handler, stats, batch=batch, fetch_timeout_s=fetch_timeout_s)
    await reader.open(1)
    try:
        while True:
            msgs = await reader.fetch()
            if not msgs:
                if await reader.pending() == 0:
                    return target  # nothing left that matches
                continue
            for msg in msgs:
                meta = msg.metadata
                seq = meta.sequence.stream
                if seq > target:
                    return target  # the follower starts there
                await reader.handle(msg, seq)
                if seq == target or meta.num_pending == 0:
                    return target
    finally:
        await reader.close()


class StreamFollower:
    """Reads ``subjects`` from ``start_seq`` on, for as long as it runs (see the module doc)."""

    def __init__(self, bus: Bus, subjects: Sequence[str], handler: EventHandler, *, start_seq: int,
                 batch: int = 1024, fetch_timeout_s: float = 1.0, name: str = "follower") -> None:  # fmt: skip
        self.stats = ReaderStats(last_seq=max(0, start_seq - 1))
        self._reader = _Reader(bus, subjects, handler, self.stats, batch=batch, fetch_timeout_s=fetch_timeout_s)
        self._bus = bus
        self._name = name
        self._reopen = False
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        await self._reader.open(self.stats.last_seq + 1)
        self._bus.on_reconnect(self._on_reconnect)
        self._task = asyncio.create_task(self._run(), name=f"follow:{self._name}")

    async def _on_reconnect(self) -> None:
        self._reopen = True

    async def _run(self) -> None:
        backoff = 0.05
        while not self._stopping.is_set():
            try:
                if self._reopen:
                    self._reopen = False
                    await self._reader.open(self.stats.last_seq + 1)
                    self.stats.restarts += 1
                msgs = await self._reader.fetch()
            except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
                self.stats.fetch_errors += 1
                log.warning("%s: fetch failed, re-creating its consumer: %r", self._name, exc)
                self._reopen = True
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.05
            for msg in msgs:
                seq = stream_seq(msg)
                if seq <= self.stats.last_seq:
                    continue  # already handled before a re-open
                await self._reader.handle(msg, seq)

    async def stop(self) -> None:
        """Stop at once (a view has nothing to finish or acknowledge) and delete the consumer."""
        self._stopping.set()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._reader.close()
