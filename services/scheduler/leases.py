"""The scheduler's in-memory lease: one wire ``lease_id`` over one or more nodes.

A multi-node job gets one grant per node, all with the same ``lease_id`` (``schemas.leases``); the
store keys lease rows by id, so each node's part is stored as its own row ``<lease_id>-n<rank>``.
``parts[0]`` is the coordinator (rank 0's node), the one that receives revokes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from schemas.leases import RevokeReason
from services.runtime.store import LeaseRecord, LeaseState

_RANK_SEPARATOR = "-n"


def new_lease_id() -> str:
    """A fresh lease id: a subject token without the row separator."""
    return "L" + uuid.uuid4().hex


def row_id(lease_id: str, rank: int) -> str:
    return f"{lease_id}{_RANK_SEPARATOR}{rank}"


def split_row_id(row: str) -> tuple[str, int]:
    """``(lease_id, rank)`` of a stored lease row id."""
    lease_id, _, rank = row.rpartition(_RANK_SEPARATOR)
    if not lease_id or not rank.isdigit():
        raise ValueError(f"lease row id {row!r} is not <lease_id>{_RANK_SEPARATOR}<rank>")
    return lease_id, int(rank)


@dataclass(slots=True)
class Lease:
    """GPUs held by one job under one leader epoch, until revoked (Blox §7, optimistic leases)."""

    lease_id: str
    job_id: str
    parts: tuple[tuple[str, tuple[int, ...]], ...]
    """``(node_id, local GPU indices)`` in rank order; ``parts[0]`` is the coordinator."""
    epoch: int
    granted_at: float
    state: LeaseState = LeaseState.GRANTED
    revoke_deadline: float | None = None
    reason: RevokeReason | None = None
    """Why it is being revoked (kept in memory only; the job's status carries cancel/terminate)."""
    started: bool = False
    stopped: bool = False
    """The coordinator reported ``job.suspended`` for this revoke (seen on core NATS); its release
    is being committed by the durable consumer, and its GPUs may already be granted again."""
    global_ids: tuple[int, ...] = ()
    """The GPUs as global ids of topology ``global_version`` (a cache for snapshots)."""
    global_version: int = -1
    from_iteration: int = 0
    """The iteration this run resumes from (the grant's ``resume_iteration``; 0 for a fresh start):
    a reported iteration past it is progress of this run (``resume.py``). Memory only."""
    progress_at: float | None = None
    """When this run's first progress was reported (None: not yet, still restoring). Memory only."""

    @property
    def coordinator(self) -> str:
        return self.parts[0][0]

    @property
    def gpu_count(self) -> int:
        return sum(len(gpus) for _, gpus in self.parts)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(node for node, _ in self.parts)

    def records(self, state: LeaseState | None = None) -> tuple[LeaseRecord, ...]:
        """The store rows of this lease (with ``state`` instead of its own, when given)."""
        st = self.state if state is None else state
        return tuple(
            LeaseRecord(
                lease_id=row_id(self.lease_id, rank),
                job_id=self.job_id,
                node_id=node,
                gpu_indices=gpus,
                epoch=self.epoch,
                granted_at=self.granted_at,
                state=st,
                revoke_deadline=self.revoke_deadline,
            )
            for rank, (node, gpus) in enumerate(self.parts)
        )


def leases_from_records(records: Iterable[LeaseRecord]) -> list[Lease]:
    """Group stored rows back into leases (rows of released leases are skipped)."""
    grouped: dict[str, list[tuple[int, LeaseRecord]]] = {}
    for record in records:
        if record.state is LeaseState.RELEASED:
            continue
        lease_id, rank = split_row_id(record.lease_id)
        grouped.setdefault(lease_id, []).append((rank, record))
    leases: list[Lease] = []
    for lease_id, rows in grouped.items():
        rows.sort(key=lambda r: r[0])
        first = rows[0][1]
        leases.append(
            Lease(
                lease_id=lease_id,
                job_id=first.job_id,
                parts=tuple((r.node_id, tuple(r.gpu_indices)) for _, r in rows),
                epoch=first.epoch,
                granted_at=first.granted_at,
                state=first.state,
                revoke_deadline=first.revoke_deadline,
            )
        )
    return leases
