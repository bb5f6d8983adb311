"""One bus connection per signed-in identity, opened with the visitor's own credentials and cached.

Signing in is opening a connection: the broker checks the nkey (a wrong seed is refused at once), and
a first jobs query proves the identity is the seed's (the broker lets an identity publish only on its
own ``query.jobs.<identity>`` and read only its own inbox, so another's name with one's own seed gets
no answer). The connection is then kept for ``idle_s`` after the visitor's last request, with a
sampler adding to the identity's :class:`History` every ``sample_s``; idle sessions are closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from roundhouse.client import Client
from roundhouse.dashboard.history import History
from roundhouse.dashboard.snapshot import Snapshot, SnapshotSource
from roundhouse.dashboard.visitors import Visitor
from services.runtime.auth.creds import Credentials
from services.runtime.bus import AuthenticationError, BusError, NoResponderError

__all__ = ["Connect", "Session", "Sessions", "SignInRefused"]

log = logging.getLogger("roundhouse.dashboard")

Connect = Callable[[Credentials | None], Awaitable[Client]]
"""Opens a bus connection as the given identity (None: no credentials, an open broker)."""

_OPEN_KEY = "open"
"""The one session of a dashboard run with ``--insecure``."""


class SignInRefused(PermissionError):
    """The broker refused the visitor's credentials (the message says why, without the secret)."""


@dataclass(slots=True)
class Session:
    client: Client
    history: History
    last_used: float
    sampler: asyncio.Task[None] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """One snapshot at a time per identity (a refresh storm asks the scheduler once per turn)."""

    async def snapshot(self, source: SnapshotSource) -> Snapshot:
        async with self.lock:
            snapshot = await source.gather(self.client)
            self.history.add(snapshot)
            return snapshot

    async def close(self) -> None:
        if self.sampler is not None:
            self.sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.sampler
        await self.client.close()


class Sessions:
    def __init__(
        self,
        connect: Connect,
        source: SnapshotSource,
        *,
        idle_s: float = 300.0,
        sample_s: float = 5.0,
        history_size: int = 720,
        probe_timeout_s: float = 5.0,
    ) -> None:
        self._connect = connect
        self.source = source
        self.idle_s = idle_s
        self.sample_s = sample_s
        self.history_size = history_size
        self.probe_timeout_s = probe_timeout_s
        self._sessions: dict[str, Session] = {}
        self._opening = asyncio.Lock()

    def __len__(self) -> int:
        return len(self._sessions)

    async def get(self, visitor: Visitor | None) -> Session:
        """The visitor's session, opened (and their identity proved) on first use; ``SignInRefused``
        when the broker refuses them. ``None`` is the anonymous visitor of an ``--insecure`` dashboard."""
        key = visitor.key if visitor is not None else _OPEN_KEY
        loop = asyncio.get_running_loop()
        found = self._sessions.get(key)
        if found is not None and found.client.bus.nc.is_closed:  # its connection gave up (a broker gone)
            del self._sessions[key]
            await found.close()
            found = None
        if found is None:
            async with self._opening:  # two first requests of one visitor open one connection
                found = self._sessions.get(key)
                if found is None:
                    found = await self._open(visitor)
                    self._sessions[key] = found
                    found.sampler = asyncio.create_task(self._sample(key, found), name=f"dashboard-sampler-{key[:8]}")
        found.last_used = loop.time()
        return found

    async def _open(self, visitor: Visitor | None) -> Session:
        credentials = visitor.credentials if visitor is not None else None
        try:
            client = await self._connect(credentials)
        except AuthenticationError as exc:
            raise SignInRefused(f"the broker refused these credentials: {exc}") from None
        try:
            await self._prove(client)
        except BaseException:
            await client.close()
            raise
        return Session(client, History(self.history_size), asyncio.get_running_loop().time())

    async def _prove(self, client: Client) -> None:
        """A first jobs query as the visitor: answered (or answered by the broker's "no responders",
        which it sends only for a publish it allowed), the identity is the seed's."""
        try:
            await client.jobs(timeout_s=self.probe_timeout_s)
        except (NoResponderError, BusError):
            return
        except TimeoutError:
            raise SignInRefused(
                f"no answer to {client.identity}'s jobs query: the broker did not let this identity ask "
                "(the user name is not the credentials' identity), or the scheduler is not answering"
            ) from None

    async def _sample(self, key: str, session: Session) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.sample_s)
            if loop.time() - session.last_used > self.idle_s:
                if self._sessions.get(key) is session:
                    del self._sessions[key]
                session.sampler = None  # this task ends here; close() must not wait for itself
                await session.client.close()
                log.info("dashboard: closed %s's idle session", session.client.identity)
                return
            try:
                await session.snapshot(self.source)
            except (BusError, OSError) as exc:
                log.warning("dashboard: sampling for %s failed: %s", session.client.identity, exc)

    async def close(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            await session.close()
        await self.source.close()
