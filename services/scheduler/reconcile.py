"""Reconciliation: what the workers' reports and the passing of time imply for the leases.

Pure functions of the state and ``now``: nothing here reads a clock, writes the book or sends a
command. The service gathers the inputs (``nodes.py``, ``facts.py``), calls these, and commits or
executes what they decide: *release* a lease (its job waits again, or ends), *revoke* a lease the
scheduler does not hold, or leave things as they are. Each rule is a table of cases in
``tests/unit/scheduler/test_reconcile.py``.

The rules (docs/control-plane.md, "A round", step 6; docs/scheduler.md, "Failure handling"):

* **Heartbeats** (:func:`reconcile_heartbeat`): a lease granted more than ``reconcile_grace_s``
  before a heartbeat that does not list it, and missing from the node's heartbeats for
  ``reconcile_grace_s``, is lost: released. A worker drops a lease right after queueing its
  ``job.completed``, a durable fact that may lag the heartbeat, so an omission alone proves nothing;
  the grace lets the fact land first (releasing early would requeue a finished job). A lease a node
  lists that the scheduler does not hold, of this epoch or an older one, is a stray: revoked (a
  newer epoch's belongs to another leader).
* **A ``job.started`` for a lease we do not hold** (:func:`judge_started`): recent (younger than
  the lease TTL), it runs on GPUs nobody else may count on: revoked; older, it is history replayed
  on a new consumer.
* **The sweep** (:func:`sweep_releases`): a node silent for the lease TTL is dead (``Inventory.sweep``
  decides that, on monotonic time) and every lease on it is released; its worker has suspended its
  jobs itself by then. A revoke past its deadline that no round is waiting on is released too.
* **A job's end** (:func:`judge_finished`): which transition a ``job.completed`` or ``job.failed``
  is, given the lease the job holds now.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass

from schemas.nodes import HeldLease
from services.core.state import JobStatus
from services.scheduler.leases import Lease


@dataclass(frozen=True, slots=True)
class HeartbeatVerdict:
    """What one heartbeat implies."""

    lost: tuple[str, ...]
    """Leases the node stopped listing ``reconcile_grace_s`` ago or more: release them."""
    strays: tuple[Lease, ...]
    """Leases the node runs that the scheduler does not hold: revoke them."""
    missing_since: dict[str, float]
    """The new record of omissions: lease id -> ``ts`` of the first heartbeat that did not list it."""


def reconcile_heartbeat(
    node_id: str,
    reported: Sequence[HeldLease],
    held: Mapping[str, Lease],
    on_node: Set[str],
    missing_since: Mapping[str, float],
    *,
    ts: float,
    grace_s: float,
    epoch: int,
    now: float,
) -> HeartbeatVerdict:
    """Compare the leases a node reports (``reported``, its heartbeat at ``ts``) with those the
    scheduler holds on it (``on_node``, ids into ``held``, every active lease).

    ``missing_since`` is the record the previous heartbeats left (all nodes); the verdict carries
    the next one, without leases reported again or no longer held. ``epoch`` is the term's; a stray
    is revoked under it and given ``now`` as its grant time."""
    listed = {h.lease_id for h in reported}
    cutoff = ts - grace_s
    missing = {lease_id: first for lease_id, first in missing_since.items() if lease_id not in listed}
    lost: list[str] = []
    for lease_id in on_node:
        if lease_id in listed or held[lease_id].granted_at >= cutoff:
            continue
        first = missing.setdefault(lease_id, ts)
        if first <= cutoff:
            lost.append(lease_id)
    missing = {lease_id: first for lease_id, first in missing.items() if lease_id in held}
    strays = tuple(
        stray_lease(node_id, lease_id=h.lease_id, job_id=h.job_id, gpus=h.gpus, epoch=h.epoch, now=now)
        for h in reported
        if h.lease_id not in on_node and h.epoch <= epoch
    )
    return HeartbeatVerdict(tuple(lost), strays, missing)


def stray_lease(node_id: str, *, lease_id: str, job_id: str, gpus: Iterable[int], epoch: int, now: float) -> Lease:
    """A lease a worker runs that the scheduler does not hold, as a ``Lease`` to revoke."""
    return Lease(lease_id, job_id, ((node_id, tuple(gpus)),), epoch, now)


class Started(enum.Enum):
    """What a ``job.started`` fact is."""

    OURS = "ours"
    """About a lease the scheduler holds for that job: the run is up."""
    IGNORED = "ignored"
    """Replayed history (older than the lease TTL), or the job's own lease under another name."""
    STRAY = "stray"
    """A lease the scheduler does not hold is running: revoke it."""


def judge_started(
    lease_id: str,
    job_id: str,
    ts: float,
    *,
    held: Lease | None,
    job_lease: Lease | None,
    now: float,
    lease_ttl_s: float,
) -> Started:
    """``held``: the active lease named ``lease_id``, if any; ``job_lease``: the lease ``job_id``
    holds now, if any."""
    if held is not None and held.job_id == job_id:
        return Started.OURS
    if now - ts > lease_ttl_s:
        return Started.IGNORED  # history replayed on a new consumer: nothing runs there any more
    if job_lease is not None and job_lease.lease_id == lease_id:
        return Started.IGNORED
    # Granted by a deposed leader, or released at its deadline: nobody else may count on those GPUs.
    return Started.STRAY


@dataclass(frozen=True, slots=True)
class SweepVerdict:
    """Leases the sweep releases."""

    dead: tuple[str, ...]
    """Leases on nodes that just went silent past the lease TTL (each lease once, node by node)."""
    overdue: tuple[str, ...]
    """Leases past their revoke deadline that no round waits for (a round releases its own)."""

    @property
    def released(self) -> tuple[str, ...]:
        return self.dead + self.overdue


def sweep_releases(
    dead_nodes: Iterable[str],
    held: Mapping[str, Lease],
    on_node: Mapping[str, Set[str]],
    *,
    now: float,
    awaited: Callable[[str], bool],
) -> SweepVerdict:
    """``dead_nodes``: those newly silent for the lease TTL; ``held``: every active lease, with
    ``on_node`` its index by node; ``awaited``: whether a round waits for a lease (it then releases
    it itself at its deadline)."""
    dead: list[str] = []
    seen: set[str] = set()
    for node_id in dead_nodes:
        for lease_id in sorted(on_node.get(node_id, ())):
            if lease_id not in seen:  # a multi-node lease with several nodes gone is released once
                seen.add(lease_id)
                dead.append(lease_id)
    overdue = tuple(
        lease.lease_id
        for lease in held.values()
        if lease.lease_id not in seen
        and lease.revoke_deadline is not None
        and lease.revoke_deadline <= now
        and not awaited(lease.lease_id)
    )
    return SweepVerdict(tuple(dead), overdue)


class Finished(enum.Enum):
    """Which transition a ``job.completed`` or ``job.failed`` is."""

    RELEASE = "release"
    """About the lease the job holds (or naming none): release it with the final status."""
    WITHOUT_LEASE = "without-lease"
    """The job holds no lease (its run was released as lost before the fact landed): end it."""
    COMPLETED_EARLIER = "completed-earlier"
    """Completed under an earlier lease, released before this fact landed, while a re-run holds
    another: the work is done, so the job completes and the re-run is revoked (``terminate``)."""
    IGNORED = "ignored"
    """A failure of an earlier run, while the job runs under another lease."""


def judge_finished(status: JobStatus, fact_lease_id: str | None, job_lease_id: str | None) -> Finished:
    """``fact_lease_id``: the lease the fact names (None: none named); ``job_lease_id``: the lease
    the job holds now (None: none)."""
    if job_lease_id is None:
        return Finished.WITHOUT_LEASE
    if fact_lease_id is None or fact_lease_id == job_lease_id:
        return Finished.RELEASE
    if status is JobStatus.COMPLETED:
        return Finished.COMPLETED_EARLIER
    return Finished.IGNORED


def fact_time(ts: float, start: float | None, now: float) -> float:
    """When a worker's fact happened, on the scheduler's clock as far as it can tell: the fact's
    ``ts`` within ``[start, now]`` (``start``: when the run began, if known)."""
    return min(now, max(ts, start if start is not None else ts))
