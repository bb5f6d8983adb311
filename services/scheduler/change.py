"""A :class:`Change`: the store operations of one book transition plus its in-memory effect.

The book computes a transition without touching memory; the caller commits ``ops`` (one store
request) and only then calls :meth:`Change.commit`, which applies the effects in the order they
were recorded. Nothing in memory moves if the write fails. Every job update names the version the
book last wrote plus the updates to that job recorded before it in the same change
(``expected_version``), so a deposed leader's late write fails with ``StaleWriteError``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import cast

from schemas.leases import RevokeReason
from services.core.lifecycle import Changes
from services.runtime.store import InsertJobs, JobChanges, LeaseState, UpdateJob, UpsertLeases, WriteOp
from services.runtime.store.records import JOB_CHANGE_FIELDS
from services.scheduler.entry import JobEntry
from services.scheduler.leases import Lease

_ENTRY_FIELDS = frozenset({"checkpoint_path", "checkpoint_iteration", "reason", "exit_code", "signal"})
"""Stored job fields the book keeps on the ``JobEntry`` rather than on its ``JobState``."""


@dataclass(slots=True)
class Change:
    """Store operations plus the in-memory effect to apply once they committed."""

    ops: list[WriteOp] = field(default_factory=list)
    _effects: list[Callable[[], None]] = field(default_factory=list)
    _bumps: dict[str, int] = field(default_factory=dict)
    revokes: list[tuple[Lease, RevokeReason]] = field(default_factory=list)
    """Leases to revoke on the workers after the commit (unknown ones reported by a node, ...)."""
    released: list[str] = field(default_factory=list)
    """Lease ids this change releases (the executor wakes whoever waits on them)."""

    def then(self, effect: Callable[[], None]) -> None:
        self._effects.append(effect)

    def update_job(self, entry: JobEntry, changes: JobChanges) -> None:
        job_id = entry.state.job_id
        bumps = self._bumps.get(job_id, 0)
        self.ops.append(UpdateJob(job_id, changes, expected_version=entry.version + bumps))
        self._bumps[job_id] = bumps + 1

        def effect() -> None:
            entry.version += 1
            state = entry.state
            for key, value in changes.items():
                if key in _ENTRY_FIELDS:  # kept beside the job's state, not in it
                    setattr(entry, key, value)
                else:
                    setattr(state, key, value)

        self.then(effect)

    def transition(self, entry: JobEntry, record: Changes, extra: JobChanges | None = None) -> None:
        """A lifecycle transition of ``entry``'s job, recorded with ``into=record``
        (``services.core.lifecycle``), plus ``extra`` columns written with it: the fields the store
        keeps are written, and on commit every recorded field is applied to the job (``gpus`` too,
        which the store does not keep)."""
        fields = record.fields()
        memory = {key: value for key, value in fields.items() if key not in JOB_CHANGE_FIELDS}
        changes = cast(JobChanges, {key: value for key, value in fields.items() if key in JOB_CHANGE_FIELDS})
        if extra:
            changes.update(extra)
        self.update_job(entry, changes)
        if memory:
            state = entry.state

            def effect() -> None:
                for key, value in memory.items():
                    setattr(state, key, value)

            self.then(effect)

    def put_lease(self, lease: Lease, state: LeaseState, deadline: float | None = None) -> None:
        rows = lease.records(state)
        if deadline is not None:
            rows = tuple(replace(r, revoke_deadline=deadline) for r in rows)
        self.ops.append(UpsertLeases(rows))

    def commit(self) -> None:
        for effect in self._effects:
            effect()
        self._effects.clear()

    @property
    def is_empty(self) -> bool:
        return not self.ops and not self._effects and not self.revokes


def merge(changes: Iterable[Change | None]) -> Change:
    """One change doing all of ``changes`` in order (one store request, one commit)."""
    merged = Change()
    for change in changes:
        if change is None:
            continue
        merged.ops.extend(change.ops)
        merged._effects.extend(change._effects)
        merged.revokes.extend(change.revokes)
        merged.released.extend(change.released)
    merged.ops = _batched(merged.ops)
    return merged


def _batched(ops: list[WriteOp]) -> list[WriteOp]:
    """Reorder a merged change's operations so the store can run each kind as one bulk statement:
    new jobs, then every lease row, then job updates grouped by the columns they set.

    The store merges only *consecutive* operations of one shape, and a grant alone alternates lease
    and job writes (100 grants: 200 statements instead of 2). Reordering is safe here: lease rows
    only reference jobs that exist (inserted first), and updates are grouped only when no job is
    updated twice, so each job's own updates keep their order.
    """
    inserts = [op for op in ops if isinstance(op, InsertJobs)]
    leases = [row for op in ops if isinstance(op, UpsertLeases) for row in op.leases]
    updates = [op for op in ops if isinstance(op, UpdateJob)]
    others = [op for op in ops if not isinstance(op, InsertJobs | UpsertLeases | UpdateJob)]
    if others or len({u.job_id for u in updates}) != len(updates):
        return ops
    updates.sort(key=lambda u: tuple(sorted(u.changes)))
    batched: list[WriteOp] = [*inserts]
    if leases:
        batched.append(UpsertLeases(tuple(leases)))
    batched.extend(updates)
    return batched
