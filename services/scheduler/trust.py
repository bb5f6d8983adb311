"""Facts checked against their source, and who may operate on a job (issue 13).

The broker vouches for who speaks: a worker publishes only on subjects ending in its own node id
(``job.completed.<node>``, ``node.heartbeat.<node>``) and the codec refuses a payload whose
``node_id`` differs from that token, so ``event.node_id`` *is* the authenticated node; a user
publishes only ``job.cancel.<user>`` and ``query.jobs.<user>``. What the broker cannot know is
whether that node may speak about the lease and job it names. This module decides that, as pure
functions of what the scheduler knows about the lease (:class:`LeaseSource`, from the book or from
the store's lease rows, which a release keeps):

* a job fact is about a lease that exists, for that job, granted in the fact's epoch, and it comes
  from a node of that lease (:func:`check_fact`): the coordinator (rank 0's node, which alone
  reports the job-wide facts and writes checkpoints) for ``job.suspended``, ``job.completed`` and
  ``job.checkpointed``; any node of the lease for ``job.started`` and ``job.failed`` (each node
  launches its ranks and any rank may fail);
* a heartbeat names no lease the scheduler holds on another node or for another job
  (:func:`foreign_leases`);
* a job's owner (``spec.user``) or an operator may cancel or read it (:func:`may_operate`).

A refusal is a :class:`Refusal` with a reason. The caller persists nothing for it (no store write,
no event id marked applied, no epoch moved), counts it by reason and logs it rate-limited
(:class:`RefusalLog`), and acks the message: a forged fact is neither retried nor dead-lettered,
where an attacker could fill the dead-letter stream.
"""

from __future__ import annotations

import enum
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from schemas.nodes import HeldLease
from services.runtime.store import LeaseRecord
from services.scheduler.leases import Lease, split_row_id

__all__ = [
    "LeaseSource",
    "Refusal",
    "RefusalLog",
    "check_fact",
    "foreign_leases",
    "may_operate",
    "permission_denied",
    "source_from_rows",
]


class Refusal(enum.StrEnum):
    """Why a message was not applied (the key of the refusal counters)."""

    UNKNOWN_LEASE = "unknown_lease"
    """No lease by that id: neither held nor ever stored for that job."""
    OTHER_NODE = "other_node"
    """The lease is not on the node that spoke (or that node is not the one that reports it)."""
    OTHER_JOB = "other_job"
    """The lease belongs to another job."""
    WRONG_EPOCH = "wrong_epoch"
    """The fact's epoch is not the epoch the lease was granted in."""
    NO_LEASE = "no_lease"
    """A fact naming no lease, about a job that holds none on the speaking node."""
    PERMISSION_DENIED = "permission_denied"
    """A user acted on a job that is not theirs."""


@dataclass(frozen=True, slots=True)
class LeaseSource:
    """Who may speak about one lease: its job, its nodes in rank order, its grant epoch."""

    lease_id: str
    job_id: str
    nodes: tuple[str, ...]
    epoch: int

    @classmethod
    def of(cls, lease: Lease) -> LeaseSource:
        return cls(lease.lease_id, lease.job_id, lease.nodes, lease.epoch)

    @property
    def coordinator(self) -> str:
        return self.nodes[0]


def source_from_rows(lease_id: str, rows: Iterable[LeaseRecord]) -> LeaseSource | None:
    """The lease ``lease_id`` from its stored rows (one per node, ``<lease_id>-n<rank>``, kept after
    its release); None if no row is of that lease."""
    ranked: list[tuple[int, LeaseRecord]] = []
    for row in rows:
        try:
            wire_id, rank = split_row_id(row.lease_id)
        except ValueError:
            continue  # not a row this scheduler wrote: it vouches for nothing
        if wire_id == lease_id:
            ranked.append((rank, row))
    if not ranked:
        return None
    ranked.sort(key=lambda pair: pair[0])
    first = ranked[0][1]
    return LeaseSource(lease_id, first.job_id, tuple(row.node_id for _, row in ranked), first.epoch)


def check_fact(
    node_id: str, job_id: str, epoch: int | None, source: LeaseSource | None, *, coordinator_only: bool
) -> Refusal | None:
    """Whether ``node_id`` may report this fact about ``job_id`` under ``source``'s lease: None if it
    may, else why not. ``epoch`` None (a ``job.failed`` of a launch that failed before its lease was
    set up) is not checked; ``coordinator_only``: only rank 0's node reports this kind of fact."""
    if source is None:
        return Refusal.UNKNOWN_LEASE
    if source.job_id != job_id:
        return Refusal.OTHER_JOB
    allowed = (source.coordinator,) if coordinator_only else source.nodes
    if node_id not in allowed:
        return Refusal.OTHER_NODE
    if epoch is not None and epoch != source.epoch:
        return Refusal.WRONG_EPOCH
    return None


def foreign_leases(node_id: str, reported: Sequence[HeldLease], held: Mapping[str, Lease]) -> list[str]:
    """Leases a heartbeat of ``node_id`` lists that the scheduler holds for another node or another
    job: a node may speak only about its own leases. (A lease the scheduler does not hold at all is
    a stray on the speaking node, revoked there: ``reconcile.reconcile_heartbeat``.)"""
    foreign: list[str] = []
    for item in reported:
        lease = held.get(item.lease_id)
        if lease is not None and (node_id not in lease.nodes or lease.job_id != item.job_id):
            foreign.append(item.lease_id)
    return foreign


def may_operate(requester: str, owner: str, operators: Iterable[str]) -> bool:
    """Whether ``requester`` may cancel or read a job of ``owner``: its owner or an operator."""
    return requester == owner or requester in operators


def permission_denied(requester: str, verb: str, owner: str) -> str:
    """The refusal users read: who may not do what to whose job (the owner's name, nothing more)."""
    return f"permission denied: {requester} cannot {verb} {owner}'s job"


class RefusalLog:
    """Refusals counted by ``(what, reason)`` and logged at most once per ``every_s`` per key.

    A flood of forged facts must not become a flood of log lines: the first of each key is logged
    at once, later ones are counted and summed into the next line of that key after ``every_s``."""

    def __init__(self, monotonic: Callable[[], float], *, every_s: float = 10.0, logger: logging.Logger) -> None:
        self.counts: Counter[str] = Counter()
        self._monotonic = monotonic
        self._every_s = every_s
        self._log = logger
        self._last: dict[str, float] = {}
        self._quiet: Counter[str] = Counter()

    def refuse(self, what: str, reason: Refusal, detail: str) -> None:
        """Count and maybe log one refusal; ``what`` is the subject (a pattern's ``.*`` dropped)."""
        what = what.removesuffix(".*")
        key = f"{what}:{reason.value}"
        self.counts[key] += 1
        now = self._monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self._every_s:
            self._quiet[key] += 1
            return
        self._last[key] = now
        more = self._quiet.pop(key, 0)
        suffix = f" ({more} more refused since the last line)" if more else ""
        self._log.warning("refused %s (%s): %s%s", what, reason.value, detail, suffix)

    def as_dict(self) -> dict[str, int]:
        return dict(self.counts)
