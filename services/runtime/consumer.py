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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from schemas.base import Event
from schemas.codec import MalformedMessageError, decode

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
    ack_wait_s: float = 30.0
    """Redeliver a message whose handler has not finished (and acked) within this time."""
    max_deliver: int = 8
    """Deliveries before a failing message is dead-lettered."""
    retry_backoff_s: float = 0.2
    """First retry delay after a handler error; doubles per delivery, capped at 10 s."""
    stop_timeout_s: float = 10.0
    """How long stop() waits for the message in hand before cancelling its handler."""
    deliver_new_only: bool = False
    """Start at new messages only instead of the beginning of the stream (first creation only)."""


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

    async def start(self) -> None:
        config = ConsumerConfig(
            durable_name=self.durable,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.options.ack_wait_s,
            max_deliver=self.options.max_deliver,
            deliver_policy=DeliverPolicy.NEW if self.options.deliver_new_only else DeliverPolicy.ALL,
            filter_subject=self.bus.wire(self.subject),
        )
        self._sub = await self.bus.js.pull_subscribe(
            self.bus.wire(self.subject), durable=self.durable, stream=self.bus.stream_name, config=config
        )
        self._task = asyncio.create_task(self._run(), name=f"consumer:{self.durable}")

    async def stop(self) -> None:
        """Finish the message in hand (and ack it), then stop fetching. Unfetched work stays queued."""
        self._stopping.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout=self.options.stop_timeout_s)
            except TimeoutError:
                self._task.cancel()
            self._task = None
        # An outstanding pull request would otherwise hold the connection's drain until it expires.
        with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
            await self._sub.unsubscribe()

    async def _run(self) -> None:
        backoff = 0.05
        while not self._stopping.is_set():
            try:
                msgs = await self._sub.fetch(self.options.batch, timeout=self.options.fetch_timeout_s)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
                # Disconnected or the broker is restarting: wait and pull again; nothing is lost
                # because unacked messages stay on the server.
                self.stats.fetch_errors += 1
                log.warning("consumer %s: fetch failed: %r", self.durable, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.05
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
        try:
            return await self.handler(event)  # type: ignore[arg-type]  # decode checked the model
        except Exception as exc:
            await self._failed(msg, subject, exc)
            raise _Settled from None

    async def _failed(self, msg: Msg, subject: str, exc: Exception) -> None:
        """Retry later with back-off, or dead-letter on the last allowed delivery."""
        self.stats.failed += 1
        delivered = msg.metadata.num_delivered
        if delivered >= self.options.max_deliver:
            log.error("consumer %s: giving up on %s after %d deliveries: %r", self.durable, subject, delivered, exc)
            await self._dead_letter(msg, f"handler failed {delivered} times: {exc!r}")
        else:
            log.warning("consumer %s: handler failed on %s (delivery %d): %r", self.durable, subject, delivered, exc)
            delay = min(self.options.retry_backoff_s * 2 ** (delivered - 1), 10.0)
            await self._settle(msg.nak(delay=delay))

    async def _dead_letter(self, msg: Msg, reason: str) -> None:
        await self.bus.dead_letter(self.durable, msg, reason)
        self.stats.dead_lettered += 1
        await self._settle(msg.term())

    async def _settle(self, action: Awaitable[None]) -> None:
        try:
            await action
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            # The ack was lost: the message will be redelivered and the handler's idempotency
            # makes that harmless.
            log.warning("consumer %s: ack failed: %r", self.durable, exc)

    async def pending(self) -> int:
        """Messages not yet delivered plus delivered but unacked (from the server's view)."""
        info = await self._sub.consumer_info()
        return int(info.num_pending or 0) + int(info.num_ack_pending or 0)
