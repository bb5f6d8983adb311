"""NATS KV with compare-and-set, and watchers that survive a broker restart.

nats-py's ``KeyValue.update(key, value)`` without ``last`` means "the key must not exist", which is
easy to misuse; here ``create`` and ``update(last=...)`` are separate and both raise
:class:`KVConflictError` when the expectation fails. A nats-py key watcher is an ephemeral ordered
consumer that does not come back after the broker restarts, so :class:`KVWatcher` re-creates it on
every reconnect and skips entries it has already delivered (by revision).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import nats.errors
import nats.js.errors
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

if TYPE_CHECKING:
    from services.runtime.bus import Bus

log = logging.getLogger("roundhouse.kv")


class KVConflictError(RuntimeError):
    """A compare-and-set failed: the key exists (create) or moved past ``last`` (update)."""


@dataclass(frozen=True, slots=True)
class KVEntry:
    key: str
    value: bytes
    revision: int
    deleted: bool = False


WatchCallback = Callable[[KVEntry], Awaitable[None]]


class KVBucket:
    def __init__(self, bus: Bus, name: str, kv: KeyValue) -> None:
        self.bus = bus
        self.name = name
        self._kv = kv
        self._watchers: list[KVWatcher] = []

    @classmethod
    async def open(
        cls, bus: Bus, name: str, *, history: int = 1, ttl_s: float | None = None, replicas: int = 1
    ) -> KVBucket:
        """Open ``name``, creating it with ``replicas`` if it does not exist (an existing bucket is
        left as it is: its replicas and placement are the operator's)."""
        try:
            kv = await bus.js.key_value(name)
        except nats.js.errors.BucketNotFoundError:
            kv = await bus.js.create_key_value(bucket=name, history=history, ttl=ttl_s, replicas=replicas)
        return cls(bus, name, kv)

    async def get(self, key: str) -> KVEntry | None:
        try:
            entry = await self._kv.get(key)
        except nats.js.errors.KeyNotFoundError:  # also raised for deleted/purged keys
            return None
        return KVEntry(key, entry.value or b"", entry.revision or 0)

    async def put(self, key: str, value: bytes) -> int:
        return await self._kv.put(key, value)

    async def create(self, key: str, value: bytes) -> int:
        """Write only if ``key`` does not exist (or was deleted); return the new revision."""
        try:
            return await self._kv.create(key, value)
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise KVConflictError(f"{self.name}/{key} already exists") from exc

    async def update(self, key: str, value: bytes, *, last: int) -> int:
        """Write only if the key's latest revision is ``last``; return the new revision."""
        if last <= 0:
            raise ValueError("update needs the revision you read (last > 0); use create() for a new key")
        try:
            return await self._kv.update(key, value, last=last)
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise KVConflictError(f"{self.name}/{key} moved past revision {last}") from exc

    async def delete(self, key: str, *, last: int | None = None) -> None:
        try:
            await self._kv.delete(key, last=last)
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise KVConflictError(f"{self.name}/{key} moved past revision {last}") from exc

    async def watch(self, pattern: str, callback: WatchCallback) -> KVWatcher:
        """Call ``callback`` for the current value of every matching key, then for each change."""
        watcher = KVWatcher(self, pattern, callback)
        await watcher.start()
        self._watchers.append(watcher)
        return watcher

    async def stop_watchers(self) -> None:
        for watcher in self._watchers:
            await watcher.stop()
        self._watchers.clear()


class KVWatcher:
    def __init__(self, bucket: KVBucket, pattern: str, callback: WatchCallback) -> None:
        self.bucket = bucket
        self.pattern = pattern
        self.callback = callback
        self.restarts = 0
        self._seen: dict[str, int] = {}
        self._inner: KeyValue.KeyWatcher | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._restart_lock = asyncio.Lock()
        bucket.bus.on_reconnect(self._restart)

    async def start(self) -> None:
        self._inner = await self.bucket._kv.watch(self.pattern)
        self._task = asyncio.create_task(self._pump(self._inner), name=f"kv-watch:{self.bucket.name}")

    async def _pump(self, inner: KeyValue.KeyWatcher) -> None:
        async for entry in inner:
            if entry is None:  # the "initial values delivered" marker
                continue
            revision = entry.revision or 0
            if revision <= self._seen.get(entry.key, 0):
                continue  # re-delivered after a restart of the watcher
            self._seen[entry.key] = revision
            deleted = entry.operation in (KV_DEL, KV_PURGE)
            try:
                await self.callback(KVEntry(entry.key, entry.value or b"", revision, deleted))
            except Exception:
                log.exception("KV watch callback for %s/%s failed", self.bucket.name, entry.key)

    async def _restart(self) -> None:
        """Re-create the server-side watcher after a reconnect (it may not have survived)."""
        if self._stopped:
            return
        async with self._restart_lock:
            await self._stop_inner()
            for attempt in range(20):
                try:
                    await self.start()
                    self.restarts += 1
                    return
                except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
                    log.warning("KV watcher restart failed (attempt %d): %r", attempt + 1, exc)
                    await asyncio.sleep(0.25)
            log.error("KV watcher on %s/%s could not be restarted", self.bucket.name, self.pattern)

    async def _stop_inner(self) -> None:
        inner, self._inner = self._inner, None
        task, self._task = self._task, None
        if inner is not None:
            with contextlib.suppress(nats.errors.Error, nats.js.errors.Error, TimeoutError):
                await inner.stop()  # type: ignore[no-untyped-call]
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def stop(self) -> None:
        self._stopped = True
        await self._stop_inner()
