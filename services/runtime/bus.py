"""A thin typed layer over nats-py: every subject has one model, and every message is validated.

* ``publish`` encodes a schema model; lifecycle subjects (``SubjectSpec.durable``) go to JetStream
  with ``Nats-Msg-Id = event_id``, so a publish retried after a timeout (which may still have been
  stored) is stored once.
* ``subscribe`` decodes and validates before the handler runs; a malformed message is logged with its
  reason, counted and dropped, and the subscription keeps going.
* ``request`` / ``serve`` do typed request-reply; a handler's failure travels back as an error header,
  so the caller gets a clear :class:`RemoteError` instead of a time-out, and a subject nobody serves
  raises :class:`NoResponderError` at once.
* ``consume`` runs a durable pull consumer that acks only after the handler returned (the handler
  commits its own state first) and dead-letters what can never be processed (see ``consumer.py``).
* ``kv`` opens a bucket with compare-and-set and watchers that survive a broker restart (``kv.py``).

An optional ``namespace`` prefixes every subject, stream and bucket, so several Roundhouse clusters
(or several tests) can share one NATS deployment without seeing each other's traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import ssl
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

from schemas.base import Event, WireModel
from schemas.codec import MalformedMessageError, decode, decode_as, decoder_for, encode
from schemas.roles import inbox_prefix
from schemas.subjects import SubjectSpec, durable_patterns, spec_for, subject_for
from services.runtime.auth.creds import Credentials, read_creds
from services.runtime.consumer import ConsumerHandler, ConsumerOptions, DurableConsumer, MalformedHandler
from services.runtime.kv import KVBucket
from services.runtime.logs import bind_ids, reset_ids

log = logging.getLogger("roundhouse.bus")

E = TypeVar("E", bound=Event)
R = TypeVar("R", bound=WireModel)
Handler = Callable[[E], Awaitable[None]]
ReplyHandler = Callable[[E], Awaitable[R]]

MSG_ID_HEADER = "Nats-Msg-Id"
ERROR_HEADER = "Roundhouse-Error"
DEAD_LETTER_PREFIX = "deadletter"
_NAMESPACE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


class BusError(RuntimeError):
    """Base of the bus's own errors."""


class WrongModelError(BusError, TypeError):
    """A model was published on, or expected from, a subject that carries another model."""


class PublishError(BusError):
    """A durable publish was not acknowledged by JetStream after every retry."""


class RemoteError(BusError):
    """The replying side of a request failed; the message is its reason."""


class NoResponderError(BusError):
    """Nothing serves the subject of a request (the broker said so at once, with no time-out)."""


def identity_settings(servers: str | list[str], credentials: Credentials | None) -> dict[str, Any]:
    """nats-py options that make a connection ``credentials``' (its nkey and its own reply inbox) and
    speak TLS first to ``tls://`` URLs: every Roundhouse connection, the bus's and a raw one alike."""
    settings = tls_settings(servers)
    if credentials is not None:
        settings["nkeys_seed_str"] = credentials.seed
        settings["inbox_prefix"] = inbox_prefix(credentials.role, credentials.identity)
    return settings


class TlsHandshakeError(BusError, ConnectionError):
    """A ``tls://`` broker did not complete the TLS handshake (it speaks clear text, or its certificate
    is not trusted): retrying cannot help, and falling back to clear text is what must never happen."""


class AuthenticationError(BusError, ConnectionError):
    """The broker refused this connection's credentials (none given to a secured broker, or unknown ones).

    Not a connection loss: retrying with the same credentials cannot succeed, so connecting fails at
    once instead of retrying forever."""


_AUTH_VIOLATION = "authorization violation"
_PERMISSIONS_VIOLATION = "permissions violation"


@dataclass(slots=True)
class BusStats:
    published: int = 0
    received: int = 0
    malformed: int = 0
    handler_errors: int = 0
    publish_retries: int = 0
    reconnects: int = 0
    by_subject_malformed: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "published": self.published,
            "received": self.received,
            "malformed": self.malformed,
            "handler_errors": self.handler_errors,
            "publish_retries": self.publish_retries,
            "reconnects": self.reconnects,
            "malformed_by_subject": dict(self.by_subject_malformed),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class BusOptions:
    namespace: str = ""
    """Prefix for subjects, streams and buckets ('' = none)."""
    publish_timeout_s: float = 2.0
    publish_attempts: int = 5
    """Durable publishes are tried at least this often (same Nats-Msg-Id, so never stored twice)..."""
    publish_retry_s: float = 15.0
    """...and for at least this long: a replicated stream whose leader's server died has no leader
    for the 4-9 s the others take to elect one (its subjects answer "no responders" at once
    meanwhile). Must stay well within ``duplicate_window_s``."""
    stream_max_age_s: float = 7 * 24 * 3600
    duplicate_window_s: float = 120.0
    """JetStream keeps message ids this long for dedup; retries must land within it."""
    stream_replicas: int = 1
    """Replicas of the stream and of every KV bucket this bus creates (R3 in a 3-server cluster). Only
    a new stream or bucket gets them: provisioning never shrinks or re-places an existing one."""
    reconnect_wait_s: float = 0.25
    max_reconnect_attempts: int = -1
    """Tries per server, the first connection included; -1: forever (services wait for their broker).
    A command-line client gives up instead, so a command against a stopped cluster fails fast."""
    connect_timeout_s: float = 2.0


def _who(identity: Credentials | None) -> str:
    return f"{identity.role.value} {identity.identity}" if identity is not None else "this connection (no credentials)"


def _refusal(identity: Credentials | None, reason: str) -> str:
    if identity is None:
        return (
            f"this NATS requires credentials ({reason.strip()}): pass --creds FILE or set ROUNDHOUSE_CREDS "
            "(`roundhouse up` writes them under <state>/auth/)"
        )
    return (
        f"the NATS server refused the credentials of {_who(identity)} ({reason.strip()}): the key is not in its "
        "configuration (regenerate it with `roundhouse auth server-config` and reload the server), or they belong "
        "to another cluster"
    )


_TLS_FAILED: Final = "tls: "
TLS_CA_ENV: Final = "ROUNDHOUSE_TLS_CA"
"""A CA file to verify the brokers' certificates with (instead of the system's trust store)."""


def tls_settings(servers: str | list[str]) -> dict[str, Any]:
    """nats-py options for ``tls://`` URLs: TLS before anything else is said, verified certificates.

    nats-py on its own reads the server's INFO in clear text and goes on in clear text when that INFO
    does not ask for TLS: a man in the middle posing as the broker without TLS could then relay the
    real broker's nonce and log in with the client's signature. Starting with the TLS handshake
    (``tls_handshake_first``; the deploy configurations accept it with ``handshake_first``) means a
    ``tls://`` URL is never spoken to in clear text. All URLs of one cluster must agree."""
    urls = [servers] if isinstance(servers, str) else list(servers)
    schemes = {url.split("://", 1)[0].lower() if "://" in url else "nats" for url in urls}
    if "tls" not in schemes:
        return {}
    if schemes != {"tls"}:
        raise ValueError(f"mixed tls:// and plain URLs ({', '.join(urls)}): a cluster is reached with TLS or without")
    context = ssl.create_default_context(cafile=os.environ.get(TLS_CA_ENV) or None)
    return {"tls": context, "tls_handshake_first": True}


class Bus:
    """Typed publish/subscribe, request-reply, durable consumers and KV over one NATS connection."""

    def __init__(self, nc: NatsClient, options: BusOptions) -> None:
        if options.namespace and not _NAMESPACE.match(options.namespace):
            raise ValueError(f"namespace {options.namespace!r} must match {_NAMESPACE.pattern}")
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream(timeout=options.publish_timeout_s)
        self.options = options
        self.stats = BusStats()
        self._prefix = f"{options.namespace}." if options.namespace else ""
        self._prefix_tokens = 1 if options.namespace else 0
        self._spec_cache: dict[str, SubjectSpec] = {}
        self._consumers: list[DurableConsumer[Any]] = []
        self._buckets: list[KVBucket] = []
        self._reconnect_listeners: list[Callable[[], Awaitable[None]]] = []
        self._closing = False
        self.credentials: Credentials | None = None
        """Who this connection authenticated as (set by :meth:`connect`)."""

    # --- connection -------------------------------------------------------------------------
    @classmethod
    async def connect(
        cls,
        servers: str | list[str],
        *,
        name: str = "roundhouse",
        options: BusOptions | None = None,
        provision: bool = True,
        creds: Path | Credentials | None = None,
    ) -> Bus:
        """Connect (reconnecting on loss, forever unless ``options`` says otherwise) and, unless told
        not to, provision the stream.

        With ``creds`` (a credentials file or what one holds) the connection authenticates as that
        identity with its nkey, and its reply inbox is the identity's own (``_INBOX.<role>.<name>``,
        the only one its permissions let it read). A broker that refuses the credentials (or wants
        some and got none) raises :class:`AuthenticationError` at once; a bad file raises
        :class:`~services.runtime.auth.creds.CredentialsError`."""
        options = options or BusOptions()
        identity = read_creds(creds) if isinstance(creds, Path) else creds
        holder: list[Bus] = []
        refused: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def on_disconnected() -> None:
            if not (holder and holder[0]._closing):
                log.warning("bus disconnected", extra={"service": name})

        async def on_reconnected() -> None:
            if holder:
                await holder[0]._on_reconnected()

        async def on_error(exc: Exception) -> None:
            text = str(exc)
            lowered = text.lower()
            if isinstance(exc, ssl.SSLError) and not holder:
                if not refused.done():
                    refused.set_result(_TLS_FAILED + text)
                return
            if _AUTH_VIOLATION in lowered or isinstance(exc, nats.errors.AuthorizationError):
                if not holder:  # connecting: AuthenticationError says it
                    if not refused.done():
                        refused.set_result(text)
                    return
                # Reconnecting to a server that no longer knows this key (retried, as a loss is).
                log.error("bus: the broker refused %s: %s", _who(identity), text, extra={"service": name})
            elif _PERMISSIONS_VIOLATION in lowered:
                # The broker denied one publish or subscription and keeps the connection: the publish
                # is dropped and the subscription gets nothing, so this log line is the only trace.
                log.error("bus: permission denied to %s: %s", _who(identity), text, extra={"service": name})
            else:
                log.warning("bus error: %s", exc, extra={"service": name})

        settings: dict[str, Any] = {
            "name": name,
            "allow_reconnect": True,
            "max_reconnect_attempts": options.max_reconnect_attempts,
            "reconnect_time_wait": options.reconnect_wait_s,
            "connect_timeout": options.connect_timeout_s,
            "disconnected_cb": on_disconnected,
            "reconnected_cb": on_reconnected,
            "error_cb": on_error,
        }
        settings.update(identity_settings(servers, identity))
        nc = NatsClient()
        connecting: asyncio.Future[Any] = asyncio.ensure_future(nc.connect(servers, **settings))
        # nats-py retries a refused first connection like an unreachable server (forever, for a
        # service): an authorization violation ends the attempt instead.
        await asyncio.wait([connecting, refused], return_when=asyncio.FIRST_COMPLETED)
        connected = connecting.done() and not connecting.cancelled() and connecting.exception() is None
        if refused.done() and not connected:
            # Also when the attempts ran out meanwhile: "refused" says more than "no servers".
            connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError, nats.errors.Error, OSError):
                await connecting
            await nc.close()
            reason = refused.result()
            if reason.startswith(_TLS_FAILED):
                raise TlsHandshakeError(
                    f"no TLS handshake with {servers}: {reason.removeprefix(_TLS_FAILED)} (does the server have "
                    f"TLS on, and is its CA trusted? set {TLS_CA_ENV} to the CA file)"
                )
            raise AuthenticationError(_refusal(identity, reason))
        refused.cancel()
        connecting.result()  # NoServersError and the like, as before
        bus = cls(nc, options)
        bus.credentials = identity
        holder.append(bus)
        if provision:
            await bus.provision()
        return bus

    async def close(self) -> None:
        """Stop consumers and watchers, flush what was published, close the connection."""
        self._closing = True
        for consumer in self._consumers:
            await consumer.stop()
        for bucket in self._buckets:
            await bucket.stop_watchers()
        if not self.nc.is_closed:
            try:
                await self.nc.drain()
            except (nats.errors.ConnectionClosedError, nats.errors.FlushTimeoutError, TimeoutError):
                await self.nc.close()

    def on_reconnect(self, listener: Callable[[], Awaitable[None]]) -> None:
        self._reconnect_listeners.append(listener)

    async def _on_reconnected(self) -> None:
        self.stats.reconnects += 1
        log.info("bus reconnected to %s", self.nc.connected_url)
        for listener in list(self._reconnect_listeners):
            try:
                await listener()
            except Exception:
                log.exception("reconnect listener failed")

    @property
    def identity(self) -> str | None:
        """The name the broker authenticated this connection as (None: no credentials)."""
        return self.credentials.identity if self.credentials is not None else None

    # --- naming ------------------------------------------------------------------------------
    def wire(self, subject: str) -> str:
        """The subject as it travels (with the namespace prefix)."""
        return self._prefix + subject

    def unwire(self, wire_subject: str) -> str:
        return wire_subject[len(self._prefix) :] if self._prefix else wire_subject

    def name(self, base: str) -> str:
        """A stream, consumer or bucket name in this namespace (NATS names allow [A-Za-z0-9_-])."""
        return f"{self.options.namespace}_{base}" if self.options.namespace else base

    @property
    def stream_name(self) -> str:
        return self.name("RH_EVENTS")

    def spec(self, subject: str) -> SubjectSpec:
        cached = self._spec_cache.get(subject)
        if cached is None:
            cached = self._spec_cache[subject] = spec_for(subject)
        return cached

    def _check_model(self, subject: str, model: type[WireModel]) -> SubjectSpec:
        spec = self.spec(subject)
        if not issubclass(model, spec.model):
            raise WrongModelError(f"subject {subject!r} carries {spec.model.__name__}, not {model.__name__}")
        return spec

    # --- JetStream provisioning -----------------------------------------------------------
    async def provision(self) -> None:
        """Create the lifecycle stream, or bring an existing one up to this code's subjects.

        Idempotent, and never destructive: an existing stream keeps its replicas (raised to
        ``stream_replicas`` if it has fewer, never lowered), its placement and whatever an operator
        set (retention, limits); only missing subjects are added. Services call this at start;
        commands never do (``Bus.connect(provision=False)``)."""
        subjects = [self.wire(p) for p in durable_patterns()]
        subjects.append(self.wire(f"{DEAD_LETTER_PREFIX}.>"))
        try:
            info = await self.js.stream_info(self.stream_name)
        except nats.js.errors.NotFoundError:
            info = None
        if info is not None:
            existing = info.config
            have = list(existing.subjects or [])
            missing = [s for s in subjects if s not in have]
            replicas = max(existing.num_replicas or 1, self.options.stream_replicas)
            if missing or replicas != (existing.num_replicas or 1):
                log.info("stream %s: adding subjects %s, replicas %s -> %s", self.stream_name, missing,
                         existing.num_replicas, replicas)  # fmt: skip
                await self.js.update_stream(replace(existing, subjects=have + missing, num_replicas=replicas))
            return
        config = StreamConfig(
            name=self.stream_name,
            subjects=subjects,
            storage=StorageType.FILE,
            retention=RetentionPolicy.LIMITS,
            discard=DiscardPolicy.OLD,
            max_age=self.options.stream_max_age_s,
            duplicate_window=self.options.duplicate_window_s,
            num_replicas=self.options.stream_replicas,
        )
        try:
            await self.js.add_stream(config)
        except nats.js.errors.APIError as exc:
            # Another service may have created it between our look-up and our add: take it as it is.
            try:
                await self.js.stream_info(self.stream_name)
            except nats.js.errors.NotFoundError:
                raise PublishError(
                    f"cannot create stream {self.stream_name} with {self.options.stream_replicas} replica(s): "
                    f"{exc.description}"
                ) from None
            await self.provision()

    # --- publish ----------------------------------------------------------------------------
    @staticmethod
    def _concrete(subject: str, spec: SubjectSpec, event: Event) -> str:
        # Publishing on a pattern (``job.started.*``) means "on this event's own subject": the token
        # comes from the payload, so a caller cannot put one node's fact on another node's subject.
        if subject == spec.pattern and spec.token_field is not None:
            return subject_for(event)
        return subject

    async def publish(self, subject: str, event: Event) -> None:
        """Publish ``event`` on ``subject``; durable subjects wait for JetStream's ack.

        ``subject`` may be a pattern with an identity token (``job.started.*``): the token is then
        filled from the payload (:func:`~schemas.subjects.subject_for`)."""
        spec = self._check_model(subject, type(event))
        subject = self._concrete(subject, spec, event)
        data = encode(event)
        if spec.durable:
            await self._publish_durable(subject, data, str(event.event_id))
        else:
            await self.nc.publish(self.wire(subject), data)
        self.stats.published += 1

    async def _publish_durable(
        self, subject: str, data: bytes, msg_id: str, *, extra_headers: dict[str, str] | None = None
    ) -> None:
        headers = {**(extra_headers or {}), MSG_ID_HEADER: msg_id}
        loop = asyncio.get_running_loop()
        began = loop.time()
        delay = 0.05
        attempt = 0
        stream_checked = False
        while True:
            attempt += 1
            try:
                await self.js.publish(self.wire(subject), data, headers=headers)
                return
            except (nats.errors.TimeoutError, nats.js.errors.NoStreamResponseError,
                    nats.errors.ConnectionReconnectingError, nats.errors.OutboundBufferLimitError,
                    nats.js.errors.ServiceUnavailableError) as exc:  # fmt: skip
                # The ack may have been lost while the message was stored: the retry carries the
                # same Nats-Msg-Id, so JetStream drops it as a duplicate instead of storing it twice.
                self.stats.publish_retries += 1
                if isinstance(exc, nats.js.errors.NoStreamResponseError) and not stream_checked:
                    # No stream to wait for (never provisioned) fails at once; a stream electing a
                    # new leader answers the same "no responders" for seconds, so that is waited out.
                    stream_checked = True
                    if not await self._stream_exists():
                        raise PublishError(
                            f"no stream takes {subject}: {self.stream_name} does not exist (the services create "
                            "it when they start)"
                        ) from None
                elapsed = loop.time() - began
                if attempt >= self.options.publish_attempts and elapsed + delay >= self.options.publish_retry_s:
                    raise PublishError(
                        f"no JetStream ack for {subject} after {attempt} attempts in {elapsed:.1f} s: {exc!r}"
                    ) from None
                log.warning("durable publish on %s failed (attempt %d): %r", subject, attempt, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _stream_exists(self) -> bool:
        """False only when JetStream says the stream does not exist (any other answer: it may)."""
        try:
            await self.js.stream_info(self.stream_name)
        except nats.js.errors.NotFoundError:
            return False
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError):
            pass  # no meta leader either, or disconnected: keep trying the publish
        return True

    async def publish_many(self, subject: str, events: Sequence[Event]) -> None:
        """Publish a batch, pipelining JetStream acks (much faster than one awaited ack at a time)."""
        spec = self._check_model(subject, type(events[0])) if events else None
        if spec is None:
            return
        # Each event on its own subject: a pattern's token comes from each payload (one batch of
        # submissions or facts may name several users or nodes).
        subjects = [self._concrete(subject, spec, event) for event in events]
        if not spec.durable:
            for concrete, event in zip(subjects, events, strict=True):
                await self.nc.publish(self.wire(concrete), encode(event))
            self.stats.published += len(events)
            return
        futures = [
            (
                concrete,
                event,
                await self.js.publish_async(
                    self.wire(concrete), encode(event), headers={MSG_ID_HEADER: str(event.event_id)}
                ),
            )
            for concrete, event in zip(subjects, events, strict=True)
        ]
        # One wait for the whole batch (a wait_for per ack would wrap each future in a task), then
        # every ack that failed or is still missing is retried one by one, with the same id.
        await asyncio.wait([future for _, _, future in futures], timeout=self.options.publish_timeout_s)
        for concrete, event, future in futures:
            if not future.done():
                future.cancel()
            elif not future.cancelled() and future.exception() is None:
                continue
            await self._publish_durable(concrete, encode(event), str(event.event_id))
        self.stats.published += len(events)

    # --- subscribe ----------------------------------------------------------------------------
    async def subscribe(
        self,
        subject: str,
        model: type[E],
        handler: Handler[E],
        *,
        queue: str | None = None,
    ) -> Subscription:
        """Core (non-durable) subscription; ``subject`` may be a pattern such as ``metrics.job.*``.

        With ``queue`` the messages are shared among the group's members (scale-out).
        """
        spec = self._check_model(subject, model)
        # Everything about the subject is resolved once here; the receive path is one call.
        decode_wire = decoder_for(spec, skip_tokens=self._prefix_tokens)
        stats = self.stats

        async def on_message(msg: Msg) -> None:
            try:
                event = decode_wire(msg.subject, msg.data)
            except MalformedMessageError as exc:
                self._count_malformed(self.unwire(msg.subject))
                log.warning("dropped malformed message: %s", exc)
                return
            stats.received += 1
            ids = bind_ids(event)
            try:
                await handler(event)  # type: ignore[arg-type]  # the decoder checked the model
            except Exception:
                stats.handler_errors += 1
                log.exception("handler for %s failed", msg.subject)
            finally:
                reset_ids(ids)

        return await self.nc.subscribe(self.wire(subject), queue=queue or "", cb=on_message)

    def _count_malformed(self, subject: str) -> None:
        self.stats.malformed += 1
        self.stats.by_subject_malformed[subject] = self.stats.by_subject_malformed.get(subject, 0) + 1

    # --- request / reply ----------------------------------------------------------------------
    async def request(self, subject: str, event: Event, reply: type[R], *, timeout_s: float = 2.0) -> R:
        """Send ``event`` and return the validated reply, which must be of model ``reply``."""
        spec = self._check_model(subject, type(event))
        if spec.reply_model is None or not issubclass(spec.reply_model, reply):
            raise WrongModelError(f"subject {subject!r} does not reply with {reply.__name__}")
        subject = self._concrete(subject, spec, event)
        try:
            msg = await self.nc.request(self.wire(subject), encode(event), timeout=timeout_s)
        except nats.errors.NoRespondersError:
            # nats-py's own error is no BusError nor OSError, so callers that handle both still
            # printed a traceback when the service was not (yet) subscribed.
            raise NoResponderError(f"{subject}: nothing serves this subject (is its service running?)") from None
        if msg.headers and ERROR_HEADER in msg.headers:
            raise RemoteError(f"{subject}: {msg.headers[ERROR_HEADER]}")
        return decode_as(reply, msg.data, subject=subject)

    async def serve(
        self,
        subject: str,
        model: type[E],
        handler: ReplyHandler[E, R],
        *,
        queue: str | None = None,
    ) -> Subscription:
        """Answer requests on ``subject``; malformed requests and handler errors are answered too."""
        spec = self._check_model(subject, model)
        if spec.reply_model is None:
            raise WrongModelError(f"subject {subject!r} is not a request-reply subject")
        reply_model = spec.reply_model

        async def on_request(msg: Msg) -> None:
            subject_name = self.unwire(msg.subject)
            try:
                event = decode(subject_name, msg.data)
            except MalformedMessageError as exc:
                self._count_malformed(subject_name)
                log.warning("rejected malformed request: %s", exc)
                await self._reply_error(msg, f"malformed request: {exc}")
                return
            self.stats.received += 1
            ids = bind_ids(event)
            try:
                reply = await handler(event)  # type: ignore[arg-type]  # decode checked the model
            except Exception as exc:
                self.stats.handler_errors += 1
                log.exception("request handler for %s failed", msg.subject)
                await self._reply_error(msg, f"{type(exc).__name__}: {exc}")
                return
            finally:
                reset_ids(ids)
            if not isinstance(reply, reply_model):
                await self._reply_error(msg, f"handler returned {type(reply).__name__}")
                return
            if msg.reply:
                await self.nc.publish(msg.reply, encode(reply))

        return await self.nc.subscribe(self.wire(subject), queue=queue or "", cb=on_request)

    async def _reply_error(self, msg: Msg, reason: str) -> None:
        if msg.reply:
            # Header values are one line; keep them short and printable.
            clean = " ".join(reason.split())[:1000]
            await self.nc.publish(msg.reply, b"", headers={ERROR_HEADER: clean})

    # --- durable consumers --------------------------------------------------------------------
    async def consume(
        self,
        subject: str,
        model: type[E],
        handler: ConsumerHandler[E],
        *,
        durable: str,
        options: ConsumerOptions | None = None,
        on_malformed: MalformedHandler | None = None,
    ) -> DurableConsumer[E]:
        """Start a durable pull consumer on a lifecycle subject (or pattern).

        The handler runs once per message in stream order; the message is acked only after the handler
        returned (or, if it returned an awaitable commit, after that resolved: handlers that enqueue
        their writes on the store's batched writer turn a fetched batch into one transaction), so a
        crash before that redelivers it. Handlers must therefore be idempotent (use the
        store's applied-event ids). A message that fails to decode is dead-lettered, never retried.
        """
        spec = self._check_model(subject, model)
        if not spec.durable:
            raise WrongModelError(f"subject {subject!r} is not durable; use subscribe()")
        consumer: DurableConsumer[E] = DurableConsumer(
            bus=self,
            subject=subject,
            durable=self.name(durable),
            handler=handler,
            options=options or ConsumerOptions(),
            on_malformed=on_malformed,
        )
        await consumer.start()
        self._consumers.append(consumer)
        return consumer

    async def dead_letter(self, consumer: str, msg: Msg, reason: str) -> bool:
        """Keep an unprocessable message for inspection on ``deadletter.<consumer>``; False if it could
        not be stored (the caller then hands the message back instead of terminating it, so a
        failover of the stream never loses it). Retried like any durable publish, with a message id
        per original stream sequence, so a retry stores it once."""
        headers = {
            "Roundhouse-Reason": " ".join(reason.split())[:1000],
            "Roundhouse-Subject": msg.subject,
        }
        try:
            sequence = msg.metadata.sequence.stream
        except (ValueError, AttributeError):  # not a JetStream message (tests)
            sequence = None
        msg_id = f"dl-{consumer}-{sequence}" if sequence is not None else str(uuid.uuid4())
        subject = f"{DEAD_LETTER_PREFIX}.{consumer}"
        try:
            await self._publish_durable(subject, msg.data, msg_id, extra_headers=headers)
        except (BusError, nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
            log.error("could not dead-letter a message from %s: %r", msg.subject, exc)
            return False
        return True

    # --- key-value -----------------------------------------------------------------------------
    async def kv(self, bucket: str, *, history: int = 1, ttl_s: float | None = None) -> KVBucket:
        """Open (creating if needed) a KV bucket in this namespace."""
        kv = await KVBucket.open(
            self, self.name(bucket), history=history, ttl_s=ttl_s, replicas=self.options.stream_replicas
        )
        self._buckets.append(kv)
        return kv
