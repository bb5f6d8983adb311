"""Nodes: registrations, heartbeats and the sweep, and the releases and revokes they imply.

``node.register`` (a durable consumer) updates the inventory, persisted with the change; a new
incarnation of an agent revokes the leases the node held on the node: the new agent answers
``unknown_lease`` for those gone with the old one's processes (released at once) and stops one it
took already (a grant retried across the restart), so that job is not granted elsewhere meanwhile.
Heartbeats (core NATS) keep a node live and list the leases it holds; the sweep, a few times per
lease TTL and before every round, marks nodes silent for the TTL dead and releases revokes past
their deadline. What a heartbeat or a sweep implies is decided by ``reconcile.py`` (pure, on
``now``); this part reads the clock, gathers the inputs and commits or executes the verdict.

Who speaks is vouched for by the broker (``node.register.<node>``, ``node.heartbeat.<node>``, the
codec checks the payload names the same node), so a registration touches only its own node's
leases, and a heartbeat that lists a lease the scheduler holds for another node or job is refused
whole (``trust.foreign_leases``), before it counts as a sign of life. A new incarnation's leases
are revoked on the node, never released blind: the agent recovers the leases its predecessor left
running before it registers (``services/worker``), so an ``unknown_lease`` answer from it means
those processes are gone, and a lease it still runs is stopped (released with its
``job.suspended``) before its GPUs or job go anywhere else.

A heartbeat of a node or incarnation the inventory does not know (the store was restored from a
backup taken before the node registered, or its ``node.register`` was lost) is not applied, and the
leader asks that node to register again (``node.reregister.<node>``, :mod:`.reregister`), at most
once per node per ``reconcile_grace_s``: otherwise the node's GPUs would never be offered again.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import nats.errors

from schemas.leases import RevokeReason
from schemas.nodes import NodeHeartbeat, NodeRegister, NodeReregister, ReregisterReason
from schemas.rounds import RoundTrigger
from schemas.subjects import NODE_HEARTBEAT, NODE_REGISTER, node_reregister
from services.runtime.bus import BusError
from services.runtime.consumer import ConsumerHandler
from services.runtime.store import LeaseState, SetMeta, StaleWriteError
from services.scheduler.book import Change
from services.scheduler.execution import Execution
from services.scheduler.inventory import META_KEY
from services.scheduler.leases import Lease
from services.scheduler.reconcile import reconcile_heartbeat, sweep_releases
from services.scheduler.replica import CONSUMERS, Replica
from services.scheduler.reregister import ReregisterLimiter
from services.scheduler.term import Term
from services.scheduler.trust import Refusal, foreign_leases

log = logging.getLogger("roundhouse.scheduler")


class NodeFacts:
    """Node registrations and heartbeats, and the sweep (module doc)."""

    def __init__(self, replica: Replica, execution: Execution) -> None:
        self.replica = replica
        self.execution = execution
        self.missing_since: dict[str, float] = {}
        """Leases a node's heartbeats stopped listing, with the first such heartbeat's time."""
        self.reregister = ReregisterLimiter(replica.cfg.reconcile_grace_s)
        """Asks to register again, per node (issue 18)."""
        self.reregisters_sent = 0
        self._term_seen: tuple[int, float] | None = None
        """The epoch this replica leads and when it handled its first heartbeat (scheduler clock)."""

    def _facts_may_be_held(self, epoch: int, now: float) -> bool:
        """Whether a fact the previous leader fetched and never acked may still be on its way.

        A leader that was killed or frozen (SIGSTOP) while it held fetched facts hands them back
        only when the consumers' ``ack_wait`` expires; a job's ``job.completed`` can be one of them
        while its node already stopped listing the lease. Releasing that lease as lost before then
        requeues a finished job, which runs again (the paused-leader chaos test saw two such jobs
        completed twice under load). Epoch 1 had no previous leader."""
        if epoch <= 1:
            return False
        if self._term_seen is None or self._term_seen[0] != epoch:
            self._term_seen = (epoch, now)
        return now - self._term_seen[1] < self.replica.cfg.held_fact_s

    def consumers(self) -> dict[str, tuple[type[Any], ConsumerHandler[Any]]]:
        """Subject -> (event model, handler) of each durable consumer this part runs."""
        return {NODE_REGISTER: (NodeRegister, self.on_register)}

    async def on_register(self, event: NodeRegister) -> None:
        r = self.replica
        assert r.store is not None
        async with r.lock:
            restarted = r.inventory.register(event, r.clock.monotonic())
            changes: list[Change | None] = []
            stale: list[Lease] = []
            if restarted is not None:
                # A new incarnation: the leases the node held are gone with the old agent's processes,
                # except one the new agent took already (a grant retried across the restart reaches it
                # before this fact is applied). So they are revoked on the node, not released blind:
                # the new agent answers unknown_lease for what it does not hold (released at once) and
                # stops what it does (released with its job.suspended); no job runs twice meanwhile.
                now = r.clock.time()
                for lease in r.book.leases_on(event.node_id):
                    if lease.state is LeaseState.GRANTED:
                        deadline = now + self.execution.grace(lease.job_id) + r.cfg.revoke_margin_s
                        changes.append(r.book.revoke(lease.job_id, RevokeReason.PREEMPT, deadline))
                    else:
                        stale.append(lease)  # being revoked already: asked again, of the new agent
            change = r.book.merge(changes)
            change.ops.append(SetMeta(META_KEY, r.inventory.dumps()))
            await r.commit(change, event_id=event.event_id, consumer=CONSUMERS[NODE_REGISTER])
            change.revokes.extend((lease, lease.reason or RevokeReason.PREEMPT) for lease in stale)
        self.execution.send_revokes(change)
        r.churn(RoundTrigger.NODE_CHANGE)

    async def on_heartbeat(self, event: NodeHeartbeat) -> None:
        r = self.replica
        term = r.term
        if term is None:
            return
        book = r.book
        foreign = foreign_leases(event.node_id, event.leases, book.leases)
        if foreign:
            # Refused whole, before it counts as a sign of life: a node speaks only about its own
            # leases, and a lease id is never shared by two nodes' runs unless both hold it.
            r.refusals.refuse(
                NODE_HEARTBEAT,
                Refusal.OTHER_NODE,
                f"node {event.node_id} listed leases of other nodes or jobs: {', '.join(foreign[:5])}",
            )
            return
        now = r.clock.monotonic()
        if not r.inventory.heartbeat(event.node_id, event.incarnation, event.draining, now):
            await self._ask_reregister(event, term, now)
            return
        verdict = reconcile_heartbeat(
            event.node_id, event.leases, book.leases, book.by_node.get(event.node_id, set()), self.missing_since,
            ts=event.ts, grace_s=r.cfg.reconcile_grace_s, epoch=term.epoch, now=r.clock.time(),
        )  # fmt: skip
        self.missing_since = verdict.missing_since
        if verdict.lost and self._facts_may_be_held(term.epoch, r.clock.time()):
            # Kept missing (not released): judged again at the node's next heartbeat.
            log.debug("leases %s missing on %s: released once the old leader's facts are redelivered",
                      ", ".join(verdict.lost), event.node_id)  # fmt: skip
        elif verdict.lost:
            await self.execution.release(verdict.lost, r.clock.time())
            r.churn(RoundTrigger.NODE_CHANGE)
        if verdict.strays and r.term is not None:
            self.execution.revoke_strays(r.term, verdict.strays)

    async def _ask_reregister(self, event: NodeHeartbeat, term: Term, now: float) -> None:
        """Ask the node of a heartbeat the inventory did not apply to register again (rate-limited)."""
        r = self.replica
        if r.bus is None or not self.reregister.allow(event.node_id, now):
            return
        known = r.inventory.get(event.node_id)
        reason = ReregisterReason.UNKNOWN_NODE if known is None else ReregisterReason.OTHER_INCARNATION
        log.warning(
            "heartbeat of %s node %s (incarnation %s): asking it to register again",
            "unknown" if known is None else "another incarnation of",
            event.node_id,
            event.incarnation,
        )
        ask = NodeReregister(epoch=term.epoch, node_id=event.node_id, reason=reason)
        # Best effort: the next heartbeat after the interval asks again if this one is lost.
        with contextlib.suppress(nats.errors.Error, BusError, TimeoutError):
            await r.bus.publish(node_reregister(event.node_id), ask)
            self.reregisters_sent += 1

    async def sweep_loop(self, term: Term) -> None:
        """Dead nodes and revokes past their deadline, checked a few times per TTL."""
        r = self.replica
        interval = min(1.0, r.cfg.lease_ttl_s / 4)
        while r.term is term:
            await r.clock.sleep(interval)
            try:
                await self.sweep()
            except StaleWriteError:
                return
            except Exception:
                log.exception("sweep failed")

    async def sweep(self) -> None:
        """Release the leases of nodes silent for the lease TTL, and revokes past their deadline
        that no round waits for."""
        r = self.replica
        dead = r.inventory.sweep(r.clock.monotonic())
        now = r.clock.time()
        async with r.lock:
            term = r.term
            verdict = sweep_releases(
                dead, r.book.leases, r.book.by_node, now=now,
                awaited=term.executor.is_awaited if term is not None else lambda _: False,
            )  # fmt: skip
            for node_id in dead:
                log.warning("node %s silent for %.0f s: its jobs are requeued", node_id, r.cfg.lease_ttl_s)
            if verdict.released:
                await r.commit(r.book.merge(r.book.release(i, now) for i in verdict.released))
        if dead:
            r.churn(RoundTrigger.NODE_CHANGE)
