"""Lease commands to workers: revoke and grant over request-reply, retried, fenced by the epoch.

Every command carries the leader's epoch; a worker that has accepted a higher one answers
``stale_epoch`` and the executor reports it (:class:`DeposedError`): this replica is no longer the
leader and must stop. A worker's word alone does not depose a leader (issue 13, attack 9: one forged
fence made every new leader step down): when the store can be asked (``newer_term``), the executor
steps down only if a newer term was claimed there, and otherwise counts the answer as that node's
refusal of the command. A command that gets no reply is retried with the same ``lease_id``, which the
agent treats as a no-op (``duplicate=True``), until it is acked or its time is up.

Waiting for suspensions: the book releases a lease when its ``job.suspended`` (or completion) is
applied, and :meth:`LeaseExecutor.released` wakes the round waiting on it; a lease whose revoke
deadline (grace period plus margin) passes is released by the round without the fact.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable

import nats.errors

from schemas.job import JobSpec
from schemas.leases import LeaseAck, LeaseAckError, LeaseGrant, LeaseRevoke, RevokeReason, WorldInfo
from schemas.subjects import lease_grant, lease_revoke
from services.runtime.bus import Bus, NoResponderError, RemoteError
from services.runtime.clock import SYSTEM_CLOCK, Clock
from services.scheduler.leases import Lease

log = logging.getLogger("roundhouse.scheduler.executor")

_PORT_BASE = 20_000
_PORT_SPAN = 20_000


class DeposedError(RuntimeError):
    """A worker refused a command as ``stale_epoch``, or leadership was lost: stop this term."""


class GrantRefusedError(RuntimeError):
    """A worker refused a grant (GPU busy, no such GPU, draining, wrong node) or never answered."""


def coordinator_port(lease_id: str) -> int:
    """A rendezvous port for a multi-node lease, stable for its id (MASTER_PORT)."""
    return _PORT_BASE + (int.from_bytes(lease_id.encode()[-8:], "little") % _PORT_SPAN)


class LeaseExecutor:
    """Sends one term's lease commands and tracks who waits for which lease to be released."""

    def __init__(
        self,
        bus: Bus,
        *,
        epoch: int,
        is_current: Callable[[int], bool],
        request_timeout_s: float,
        grant_attempts: int,
        max_parallel: int,
        hostname: Callable[[str], str],
        clock: Clock = SYSTEM_CLOCK,
        newer_term: Callable[[], Awaitable[int]] | None = None,
    ) -> None:
        self.bus = bus
        self.clock = clock
        self.epoch = epoch
        self._is_current = is_current
        self._timeout = request_timeout_s
        self._attempts = grant_attempts
        self._limit = asyncio.Semaphore(max_parallel)
        self._hostname = hostname
        self._waiters: dict[str, asyncio.Event] = {}
        self._newer_term = newer_term
        """The last term claimed in the store (``Store.term``): what confirms a ``stale_epoch``."""
        self.sent_grants = 0
        self.sent_revokes = 0
        self.unconfirmed_stale = 0
        """``stale_epoch`` answers the store did not confirm (no newer term was claimed)."""

    def _check(self) -> None:
        if not self._is_current(self.epoch):
            raise DeposedError(f"epoch {self.epoch} is no longer current")

    # --- waiting for suspensions -------------------------------------------------------------
    def released(self, lease_ids: Iterable[str]) -> None:
        """The book released these leases (a fact arrived, or their deadline passed)."""
        for lease_id in lease_ids:
            event = self._waiters.pop(lease_id, None)
            if event is not None:
                event.set()

    def is_awaited(self, lease_id: str) -> bool:
        """Whether a round is waiting for this lease (it then releases it itself at its deadline)."""
        return lease_id in self._waiters

    async def wait_released(self, leases: list[Lease], deadline: float, active: Callable[[str], bool]) -> list[str]:
        """Wait until each lease is released or ``deadline`` (wall time on the executor's clock);
        returns those still held."""
        pending = {lease.lease_id: asyncio.Event() for lease in leases if active(lease.lease_id)}
        self._waiters.update(pending)
        try:
            remaining = deadline - self.clock.time()
            if pending and remaining > 0:
                with contextlib.suppress(TimeoutError):
                    await self.clock.wait_for(asyncio.gather(*(e.wait() for e in pending.values())), remaining)
        finally:
            for lease_id, event in pending.items():
                if self._waiters.get(lease_id) is event:
                    del self._waiters[lease_id]
        return [lease_id for lease_id in pending if active(lease_id)]

    # --- commands -------------------------------------------------------------------------
    async def revoke(self, lease: Lease, reason: RevokeReason, grace_s: float, until: float) -> LeaseAck | None:
        """Ask the coordinator to stop ``lease``; retried until acked or ``until`` (wall clock).
        Returns the ack, or None if the worker never answered (its node may be dead)."""
        command = LeaseRevoke(
            epoch=self.epoch,
            lease_id=lease.lease_id,
            job_id=lease.job_id,
            node_id=lease.coordinator,
            reason=reason,
            grace_s=grace_s,
        )
        subject = lease_revoke(lease.coordinator)
        while True:
            self._check()
            ack = await self._request(subject, command)
            if ack is not None:
                self.sent_revokes += 1
                if ack.error is LeaseAckError.STALE_EPOCH:
                    await self._stale(ack)
                return ack
            if self.clock.time() >= until:
                log.warning("revoke of %s on %s got no answer", lease.lease_id, lease.coordinator)
                return None

    async def grant(
        self,
        lease: Lease,
        spec: JobSpec,
        *,
        resume_from: str | None,
        resume_iteration: int | None,
        attempt: int,
        shared: bool = False,
    ) -> None:
        """Send one grant per node of ``lease`` (same ``lease_id``); raises ``GrantRefusedError``.
        ``shared``: the lease may share its GPUs with other shared leases (packing)."""
        world_size = lease.gpu_count
        coordinator = lease.coordinator
        multi = len(lease.parts) > 1
        port = coordinator_port(lease.lease_id)
        offset = 0
        grants: list[LeaseGrant] = []
        for rank, (node, gpus) in enumerate(lease.parts):
            world = (
                WorldInfo(
                    num_nodes=len(lease.parts),
                    node_rank=rank,
                    world_size=world_size,
                    rank_offset=offset,
                    coordinator_node=coordinator,
                    coordinator_host=self._hostname(coordinator),
                    coordinator_port=port,
                )
                if multi
                else None
            )
            offset += len(gpus)
            grants.append(
                LeaseGrant(
                    epoch=self.epoch,
                    lease_id=lease.lease_id,
                    job_id=lease.job_id,
                    node_id=node,
                    gpus=list(gpus),
                    spec=spec,
                    world=world,
                    resume_from=resume_from,
                    resume_iteration=resume_iteration if resume_from is not None else None,
                    attempt=attempt,
                    shared=shared,
                )
            )
        acks = await asyncio.gather(*(self._grant_one(g) for g in grants))
        refused = [a for a in acks if a is None or not a.accepted]
        if refused:
            why = ", ".join(
                "no answer" if a is None else f"{a.node_id}: {a.error}" + (f" ({a.message})" if a.message else "")
                for a in refused
            )
            raise GrantRefusedError(f"grant {lease.lease_id} of {lease.job_id} refused ({why})")

    async def _grant_one(self, grant: LeaseGrant) -> LeaseAck | None:
        subject = lease_grant(grant.node_id)
        for _ in range(self._attempts):
            self._check()
            ack = await self._request(subject, grant)
            if ack is None:
                continue
            self.sent_grants += 1
            if ack.error is LeaseAckError.STALE_EPOCH:
                await self._stale(ack)  # not deposed: a refused grant, rolled back as any other
            return ack
        return None

    async def _stale(self, ack: LeaseAck) -> None:
        """A worker answered ``stale_epoch``: raise :class:`DeposedError` unless the store shows no
        term newer than this one (then the answer is that node's refusal, logged and counted)."""
        claim = f"{ack.node_id} has seen epoch {ack.epoch_seen} > {self.epoch}"
        if self._newer_term is None:
            raise DeposedError(claim)
        try:
            latest = await self._newer_term()
        except Exception as exc:  # the store cannot say: stepping down is the safe side
            raise DeposedError(f"{claim}; the store could not confirm it: {exc!r}") from exc
        if latest > self.epoch:
            raise DeposedError(f"{claim}; the store's term is {latest}")
        self.unconfirmed_stale += 1
        log.warning("%s, but no newer term was claimed (the store's is %d): refused by that node, not deposed",
                    claim, latest)  # fmt: skip

    async def _request(self, subject: str, command: LeaseGrant | LeaseRevoke) -> LeaseAck | None:
        async with self._limit:
            try:
                return await self.bus.request(subject, command, LeaseAck, timeout_s=self._timeout)
            except (nats.errors.TimeoutError, NoResponderError, TimeoutError):
                await asyncio.sleep(min(0.1, self._timeout))
                return None
            except RemoteError as exc:
                log.warning("%s refused: %s", subject, exc)
                await asyncio.sleep(min(0.1, self._timeout))
                return None
