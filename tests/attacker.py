"""An attacker on the bus: a raw NATS connection with what an attacker holds, and what the broker says back.

Used by ``tests/e2e/test_attacks.py`` (issue 13). The attacker does not use Roundhouse's ``Bus``: its
codec checks that a payload names the subject's node or user and would stop a forgery before it left,
which an attacker's own client would not do. So this is plain ``nats-py``: a URL and, maybe, one
identity's credentials (a user's own, or a compromised node's), payloads built from the real models
(``model_dump_json``) so that only the broker and the services can be what refuses them.

Every refusal the broker sends (``-ERR 'Permissions Violation for Publish to "..."'``, and the same
for subscriptions) arrives asynchronously on the connection's error callback; :class:`Attacker`
keeps them, and :meth:`Attacker.denied` waits (bounded) for the one naming a subject, so a test
proves a refusal happened instead of concluding it from silence.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from schemas.base import WireModel
from schemas.roles import inbox_prefix
from services.runtime.auth import read_creds

DENIAL_WAIT_S = 3.0
"""How long the broker's violation for one action may take to come back (it comes in milliseconds)."""
SILENCE_S = 0.3
"""How long a refused subscription is watched for a message it must not get (the refusal itself is
proved by the violation; this only checks that nothing leaked meanwhile)."""


class AttackerRefusedError(ConnectionError):
    """The broker refused the connection itself (no credentials, or unknown ones)."""


class Attacker:
    """One connection to the cluster's broker, as ``who`` (an identity's name, or ``"anonymous"``)."""

    def __init__(
        self, nc: NatsClient, *, who: str, namespace: str, errors: list[str], sent: set[str] | None = None
    ) -> None:
        self.nc = nc
        self.who = who
        self.namespace = namespace
        self.errors = errors
        """Every error the broker sent this connection, in order (lowercased)."""
        self.sent: set[str] = sent if sent is not None else set()
        """The event ids of every event this attacker published (an observer tells forgeries by them)."""

    # --- connecting ------------------------------------------------------------------------------------
    @classmethod
    async def connect(
        cls, url: str, *, namespace: str, creds: Path | None = None, sent: set[str] | None = None
    ) -> Attacker:
        """Connect as the identity of ``creds`` (None: with nothing but the URL); ``sent``: where to
        note the event ids it publishes (shared with an observer)."""
        errors: list[str] = []
        refused: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def on_error(exc: Exception) -> None:
            text = str(exc).lower()
            errors.append(text)
            if "authorization violation" in text and not refused.done():
                refused.set_result(str(exc))

        settings: dict[str, Any] = {
            "allow_reconnect": False, "max_reconnect_attempts": 0, "connect_timeout": 2,
            "error_cb": on_error, "name": "attacker",
        }  # fmt: skip
        who = "anonymous"
        if creds is not None:
            identity = read_creds(creds)
            who = f"{identity.role.value} {identity.identity}"
            settings["nkeys_seed_str"] = identity.seed
            # Its own inbox: the only one its permissions let it read replies on.
            settings["inbox_prefix"] = inbox_prefix(identity.role, identity.identity)
        nc = NatsClient()
        try:
            await nc.connect(url, **settings)
        except (nats.errors.Error, OSError) as exc:
            with contextlib.suppress(Exception):
                await nc.close()
            why = refused.result() if refused.done() else f"{type(exc).__name__}: {exc}"
            raise AttackerRefusedError(why) from None
        return cls(nc, who=who, namespace=namespace, errors=errors, sent=sent)

    async def close(self) -> None:
        if not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await self.nc.close()

    # --- naming ----------------------------------------------------------------------------------------
    def wire(self, subject: str) -> str:
        """A bus subject as it travels in this cluster's namespace (``$``-subjects are left alone)."""
        if subject.startswith("$") or subject.startswith("_INBOX") or not self.namespace:
            return subject
        return f"{self.namespace}.{subject}"

    # --- acting ----------------------------------------------------------------------------------------
    async def publish(
        self, subject: str, payload: WireModel | bytes = b"", *, headers: dict[str, str] | None = None
    ) -> str:
        """Publish on ``subject`` (namespaced); the wire subject."""
        wire = self.wire(subject)
        data = payload if isinstance(payload, bytes) else payload.model_dump_json().encode()
        event_id = getattr(payload, "event_id", None)
        if event_id is not None:
            self.sent.add(str(event_id))
        await self.nc.publish(wire, data, headers=headers)
        await self.nc.flush()
        return wire

    async def subscribe(self, subject: str) -> tuple[Subscription, asyncio.Queue[Msg]]:
        """Subscribe to ``subject`` (namespaced); what arrives goes to the queue."""
        got: asyncio.Queue[Msg] = asyncio.Queue()

        async def on_msg(msg: Msg) -> None:
            got.put_nowait(msg)

        sub = await self.nc.subscribe(self.wire(subject), cb=on_msg)
        await self.nc.flush()
        return sub, got

    async def request(self, subject: str, payload: bytes = b"", *, timeout_s: float = 1.0) -> Msg | None:
        """A request (JetStream API and services use them); None when no answer came in ``timeout_s``."""
        try:
            return await self.nc.request(self.wire(subject), payload, timeout=timeout_s)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            return None

    # --- what the broker said --------------------------------------------------------------------------
    def violations(self) -> list[str]:
        return [e for e in self.errors if "permissions violation" in e]

    async def denied(self, subject: str, *, action: str = "publish", timeout_s: float = DENIAL_WAIT_S) -> str:
        """The broker's violation for ``action`` ("publish" or "subscription") on ``subject`` (as it
        travels); AssertionError naming what it did say if none came within ``timeout_s``."""
        wire = self.wire(subject).lower()
        wanted = f'permissions violation for {action} to "{wire}"'
        deadline = time.monotonic() + timeout_s
        while True:
            found = [e for e in self.errors if wanted in e]
            if found:
                return found[0]
            if time.monotonic() > deadline:
                said = self.errors[-5:]
                raise AssertionError(f"{self.who}: no violation for {action} to {wire!r}; the broker said {said}")
            await asyncio.sleep(0.01)

    async def publish_denied(self, subject: str, payload: WireModel | bytes = b"", **kwargs: Any) -> str:
        """Publish and return the broker's violation for it (AssertionError if the broker let it through)."""
        await self.publish(subject, payload, **kwargs)
        return await self.denied(subject)

    async def subscribe_denied(self, subject: str) -> tuple[str, asyncio.Queue[Msg]]:
        """Subscribe and return the broker's violation (and the queue, to check nothing came anyway)."""
        sub, got = await self.subscribe(subject)
        violation = await self.denied(subject, action="subscription")
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        return violation, got

    async def request_denied(self, subject: str, payload: bytes = b"") -> str:
        """A request the broker must refuse: the violation for its publish, and no answer meanwhile.

        Not ``nc.request``, which would wait out its timeout: the violation proves the broker dropped
        the request, so nobody can have answered it; the reply inbox is checked all the same."""
        inbox = self.nc.new_inbox()
        sub, got = await self.subscribe(inbox)
        try:
            await self.nc.publish(self.wire(subject), payload, reply=inbox)
            await self.nc.flush()
            violation = await self.denied(subject)
            await self.nc.flush()  # anything already answered would have arrived before this returns
            assert got.empty(), f"{self.who}: {subject} answered {got.get_nowait().data[:300]!r}"
            return violation
        finally:
            await sub.unsubscribe()


async def poll(
    probe: Callable[[], Awaitable[Any]], check: Callable[[Any], bool], what: str, *,
    timeout_s: float = 15.0, every_s: float = 0.05,
) -> Any:  # fmt: skip
    """``probe()`` again until ``check`` holds for its result (AssertionError with the last one after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        last = await probe()
        if check(last):
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s; last seen: {last!r}")
        await asyncio.sleep(every_s)


def json_of(msg: Msg) -> Any:
    return json.loads(msg.data)
