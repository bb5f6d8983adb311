"""Fake worker agents over the real bus, for scheduler tests and ``benchmarks/round.py``.

``FakeWorkers`` plays the worker agents of many nodes with one wildcard subscription each for grants
and revokes: it registers the nodes, answers lease commands like an agent (fencing by epoch,
duplicates acked as such, GPUs checked), reports ``job.started`` and, on a revoke, ``job.suspended``
with a checkpoint after ``stop_delay_s``. Cheap enough for 1,250 nodes in one process; the real
agent (``services.worker``, with ``--emulate``) is what tests of the worker's behaviour use.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from nats.aio.subscription import Subscription

from schemas.jobs import JobCompleted, JobStarted, JobSuspended, SuspendReason
from schemas.leases import LeaseAck, LeaseAckError, LeaseGrant, LeaseRevoke, RevokeReason
from schemas.nodes import GpuInventory, HeldLease, NodeHeartbeat, NodeRegister
from schemas.subjects import (
    JOB_COMPLETED,
    JOB_STARTED,
    JOB_SUSPENDED,
    NODE_HEARTBEAT,
    NODE_REGISTER,
)
from services.runtime.bus import Bus


@dataclass(slots=True)
class FakeLease:
    grant: LeaseGrant
    stopping: bool = False


@dataclass(slots=True)
class FakeNode:
    node_id: str
    gpus: int
    incarnation: uuid.UUID = field(default_factory=uuid.uuid4)
    epoch_seen: int = 0
    leases: dict[str, FakeLease] = field(default_factory=dict)
    seq: int = 0


class FakeWorkers:
    """Fake worker agents for ``nodes`` (node id -> GPU count) on one bus connection."""

    def __init__(
        self,
        bus: Bus,
        nodes: dict[str, int],
        *,
        stop_delay_s: float = 0.0,
        report_started: bool = True,
        links: dict[str, tuple[list[list[float]], float | None]] | None = None,
    ) -> None:
        self.bus = bus
        self.links = links or {}
        """node id -> (its register's ``link_bandwidth_gbps`` matrix, its ``network_gbps``)."""
        self.nodes = {n: FakeNode(n, g) for n, g in nodes.items()}
        self.stop_delay_s = stop_delay_s
        self.report_started = report_started
        self.log: list[tuple[str, str, str, int]] = []
        """(command, lease_id, node_id, epoch) of every accepted command, in order."""
        self.timeline: list[tuple[float, str, str]] = []
        """(monotonic time, what, job id): accepted grants and revokes, and suspensions reported."""
        self.revoke_reasons: dict[str, RevokeReason] = {}
        self.refused: list[tuple[str, str, LeaseAckError]] = []
        self.running: dict[str, set[str]] = {}
        """job id -> lease ids running it now (more than one would be a job run twice)."""
        self.max_concurrent_runs = 0
        self.silent: set[str] = set()
        """Nodes that answer nothing (cut off from the bus)."""
        self.last_heartbeat_at: dict[str, float] = {}
        """node id -> monotonic time its last heartbeat was published (what a lease TTL counts from)."""
        self._subs: list[Subscription] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._heartbeat: asyncio.Task[None] | None = None

    async def start(self, *, heartbeat_s: float | None = None, register: bool = True) -> None:
        """Serve lease commands; publish ``node.register`` for every node unless told not to (a
        benchmark writes a large inventory straight into the store instead)."""
        self._subs.append(await self.bus.serve("lease.grant.*", LeaseGrant, self._on_grant))
        self._subs.append(await self.bus.serve("lease.revoke.*", LeaseRevoke, self._on_revoke))
        await self.bus.nc.flush()
        if register:
            for node in self.nodes.values():
                await self.register(node.node_id)
        if heartbeat_s is not None:
            self._heartbeat = asyncio.create_task(self._beat(heartbeat_s))

    async def register(self, node_id: str, *, new_incarnation: bool = False) -> None:
        node = self.nodes[node_id]
        if new_incarnation:
            node.incarnation = uuid.uuid4()
            node.leases.clear()
        await self.bus.publish(NODE_REGISTER, self.register_message(node_id))

    async def heartbeat(self, node_id: str) -> None:
        node = self.nodes[node_id]
        node.seq += 1
        leases = [
            HeldLease(lease_id=lid, job_id=fl.grant.job_id, epoch=fl.grant.epoch, gpus=fl.grant.gpus)
            for lid, fl in node.leases.items()
        ]
        await self.bus.publish(NODE_HEARTBEAT, NodeHeartbeat(
            node_id=node_id, incarnation=node.incarnation, seq=node.seq, epoch_seen=node.epoch_seen, leases=leases,
        ))  # fmt: skip
        self.last_heartbeat_at[node_id] = time.monotonic()

    async def _beat(self, interval: float) -> None:
        while True:
            for node_id in self.nodes:
                if node_id not in self.silent:
                    await self.heartbeat(node_id)
            await asyncio.sleep(interval)

    async def stop(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        for task in list(self._tasks):
            task.cancel()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _ack(
        self, node: FakeNode, lease_id: str, error: LeaseAckError | None = None, duplicate: bool = False
    ) -> LeaseAck:
        return LeaseAck(
            lease_id=lease_id,
            node_id=node.node_id,
            accepted=error is None,
            error=error,
            duplicate=duplicate,
            epoch_seen=node.epoch_seen,
            leases_held=len(node.leases),
        )

    async def _on_grant(self, grant: LeaseGrant) -> LeaseAck:
        node = self.nodes.get(grant.node_id)
        if node is None or grant.node_id in self.silent:
            raise TimeoutError("not this process's node")  # answered as an error; the scheduler retries
        if grant.epoch < node.epoch_seen:
            self.refused.append(("grant", grant.lease_id, LeaseAckError.STALE_EPOCH))
            return self._ack(node, grant.lease_id, LeaseAckError.STALE_EPOCH)
        node.epoch_seen = grant.epoch
        if grant.lease_id in node.leases:
            return self._ack(node, grant.lease_id, duplicate=True)
        busy = {g for fl in node.leases.values() for g in fl.grant.gpus}
        if any(g >= node.gpus for g in grant.gpus):
            self.refused.append(("grant", grant.lease_id, LeaseAckError.NO_SUCH_GPU))
            return self._ack(node, grant.lease_id, LeaseAckError.NO_SUCH_GPU)
        if busy & set(grant.gpus):
            self.refused.append(("grant", grant.lease_id, LeaseAckError.GPU_BUSY))
            return self._ack(node, grant.lease_id, LeaseAckError.GPU_BUSY)
        node.leases[grant.lease_id] = FakeLease(grant)
        self.log.append(("grant", grant.lease_id, grant.node_id, grant.epoch))
        self.timeline.append((time.monotonic(), "grant", grant.job_id))
        runs = self.running.setdefault(grant.job_id, set())
        runs.add(grant.lease_id)
        self.max_concurrent_runs = max(self.max_concurrent_runs, len(runs))
        if self.report_started and grant.is_coordinator:
            self._spawn(self.bus.publish(JOB_STARTED, JobStarted(
                job_id=grant.job_id, lease_id=grant.lease_id, node_id=grant.node_id, epoch=grant.epoch,
                gpus=grant.gpus, iteration=grant.resume_iteration or 0, resumed_from=grant.resume_from,
            )))  # fmt: skip
        return self._ack(node, grant.lease_id)

    async def _on_revoke(self, revoke: LeaseRevoke) -> LeaseAck:
        node = self.nodes.get(revoke.node_id)
        if node is None or revoke.node_id in self.silent:
            raise TimeoutError("not this process's node")
        if revoke.epoch < node.epoch_seen:
            self.refused.append(("revoke", revoke.lease_id, LeaseAckError.STALE_EPOCH))
            return self._ack(node, revoke.lease_id, LeaseAckError.STALE_EPOCH)
        node.epoch_seen = revoke.epoch
        held = node.leases.get(revoke.lease_id)
        if held is None:
            return self._ack(node, revoke.lease_id, LeaseAckError.UNKNOWN_LEASE)
        if held.stopping:
            return self._ack(node, revoke.lease_id, duplicate=True)
        held.stopping = True
        self.log.append(("revoke", revoke.lease_id, revoke.node_id, revoke.epoch))
        self.timeline.append((time.monotonic(), "revoke", revoke.job_id))
        self.revoke_reasons[revoke.lease_id] = revoke.reason
        self._spawn(self._suspend_later(node, held))
        return self._ack(node, revoke.lease_id)

    async def _suspend_later(self, node: FakeNode, held: FakeLease) -> None:
        if self.stop_delay_s:
            await asyncio.sleep(self.stop_delay_s)
        await self.finish(node.node_id, held.grant.lease_id, completed=False)

    async def finish(
        self,
        node_id: str,
        lease_id: str,
        *,
        completed: bool,
        iteration: int = 10,
        reason: SuspendReason = SuspendReason.PREEMPTED,
        publish: bool = True,
    ) -> JobCompleted | JobSuspended:
        """End a lease's job: ``job.completed``, or ``job.suspended`` with a checkpoint; returns the fact.
        With ``publish=False`` the fact is only returned (an agent's outbox holding it back): the
        caller publishes it when the test wants it to land."""
        node = self.nodes[node_id]
        held = node.leases.pop(lease_id)
        grant = held.grant
        self.running.get(grant.job_id, set()).discard(lease_id)
        common = {"job_id": grant.job_id, "lease_id": lease_id, "node_id": node_id, "epoch": grant.epoch}
        fact: JobCompleted | JobSuspended
        if completed:
            fact = JobCompleted(**common, iteration=iteration)
            if publish:
                await self.bus.publish(JOB_COMPLETED, fact)
        else:
            self.timeline.append((time.monotonic(), "suspended", grant.job_id))
            fact = JobSuspended(
                **common, reason=reason, iteration=iteration,
                checkpoint_path=f"/ckpt/{grant.job_id}/{iteration}", checkpoint_iteration=iteration,
            )  # fmt: skip
            if publish:
                await self.bus.publish(JOB_SUSPENDED, fact)
        return fact

    def register_message(self, node_id: str) -> NodeRegister:
        node = self.nodes[node_id]
        gpus = [
            GpuInventory(index=i, uuid=f"GPU-{node_id}-{i}", name="Fake GPU", memory_mib=16_384)
            for i in range(node.gpus)
        ]
        matrix, network = self.links.get(node_id, (None, None))
        return NodeRegister(
            node_id=node_id, incarnation=node.incarnation, hostname="127.0.0.1", cpus=32, memory_gb=256, gpus=gpus,
            link_bandwidth_gbps=matrix, network_gbps=network,
        )  # fmt: skip

    def lease_of(self, job_id: str) -> tuple[str, str] | None:
        """(node_id, lease_id) of the coordinator part running ``job_id`` now, if any."""
        for node in self.nodes.values():
            for lease_id, held in node.leases.items():
                if held.grant.job_id == job_id and held.grant.is_coordinator:
                    return node.node_id, lease_id
        return None
