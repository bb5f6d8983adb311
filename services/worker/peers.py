"""Which other nodes share a multi-node lease with this one, and whether a peer's fact may be acted on.

The agent hears every node's ``job.started`` and ``job.failed``. Any of them may be forged or meant
for another lease (issue 13, attack 6: a forged ``job.failed`` made an agent kill its ranks), so a
fact from a peer is acted on only if it is about a lease this node holds, for the same job and
epoch (every node's grant of one lease carries the leader's epoch), from a node of that lease's
gang other than this one.

A grant names only the coordinator of its gang (:class:`~schemas.leases.WorldInfo`), so the other
members are learnt from their ``job.started``: one that matches the lease (job, epoch) claims one of
its ``num_nodes - 1`` places; once they are taken, nobody else joins. A ``job.started`` may arrive
before this node's own grant (the scheduler sends a gang's grants at once), so claims for leases not
held yet wait, a bounded number of them, until the grant comes (:meth:`PeerBook.adopt`).

Pure bookkeeping, no I/O: the service feeds it and logs the reasons it returns.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from schemas.leases import LeaseGrant

__all__ = ["PeerBook", "PeerClaim", "judge_peer_fact"]

EARLY_LEASES = 4096
"""Leases not held yet whose peers' ``job.started`` are kept until their grant arrives."""
_EARLY_CLAIMS_PER_LEASE = 64
"""Claims kept per such lease (a flood of made-up nodes cannot grow one entry without bound)."""


@dataclass(frozen=True, slots=True)
class PeerClaim:
    """A node's ``job.started`` for a lease: what it says it runs."""

    node_id: str
    lease_id: str
    job_id: str
    epoch: int


def _mismatch(grant: LeaseGrant, *, job_id: str, epoch: int | None) -> str | None:
    """Why a fact naming ``grant``'s lease is not about it (None: same job, same epoch)."""
    if job_id != grant.job_id:
        return f"lease {grant.lease_id} runs job {grant.job_id}, not {job_id}"
    if epoch != grant.epoch:
        return f"lease {grant.lease_id} was granted in epoch {grant.epoch}, not {epoch}"
    return None


def judge_peer_fact(
    grant: LeaseGrant | None, *, job_id: str, epoch: int | None, node_id: str | None, self_node: str,
    members: frozenset[str],
) -> str | None:  # fmt: skip
    """Why a peer's fact about a lease must be ignored; None when it may be acted on.

    ``grant``: this node's grant of the lease the fact names (None: not held); ``members``: the
    other nodes of that lease's gang known so far (:meth:`PeerBook.members`)."""
    if node_id is None:
        return "it names no node"
    if node_id == self_node:
        return "it comes from this node"
    if grant is None:
        return "this node holds no such lease"
    mismatch = _mismatch(grant, job_id=job_id, epoch=epoch)
    if mismatch is not None:
        return mismatch
    if node_id not in members:
        return f"node {node_id} is not known to share lease {grant.lease_id}"
    return None


class PeerBook:
    """The other nodes of each multi-node lease this node holds, from their ``job.started``."""

    def __init__(self, early_leases: int = EARLY_LEASES) -> None:
        self._held: dict[str, dict[str, PeerClaim]] = {}
        """lease id -> node -> claim, for leases this node holds (checked when noted)."""
        self._early: OrderedDict[str, dict[str, PeerClaim]] = OrderedDict()
        """Claims for leases not held (yet), oldest first, unchecked until :meth:`adopt`."""
        self._early_leases = early_leases

    def note(self, claim: PeerClaim, grant: LeaseGrant | None, self_node: str) -> str | None:
        """Record a peer's ``job.started``; return why it was not taken as a gang member (None: taken,
        or kept until this node's grant of the lease arrives)."""
        if claim.node_id == self_node:
            return "it comes from this node"
        if grant is None:
            self._keep_early(claim)
            return None
        return self._join(claim, grant)

    def adopt(self, grant: LeaseGrant) -> list[str]:
        """This node now holds ``grant``: check the claims that arrived before it; return why each
        refused one was refused."""
        early = self._early.pop(grant.lease_id, {})
        self._held.setdefault(grant.lease_id, {})
        refused = [self._join(claim, grant) for claim in early.values()]
        return [why for why in refused if why is not None]

    def members(self, grant: LeaseGrant, self_node: str) -> frozenset[str]:
        """The other nodes of ``grant``'s gang known so far: its coordinator (when that is not this
        node) and every node whose ``job.started`` matched the lease."""
        nodes = set(self._held.get(grant.lease_id, {}))
        world = grant.world
        if world is not None and world.coordinator_node != self_node:
            nodes.add(world.coordinator_node)
        nodes.discard(self_node)
        return frozenset(nodes)

    def forget(self, lease_id: str) -> None:
        """The lease ended on this node."""
        self._held.pop(lease_id, None)
        self._early.pop(lease_id, None)

    def _keep_early(self, claim: PeerClaim) -> None:
        claims = self._early.get(claim.lease_id)
        if claims is None:
            claims = self._early[claim.lease_id] = {}
            while len(self._early) > self._early_leases:
                self._early.popitem(last=False)
        if len(claims) < _EARLY_CLAIMS_PER_LEASE:
            claims.setdefault(claim.node_id, claim)

    def _join(self, claim: PeerClaim, grant: LeaseGrant) -> str | None:
        mismatch = _mismatch(grant, job_id=claim.job_id, epoch=claim.epoch)
        if mismatch is not None:
            return mismatch
        world = grant.world
        if world is None or world.num_nodes < 2:
            return f"lease {grant.lease_id} runs on this node alone"
        if claim.node_id == world.coordinator_node:
            return None  # the grant already names it
        claims = self._held.setdefault(grant.lease_id, {})
        if claim.node_id in claims:
            return None
        # Places for nodes other than the coordinator (which the grant names) and this one.
        places = world.num_nodes - 1 if world.node_rank == 0 else world.num_nodes - 2
        if len(claims) >= places:
            return f"lease {grant.lease_id}'s {world.num_nodes} nodes are all known already"
        claims[claim.node_id] = claim
        return None
