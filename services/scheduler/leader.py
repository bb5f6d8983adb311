"""Leader election among scheduler replicas through one NATS KV key, with compare-and-set.

The key ``leader`` of the bucket ``scheduler-leader`` (TTL ``leader_ttl_s``) holds
``{"instance": ..., "epoch": N}``. A replica becomes leader with ``create`` (the key must not exist);
the revision that ``create`` returns is the *candidate* epoch: KV revisions are stream sequence
numbers, so a later term has a larger one, until NATS loses its data and they start again at 1. The
term's **epoch**, the fencing token every lease command carries, is therefore claimed in the store
on election (``term.py``, ``Store.claim_term``): above every epoch claimed before. The
leader renews every ``ttl / 3`` with ``update(last=revision)``. A failed compare-and-set means
another replica took over: the leader steps down at once. A leader that cannot reach the broker
steps down when its last successful renewal is ``ttl`` old, because the key may have expired and
been taken by then; commands it might still send carry the old epoch, which workers refuse.

Followers try ``create`` every ``ttl / 3`` (an expired key leaves no delete marker to watch for)
and also react at once to a deleted key (a leader that resigned on a clean shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable

import nats.errors
import nats.js.errors

from services.runtime.bus import Bus
from services.runtime.clock import SYSTEM_CLOCK, Clock
from services.runtime.kv import KVBucket, KVConflictError, KVEntry

log = logging.getLogger("roundhouse.scheduler.leader")

BUCKET = "scheduler-leader"
KEY = "leader"

OnElected = Callable[[int], Awaitable[None]]
OnDeposed = Callable[[int], Awaitable[None]]

_NATS_ERRORS = (nats.errors.Error, nats.js.errors.Error, TimeoutError, OSError)


class LeaderElection:
    """Campaigns for the leader key until stopped; calls back on election and on deposition.

    ``on_elected(epoch)`` runs before the replica counts as leader to others' commands only in the
    sense that it is awaited before renewals start; it should load state and start serving.
    ``on_deposed(epoch)`` must stop every command of that term.

    ``clock`` reads the age of the last renewal; keep it the real one in a running service: the key's
    TTL runs on the broker's clock, and the renewals are paced in real time whatever a test fakes.
    """

    def __init__(
        self,
        bus: Bus,
        instance: str,
        *,
        ttl_s: float,
        on_elected: OnElected,
        on_deposed: OnDeposed,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.bus = bus
        self.clock = clock
        self.instance = instance
        self.ttl_s = ttl_s
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self._bucket: KVBucket | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._stopping = False
        self.epoch: int | None = None
        """The current term's epoch while this replica leads, else None."""
        self._revision = 0
        self._renewed_at = 0.0
        self.terms = 0
        """How many terms this replica has led (for stats and tests)."""
        self._takeover: asyncio.Task[None] | None = None

    @property
    def is_leader(self) -> bool:
        """Whether this replica leads now (and its last renewal is younger than the TTL)."""
        return self.epoch is not None and self.clock.monotonic() - self._renewed_at < self.ttl_s

    async def start(self) -> None:
        self._bucket = await self.bus.kv(BUCKET, history=1, ttl_s=self.ttl_s)
        await self._bucket.watch(KEY, self._on_change)
        self._task = asyncio.create_task(self._campaign(), name="scheduler-leader")

    async def stop(self, *, resign: bool = True) -> None:
        """Stop campaigning; with ``resign`` a leader deletes its key so a follower takes over now."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        epoch, revision = self.epoch, self._revision
        if epoch is not None:
            await self._depose("stopping")
            if resign and self._bucket is not None:
                with contextlib.suppress(KVConflictError, *_NATS_ERRORS):
                    await self._bucket.delete(KEY, last=revision)

    async def _on_change(self, entry: KVEntry) -> None:
        if entry.deleted and self.epoch is None:
            self._wake.set()

    async def _campaign(self) -> None:
        interval = self.ttl_s / 3
        while not self._stopping:
            if self.epoch is None:
                await self._try_create()
            else:
                await self._renew()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), interval)

    def _value(self, epoch: int) -> bytes:
        return json.dumps({"instance": self.instance, "epoch": epoch}).encode()

    async def _try_create(self) -> None:
        assert self._bucket is not None
        try:
            revision = await self._bucket.create(KEY, json.dumps({"instance": self.instance}).encode())
        except KVConflictError:
            return
        except _NATS_ERRORS as exc:
            log.warning("leader campaign: %r", exc)
            return
        self._revision = revision
        self._renewed_at = self.clock.monotonic()
        # Record the epoch in the value too (the revision is only known after the create).
        try:
            self._revision = await self._bucket.update(KEY, self._value(revision), last=revision)
        except KVConflictError:
            return
        except _NATS_ERRORS as exc:
            log.warning("leader campaign: %r", exc)
        self._renewed_at = self.clock.monotonic()
        self.epoch = revision
        self.terms += 1
        log.info("elected leader", extra={"epoch": revision, "instance": self.instance})
        # Taking over (loading the store) runs beside the campaign, so renewals go on meanwhile.
        self._takeover = asyncio.create_task(self._take_over(revision), name="scheduler-takeover")

    async def _take_over(self, epoch: int) -> None:
        try:
            await self._on_elected(epoch)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("taking over as leader failed; stepping down")
            if self.epoch == epoch:
                await self._resign_now()

    async def _renew(self) -> None:
        assert self._bucket is not None
        assert self.epoch is not None
        try:
            self._revision = await self._bucket.update(KEY, self._value(self.epoch), last=self._revision)
            self._renewed_at = self.clock.monotonic()
        except KVConflictError:
            await self._depose("lost the leader key")
        except _NATS_ERRORS as exc:
            log.warning("leader renewal failed: %r", exc)
            if self.clock.monotonic() - self._renewed_at >= self.ttl_s:
                await self._depose("could not renew within the TTL")

    async def _resign_now(self) -> None:
        revision = self._revision
        await self._depose("resigned")
        if self._bucket is not None:
            with contextlib.suppress(KVConflictError, *_NATS_ERRORS):
                await self._bucket.delete(KEY, last=revision)

    async def resign(self) -> None:
        """Step down now (e.g. a store write showed another leader moved on) and let others run."""
        if self.epoch is not None:
            await self._resign_now()

    async def _depose(self, why: str) -> None:
        epoch = self.epoch
        if epoch is None:
            return
        self.epoch = None
        takeover, self._takeover = self._takeover, None
        if takeover is not None and not takeover.done() and takeover is not asyncio.current_task():
            takeover.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await takeover
        log.warning("no longer leader: %s", why, extra={"epoch": epoch, "instance": self.instance})
        try:
            await self._on_deposed(epoch)
        except Exception:
            log.exception("stepping down failed")
