"""A durable JetStream pull consumer that acks only after its handler has committed.

Delivery is at-least-once: a message is acked after the handler returns, so a crash (or a lost
connection) before that redelivers it, and handlers make redelivery harmless by recording applied
event ids in the same transaction as their effect. What can never succeed is not retried forever:

* a message that does not decode (malformed, wrong schema version) is dead-lettered at once and
  terminated;
* a message whose handler keeps failing is retried with back-off and dead-lettered on its last
  allowed delivery.

The fetch loop survives disconnects and broker restarts: errors are logged and the loop waits and
fetches again; the durable consumer itself lives on the server (file storage), so nothing is lost.

Pulling (``Puller``): the consumer sends JetStream's pull requests itself, each asking for up to
``batch`` messages within ``fetch_timeout_s``, with a reply subject on its own inbox, and hands the
handlers whatever has been delivered so far as soon as there is anything, while the same request
keeps delivering into the buffer. nats-py's ``PullSubscription.fetch`` returns only once a lingering
request's batch is full or has expired (up to ``fetch_timeout_s`` of added latency when traffic is
light) and waits for each message through ``next_msg``, which creates two tasks and a uuid per
message: under a burst of thousands of events a second, that alone was a tenth of a service's CPU.
A request is open until its ``batch`` messages came or the server ended it (status 404/408/409) or
its expiry passed; a new one is sent only when none is open and nothing is buffered, so at most
``batch`` messages are ever held un-acked in this process, as with ``fetch``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy

from schemas.base import Event
from schemas.codec import MalformedMessageError, decode
from services.runtime.logs import bind_ids, reset_ids

if TYPE_CHECKING:
    from services.runtime.bus import Bus

log = logging.getLogger("roundhouse.consumer")

E = TypeVar("E", bound=Event)
ConsumerHandler = Callable[[E], Awaitable[Awaitable[object] | None]]
"""Handles one event. Returning None means "done, ack it"; returning an awaitable (a pending commit)
lets the consumer run the next handlers first and ack this message once the awaitable resolved."""
MalformedHandler = Callable[[bytes, MalformedMessageError], Awaitable[None]]
"""Called with the raw payload and the reason before a malformed message is dead-lettered (e.g. so
admission can tell a submitter why its job spec was refused)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerOptions:
    batch: int = 256
    """Messages fetched per pull; handled one by one, in order."""
    fetch_timeout_s: float = 1.0
    ack_wait_s: float = 10.0
    """Redeliver a message whose handler has not finished (and acked) within this time: also how long
    what an instance fetched and never acked (it died, or was paused) waits before another gets it.
    Below the time ``max_deliver`` retries of a fact that waits for another take (about 22 s), so a
    fact whose prerequisite a dead instance held is not given up before it comes back."""
    max_deliver: int = 8
    """Deliveries before a failing message is dead-lettered."""
    retry_backoff_s: float = 0.2
    """First retry delay after a handler error; doubles per delivery, capped at 10 s."""
    stop_timeout_s: float = 10.0
    """How long stop() waits for the message in hand before cancelling its handler."""
    deliver_new_only: bool = False
    """Start at new messages only instead of the beginning of the stream (first creation only)."""


class Unapplicable(Exception):
    """Raised by a handler for a message that can never be applied (a fact about a job that never
    arrived): it is dead-lettered at once with this reason instead of being retried, so it holds no
    ack-pending slot and delays no other message."""


class RetryLater(Exception):
    """Raised by a handler for a message that cannot be applied *yet* (it depends on another that
    has not landed): retried with the usual back-off, logged at debug level (it is expected)."""


class PullError(RuntimeError):
    """The server ended a pull request with an error status (e.g. 409 Consumer Deleted)."""


class Puller:
    """JetStream pull requests for one durable consumer, answered on this consumer's own inbox.

    ``take`` works as nats-py's ``fetch`` does: a ``no_wait`` request first, which the server
    answers at once with what is stored (up to ``batch``); only if that was nothing, a lingering
    request that ends when ``batch`` messages came or ``expires_s`` passed. Delivered messages are
    buffered in arrival order (the server's delivery order); a status message (404 No Messages, 408
    Request Timeout, 409 ...) ends the request it answers, named by the last token of its subject
    (a status goes to the request's reply subject; a delivered message keeps its stream subject).
    A message of an earlier request that arrives late is buffered like any other: it was
    delivered, so it must be handled and acked.
    """

    _EXPIRY_MARGIN_S = 0.5
    """Past its ``expires`` plus this, a request without a closing status counts as ended (the
    status was lost in a reconnect)."""

    def __init__(self, nc: NatsClient, stream: str, durable: str, *, batch: int, expires_s: float) -> None:
        self.nc = nc
        self.next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self.batch = batch
        self.expires_s = expires_s
        self.buffer: deque[Msg] = deque()
        self._inbox = ""
        self._sub: Subscription | None = None
        self._request = 0
        """Number of the last request sent (the last token of its reply subject)."""
        self._open = False
        self._left = 0
        """Messages the open request may still deliver."""
        self._deadline = 0.0
        self._suffix = ".0"
        self._ended: asyncio.Future[None] | None = None
        self._error: str | None = None

    @property
    def is_open(self) -> bool:
        return self._open and time.monotonic() < self._deadline

    async def start(self) -> None:
        self._inbox = self.nc.new_inbox()
        self._sub = await self.nc.subscribe(self._inbox + ".*", cb=self._on_msg)

    async def stop(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    def _end(self) -> None:
        self._open = False
        ended = self._ended
        if ended is not None and not ended.done():
            ended.set_result(None)

    async def _on_msg(self, msg: Msg) -> None:
        headers = msg.headers
        status = headers.get("Status") if headers else None
        if status is None:
            # A delivered message keeps its stream subject, so it cannot say which request it
            # answers; it counts against the open one (a late one of an expired request may make
            # the next end early, which only costs another request).
            self.buffer.append(msg)
            if self._open:
                self._left -= 1
                if self._left <= 0:
                    self._end()
            return
        if status == "100" or not msg.subject.endswith(self._suffix):
            return  # heartbeat or flow control (we ask for neither), or the end of a request given up on
        if status not in ("404", "408"):
            # 409: consumer deleted, leadership change, too many waiting pulls, ...
            self._error = f"{status} {(headers or {}).get('Description', '')}".strip()
        self._end()

    async def _pull(self, *, no_wait: bool) -> None:
        """Send one request and wait until it ended (or its deadline passed)."""
        self._request += 1
        self._suffix = f".{self._request}"
        self._open = True
        self._left = self.batch
        request: dict[str, object] = {"batch": self.batch}
        if no_wait:
            request["no_wait"] = True  # answered at once: what is stored, then a 404/408 if short
        else:
            request["expires"] = int(self.expires_s * 1e9)
        self._deadline = time.monotonic() + self.expires_s + self._EXPIRY_MARGIN_S
        loop = asyncio.get_running_loop()
        ended = self._ended = loop.create_future()
        await self.nc.publish(self.next_subject, json.dumps(request).encode(), reply=self._inbox + self._suffix)
        await self._wait(ended)

    async def _wait(self, ended: asyncio.Future[None]) -> None:
        def expire() -> None:
            if not ended.done():
                ended.set_result(None)

        timer = asyncio.get_running_loop().call_later(max(0.0, self._deadline - time.monotonic()), expire)
        try:
            await ended
        finally:
            timer.cancel()
        if self._open and time.monotonic() >= self._deadline:
            self._open = False

    async def take(self, *, send: bool = True) -> list[Msg]:
        """The next batch: what is stored now, or else what a lingering request collects (possibly
        nothing). With ``send=False`` no new request is sent (stopping: only an open one is let run
        out). Raises ``PullError`` when the server ended a request with an error status, and nats-py's
        errors when a request cannot be sent (disconnected)."""
        if not self.buffer:
            if self.is_open and self._ended is not None:
                await self._wait(self._ended)
            elif send:
                await self._pull(no_wait=True)
                if not self.buffer and self._error is None:
                    await self._pull(no_wait=False)
            if self._error is not None:
                error, self._error = self._error, None
                raise PullError(error)
        msgs = list(self.buffer)
        self.buffer.clear()
        return msgs


class _Settled(Exception):
    """The message was already nak'ed, terminated or dead-lettered."""


@dataclass(slots=True)
class ConsumerStats:
    handled: int = 0
    failed: int = 0
    dead_lettered: int = 0
    fetch_errors: int = 0


class DurableConsumer(Generic[E]):
    def __init__(
        self,
        *,
        bus: Bus,
        subject: str,
        durable: str,
        handler: ConsumerHandler[E],
        options: ConsumerOptions,
        on_malformed: MalformedHandler | None = None,
    ) -> None:
        self.bus = bus
        self.subject = subject
        self.durable = durable
        self.handler = handler
        self.options = options
        self.on_malformed = on_malformed
        self.stats = ConsumerStats()
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._msg: Msg | None = None
        """The message whose handler runs now."""
        self._taken_at = 0.0
        """When the batch holding it was fetched (monotonic)."""
        self._info: tuple[float, ConsumerInfo] | None = None
        """The server's view of this consumer, and when it was asked (``handled_before``)."""

    async def start(self) -> None:
        config = ConsumerConfig(
            durable_name=self.durable,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.options.ack_wait_s,
            max_deliver=self.options.max_deliver,
            deliver_policy=DeliverPolicy.NEW if self.options.deliver_new_only else DeliverPolicy.ALL,
            filter_subject=self.bus.wire(self.subject),
        )
        # pull_subscribe creates (or finds) the durable consumer; messages are pulled by Puller.
        self._sub = await self.bus.js.pull_subscribe(
            self.bus.wire(self.subject), durable=self.durable, stream=self.bus.stream_name, config=config
        )
        self._puller = Puller(
            self.bus.nc, self.bus.stream_name, self.durable,
            batch=self.options.batch, expires_s=self.options.fetch_timeout_s,
        )  # fmt: skip
        await self._puller.start()
        self._task = asyncio.create_task(self._run(), name=f"consumer:{self.durable}")

    async def stop(self) -> None:
        """Finish the messages in hand (and ack them), then stop fetching. Unfetched work stays queued.

        The open pull request is let run out (at most ``fetch_timeout_s``), handling what it still
        delivers, so no message is left delivered but unacked until ``ack_wait`` redelivers it."""
        self._stopping.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout=self.options.stop_timeout_s)
            except TimeoutError:
                self._task.cancel()
            self._task = None
        # Delivered but not handled (the stop timed out): hand them back for redelivery now.
        for msg in self._puller.buffer:
            with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
                await msg.nak()
        self._puller.buffer.clear()
        await self._puller.stop()
        # An outstanding pull request would otherwise hold the connection's drain until it expires.
        with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
            await self._sub.unsubscribe()

    async def _run(self) -> None:
        backoff = 0.05
        puller = self._puller
        while not self._stopping.is_set() or puller.buffer or puller.is_open:
            try:
                msgs = await puller.take(send=not self._stopping.is_set())
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            except (PullError, nats.errors.Error, nats.js.errors.Error, OSError) as exc:
                if self._stopping.is_set():
                    return
                # Disconnected or the broker is restarting: wait and pull again; nothing is lost
                # because unacked messages stay on the server.
                self.stats.fetch_errors += 1
                log.warning("consumer %s: fetch failed: %r", self.durable, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.05
            if msgs:
                self._taken_at = time.monotonic()
                await self._handle_batch(msgs)

    async def _handle_batch(self, msgs: list[Msg]) -> None:
        """Run the handlers in delivery order; settle pipelined commits afterwards, in the same order.

        A handler that returns an awaitable (its *commit*, e.g. the store writer's future) lets the
        next handler run before that commit has landed, so one fetched batch becomes one transaction
        instead of one per message; the message is acked only once its commit resolved.
        """
        pending: list[tuple[Msg, str, Awaitable[object]]] = []
        for msg in msgs:
            subject = self.bus.unwire(msg.subject)
            try:
                commit = await self._handle(msg, subject)
            except _Settled:
                continue
            if commit is None:
                await self._acked(msg)
            else:
                pending.append((msg, subject, commit))
        for msg, subject, commit in pending:
            try:
                await commit
            except Exception as exc:
                await self._failed(msg, subject, exc)
                continue
            await self._acked(msg)

    async def _acked(self, msg: Msg) -> None:
        self.stats.handled += 1
        self.bus.stats.received += 1
        await self._settle(msg.ack())

    async def _handle(self, msg: Msg, subject: str) -> Awaitable[object] | None:
        try:
            event = decode(subject, msg.data)
        except MalformedMessageError as exc:
            self.bus._count_malformed(subject)
            log.warning("consumer %s: dead-lettering malformed message: %s", self.durable, exc)
            if self.on_malformed is not None:
                try:
                    await self.on_malformed(msg.data, exc)
                except Exception:
                    log.exception("consumer %s: on_malformed hook failed", self.durable)
            await self._dead_letter(msg, f"malformed: {exc}")
            raise _Settled from None
        self._msg = msg
        ids = bind_ids(event)
        try:
            return await self.handler(event)  # type: ignore[arg-type]  # decode checked the model
        except Unapplicable as exc:
            self.stats.failed += 1
            log.warning("consumer %s: dead-lettering %s: %s", self.durable, subject, exc)
            await self._dead_letter(msg, f"unapplicable: {exc}")
            raise _Settled from None
        except Exception as exc:
            await self._failed(msg, subject, exc)
            raise _Settled from None
        finally:
            reset_ids(ids)

    async def _failed(self, msg: Msg, subject: str, exc: Exception) -> None:
        """Retry later with back-off, or dead-letter on the last allowed delivery."""
        self.stats.failed += 1
        delivered = msg.metadata.num_delivered
        if delivered >= self.options.max_deliver:
            log.error("consumer %s: giving up on %s after %d deliveries: %r", self.durable, subject, delivered, exc)
            await self._dead_letter(msg, f"handler failed {delivered} times: {exc!r}")
        else:
            level = logging.DEBUG if isinstance(exc, RetryLater) else logging.WARNING
            log.log(level, "consumer %s: handler failed on %s (delivery %d): %r", self.durable, subject, delivered, exc)
            delay = min(self.options.retry_backoff_s * 2 ** (delivered - 1), 10.0)
            await self._settle(msg.nak(delay=delay))

    async def _dead_letter(self, msg: Msg, reason: str) -> None:
        if not await self.bus.dead_letter(self.durable, msg, reason):
            # Its copy could not be stored (the stream is electing a leader): hand it back rather
            # than terminate it with no trace; it is judged again on its next delivery.
            await self._settle(msg.nak(delay=1.0))
            return
        self.stats.dead_lettered += 1
        await self._settle(msg.term())

    async def _settle(self, action: Awaitable[None]) -> None:
        try:
            await action
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            # The ack was lost: the message will be redelivered and the handler's idempotency
            # makes that harmless.
            log.warning("consumer %s: ack failed: %r", self.durable, exc)

    def current(self) -> tuple[int, float]:
        """The stream sequence of the message whose handler runs now, and when its batch was fetched
        (monotonic); call from the handler."""
        if self._msg is None:
            raise RuntimeError(f"consumer {self.durable}: no message is being handled")
        return int(self._msg.metadata.sequence.stream), self._taken_at

    async def handled_before(self, seq: int, *, since: float) -> bool:
        """Whether every message of this consumer stored before stream sequence ``seq`` has been
        handled (acked or dead-lettered), by this instance or by any before it; False when that
        cannot be told now. ``since``: a monotonic time after message ``seq`` was stored.

        From the server's view, not from this instance's pulls: a message delivered to an instance
        that died or was paused holding it is neither stored-undelivered nor handled; it comes back
        only after ``ack_wait``. So the ack floor must have reached ``seq - 1``, or nothing may be
        left to deliver before ``seq`` with nothing delivered unacked. The view is asked once per
        fetched batch of the caller (``since``) at most, so a flood of such checks costs little."""
        info = await self._consumer_info(since)
        if info is None:
            return False
        floor = (info.ack_floor.stream_seq if info.ack_floor is not None else 0) or 0
        if floor >= seq - 1:
            return True
        delivered = (info.delivered.stream_seq if info.delivered is not None else 0) or 0
        undelivered_before = bool(info.num_pending) and delivered < seq - 1
        return not undelivered_before and not info.num_ack_pending

    async def _consumer_info(self, since: float) -> ConsumerInfo | None:
        if self._info is not None and self._info[0] >= since:
            return self._info[1]
        asked = time.monotonic()
        try:
            info = await self._sub.consumer_info()
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
            log.info("consumer %s: no consumer info now: %r", self.durable, exc)
            return None
        self._info = (asked, info)
        return info

    async def pending(self) -> int:
        """Messages not yet delivered plus delivered but unacked (from the server's view)."""
        info = await self._sub.consumer_info()
        return int(info.num_pending or 0) + int(info.num_ack_pending or 0)
