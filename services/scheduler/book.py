"""The leader's in-memory copy of its jobs and leases, and every state transition as store writes.

The store is authoritative; the book mirrors the unfinished jobs and the active leases so that a
round's snapshot costs memory reads, not a 20,000-row query. Each transition is computed as a
:class:`Change`: the store operations *and* the in-memory effect. The caller commits the operations
(``Store.apply_event`` for an event, so a redelivery is a no-op) and only then calls
``Change.commit()``; nothing in memory moves if the write fails. Every job update names the version
the book last wrote (``expected_version``), so a deposed leader's late write fails with
``StaleWriteError`` instead of overwriting its successor's.

Transitions (admit, launch, suspend or requeue, finish) and progress are ``services.core.lifecycle``'s,
the very functions the simulator applies to its jobs: the book records each one (``into=Changes()``)
to write it to the store, and applies the recorded values to the job when ``Change.commit()`` runs.

Attained service (Tiresias' GPU-seconds, what LAS ranks by): a running job's stored value is the
service it had when its lease started; ``refresh(now)`` adds ``gpus x (now - last_start_time)``
for the snapshot, and a release folds the same amount into the stored value
(``lifecycle.progress``).

Restore: ``refresh(now)`` also sets a running job's ``resumed_at`` (``resume.py``): its run's first
reported progress, bounded by ``launch + restore_allowance_s``, so time-slicing policies keep a job
that is still restoring its checkpoint.

Checkpoints: an entry keeps its checkpoint's path *and* the iteration that checkpoint holds
(``checkpoint_iteration``, stored beside the path). A new run resumes from that iteration
(``resume_iteration``), not from ``iterations_done``, which follows the job-metrics past the
checkpoint while a run progresses. A running job's periodic checkpoints (``job.checkpointed``,
``checkpointed``) move it forward while the run goes on. A run that stops without a newer
checkpoint (its node went silent, its lease was lost or expired, its revoke passed the deadline)
loses the progress past the newest checkpoint known: the job is requeued with ``iterations_done``
back at that checkpoint's iteration (0 without one), the work it must do again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import cast

from schemas.job import JobSpec
from schemas.leases import RevokeReason
from services.core import lifecycle
from services.core.lifecycle import Changes
from services.core.state import JobState, JobStatus
from services.runtime.consumer import RetryLater
from services.runtime.store import (
    InsertJobs,
    JobChanges,
    JobRecord,
    LeaseState,
    UpdateJob,
    UpsertLeases,
    WriteOp,
)
from services.runtime.store.records import JOB_CHANGE_FIELDS
from services.scheduler.leases import Lease
from services.scheduler.resume import DEFAULT_RESTORE_ALLOWANCE_S, resumed_at
from services.scheduler.topology import Topology, UnknownGpuError

log = logging.getLogger("roundhouse.scheduler.book")


class JobNotArrivedError(RetryLater, LookupError):
    """An event names a job whose ``job.arrived`` the scheduler has not applied yet (retried)."""


@dataclass(slots=True)
class JobEntry:
    """One unfinished job (or a finished one whose lease is still being revoked)."""

    state: JobState
    version: int
    checkpoint_path: str | None = None
    checkpoint_iteration: int | None = None
    """The iteration the checkpoint at ``checkpoint_path`` holds; None without a checkpoint, or when
    nobody reported it (see ``JobBook.resume_iteration``)."""
    lease: Lease | None = None
    service0: float = 0.0
    """Attained service when the current lease started."""
    executed0: float = 0.0
    reason: str | None = None
    """Why it was held, rejected, failed (for ``roundhouse jobs``; memory only)."""
    requeued_since: float | None = None
    """``queued_since`` before the current lease, to restore if its grant fails."""
    released_lease_id: str | None = None
    released_lost: bool = False
    """Whether the run released last was released with no checkpoint reported (lost with its node or
    agent): only such a run may still report a newer checkpoint once another run was granted."""
    """The job's lease released last (memory only): a ``job.checkpointed`` of that run that lands
    after the release still counts (see ``JobBook.checkpointed``)."""


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
                if key == "checkpoint_path":
                    entry.checkpoint_path = value  # type: ignore[assignment]
                elif key == "checkpoint_iteration":
                    entry.checkpoint_iteration = value  # type: ignore[assignment]
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


class JobBook:
    """Unfinished jobs and active leases of the current leader."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobEntry] = {}
        self.leases: dict[str, Lease] = {}
        self.active: dict[str, JobState] = {}
        """What policies see: admitted, unfinished jobs, waiting or running under a granted lease
        (jobs whose lease is being revoked, or whose grant is in flight, are left out)."""
        self.by_node: dict[str, set[str]] = {}
        """Active lease ids by node (heartbeat reconciliation, dead nodes)."""
        self.state_version = 0
        self._next_seq = 1

    def _index_lease(self, lease: Lease) -> None:
        self.leases[lease.lease_id] = lease
        for node in lease.nodes:
            self.by_node.setdefault(node, set()).add(lease.lease_id)

    def _unindex_lease(self, lease: Lease) -> None:
        self.leases.pop(lease.lease_id, None)
        for node in lease.nodes:
            ids = self.by_node.get(node)
            if ids is not None:
                ids.discard(lease.lease_id)
                if not ids:
                    del self.by_node[node]

    # --- loading ---------------------------------------------------------------------------
    def load(self, records: Iterable[JobRecord], leases: Iterable[Lease]) -> list[str]:
        """Fill the book from the store; returns ids of RUNNING jobs without a lease (requeued)."""
        self.jobs.clear()
        self.leases.clear()
        self.by_node.clear()
        self.active.clear()
        for record in records:
            state = record.to_state()
            state.seq = record.seq
            state.queued_since = record.queued_since
            state.longest_wait_s = record.longest_wait_s
            entry = JobEntry(state, record.version, record.checkpoint_path, record.checkpoint_iteration)
            entry.service0 = record.attained_service
            entry.executed0 = record.executed_time
            self.jobs[record.job_id] = entry
            self._next_seq = max(self._next_seq, record.seq + 1)
        for lease in leases:
            owner = self.jobs.get(lease.job_id)
            if owner is None:
                continue
            self._index_lease(lease)
            owner.lease = lease
            lease.from_iteration = self.resume_iteration(owner) or 0
        orphans = [j for j, e in self.jobs.items() if e.state.status is JobStatus.RUNNING and e.lease is None]
        for entry in self.jobs.values():
            self._reindex(entry)
        self.state_version += 1
        return orphans

    # --- views -----------------------------------------------------------------------------
    def entry(self, job_id: str) -> JobEntry | None:
        return self.jobs.get(job_id)

    def waiting_count(self) -> int:
        return sum(1 for j in self.active.values() if j.status is JobStatus.QUEUED)

    @staticmethod
    def resume_iteration(entry: JobEntry) -> int | None:
        """The iteration a new run of ``entry``'s job resumes from: that of its checkpoint (the
        grant's ``resume_iteration``); None when it has none and starts afresh."""
        if not entry.checkpoint_path:
            return None
        if entry.checkpoint_iteration is not None:
            return entry.checkpoint_iteration
        # A checkpoint whose iteration nobody reported: a job.suspended from a worker that predates
        # checkpoint_iteration (schema 1 stores were filled from iterations_done when upgraded, see
        # services/runtime/store/migrations.py). Such a fact set iterations_done to the checkpoint's
        # iteration, and a run lost later leaves it there (``release``), so it is the best guess
        # left; the training client warns if the checkpoint holds another iteration.
        return entry.state.iterations_done

    def refresh(
        self, now: float, topology: Topology, *, restore_allowance_s: float = DEFAULT_RESTORE_ALLOWANCE_S
    ) -> None:
        """Bring running jobs' attained service (and the service their run began with), global GPU
        ids and ``resumed_at`` (their first progress, or ``restore_allowance_s`` after the launch if
        none was seen by then) up to ``now`` for a snapshot."""
        for lease in self.leases.values():
            if lease.state is not LeaseState.GRANTED:
                continue
            entry = self.jobs[lease.job_id]
            state = entry.state
            if entry.lease is not lease or state.status is not JobStatus.RUNNING:
                continue
            start = state.last_start_time if state.last_start_time is not None else now
            lifecycle.progress(
                state, now, since=start, service0=entry.service0, executed0=entry.executed0, gpus=lease.gpu_count
            )
            state.run_start_service = entry.service0
            state.resumed_at = resumed_at(start, lease.progress_at, restore_allowance_s)
            try:
                state.gpus = topology.lease_gpus(lease)
            except UnknownGpuError:
                state.gpus = ()

    def held_gpus(self) -> Iterator[tuple[str, Lease]]:
        """Every active lease (granted or revoking) with its job id: GPUs nobody else may take."""
        for lease in self.leases.values():
            yield lease.job_id, lease

    def _reindex(self, entry: JobEntry) -> None:
        state = entry.state
        job_id = state.job_id
        status = state.status
        if status is JobStatus.QUEUED or (
            status is JobStatus.RUNNING and entry.lease is not None and entry.lease.state is LeaseState.GRANTED
        ):
            self.active[job_id] = state
        else:
            self.active.pop(job_id, None)
            if status.is_final and entry.lease is None:
                self.jobs.pop(job_id, None)

    def _touch(self, change: Change, entry: JobEntry) -> None:
        def effect() -> None:
            self._reindex(entry)
            self.state_version += 1

        change.then(effect)

    # --- admission's facts -----------------------------------------------------------------
    def arrived(self, job_id: str, spec: JobSpec, submit_time: float) -> Change | None:
        """A new job (HELD until admission accepts it); None if the book already has it."""
        if job_id in self.jobs:
            return None
        seq = self._next_seq
        self._next_seq += 1
        record = JobRecord(job_id=job_id, spec=spec, submit_time=submit_time, status=JobStatus.HELD, seq=seq)
        change = Change([InsertJobs((record,))])

        def effect() -> None:
            state = record.to_state()
            state.seq = seq
            self.jobs[job_id] = JobEntry(state, record.version)
            self.state_version += 1

        change.then(effect)
        return change

    def accepted(self, job_id: str, now: float) -> Change:
        entry = self.jobs.get(job_id)
        if entry is None:
            raise JobNotArrivedError(f"job {job_id!r} was accepted before its job.arrived was applied")
        change = Change()
        if entry.state.status is JobStatus.HELD:
            record = Changes()
            lifecycle.admit(entry.state, now, into=record)
            change.transition(entry, record)
            self._touch(change, entry)
        return change

    def held(self, job_id: str, reason: str) -> Change:
        entry = self.jobs.get(job_id)
        change = Change()
        if entry is not None:
            change.then(lambda: setattr(entry, "reason", reason))
        return change

    def rejected(self, job_id: str, reason: str, now: float) -> Change:
        entry = self.jobs.get(job_id)
        change = Change()
        if entry is not None and entry.state.status is JobStatus.HELD:
            entry.reason = reason
            record = Changes()
            lifecycle.finish(entry.state, JobStatus.REJECTED, now, into=record)
            change.transition(entry, record)
            self._touch(change, entry)
        return change

    # --- user intent and policy decisions ---------------------------------------------------
    def end(
        self,
        job_id: str,
        status: JobStatus,
        reason: RevokeReason,
        *,
        now: float,
        grace_deadline: float,
        message: str | None = None,
        extra: JobChanges | None = None,
    ) -> Change:
        """Cancel (``CANCELLED``) or terminate (``COMPLETED``) a job: a waiting job ends now; a running
        one gets its final status now and its lease is revoked (``change.revokes``). ``extra`` columns
        are written with the status."""
        entry = self.jobs.get(job_id)
        change = Change()
        if entry is None or entry.state.status.is_final:
            return change
        if message:
            change.then(lambda: setattr(entry, "reason", message))
        lease = entry.lease
        if lease is None:
            record = Changes()
            lifecycle.finish(entry.state, status, now, into=record)
            change.transition(entry, record, extra)
        else:
            # Its final status now, so that no round ranks it again; it finishes when its run stops
            # (``release`` keeps this status and records the finish time).
            change.update_job(entry, {"status": status, **(extra or {})})
            if lease.state is LeaseState.GRANTED:
                self._revoking(change, lease, reason, grace_deadline)
        self._touch(change, entry)
        return change

    def requeue(self, job_id: str, now: float) -> Change | None:
        """A job the store says is RUNNING but that holds no lease (an interrupted grant): it waits again."""
        entry = self.jobs.get(job_id)
        if entry is None or entry.lease is not None or entry.state.status is not JobStatus.RUNNING:
            return None
        change = Change()
        # Its run is gone with whatever it did past the checkpoint: it resumes from there.
        record = Changes()
        lifecycle.suspend(entry.state, now, preempted=False, into=record)
        change.transition(entry, record, self._rewind(entry.checkpoint_path, entry.checkpoint_iteration))
        self._touch(change, entry)
        return change

    def revoke(self, job_id: str, reason: RevokeReason, deadline: float) -> Change | None:
        """Mark a running job's lease REVOKING (a plan's suspension); None if it is not granted."""
        entry = self.jobs.get(job_id)
        if entry is None or entry.lease is None or entry.lease.state is not LeaseState.GRANTED:
            return None
        change = Change()
        self._revoking(change, entry.lease, reason, deadline)
        self._touch(change, entry)
        return change

    def _revoking(self, change: Change, lease: Lease, reason: RevokeReason, deadline: float) -> None:
        change.put_lease(lease, LeaseState.REVOKING, deadline)

        def effect() -> None:
            lease.state = LeaseState.REVOKING
            lease.revoke_deadline = deadline
            lease.reason = reason

        change.then(effect)
        change.revokes.append((lease, reason))

    def grant(self, job_id: str, lease: Lease, now: float) -> Change | None:
        """A waiting job gets ``lease``; None if it is no longer waiting."""
        entry = self.jobs.get(job_id)
        if entry is None or entry.state.status is not JobStatus.QUEUED or entry.lease is not None:
            return None
        state = entry.state
        record = Changes()
        lifecycle.launch(state, now, into=record)  # its GPUs come with the next ``refresh``
        change = Change()
        change.put_lease(lease, LeaseState.GRANTED)
        previous_wait = state.queued_since

        def attach() -> None:
            self._index_lease(lease)
            entry.lease = lease
            lease.from_iteration = self.resume_iteration(entry) or 0
            entry.service0 = state.attained_service
            entry.executed0 = state.executed_time
            entry.requeued_since = previous_wait

        change.then(attach)
        change.transition(entry, record)
        self._touch(change, entry)
        return change

    def grant_failed(self, lease_id: str) -> Change | None:
        """Undo a grant no worker took: the job waits again as before (no preemption counted)."""
        lease = self.leases.get(lease_id)
        if lease is None:
            return None
        entry = self.jobs[lease.job_id]
        change = Change()
        change.put_lease(lease, LeaseState.RELEASED)
        status = entry.state.status if entry.state.status.is_final else JobStatus.QUEUED
        changes: JobChanges = {"status": status, "queued_since": entry.requeued_since}
        if status.is_final:
            changes["finish_time"] = entry.state.finish_time or lease.granted_at
        self._detach(change, entry, lease)
        change.update_job(entry, changes)
        self._touch(change, entry)
        return change

    # --- workers' facts --------------------------------------------------------------------
    def release(
        self,
        lease_id: str,
        at: float,
        *,
        final: JobStatus | None = None,
        checkpoint: str | None = None,
        checkpoint_iteration: int | None = None,
        iterations: int | None = None,
        count_preemption: bool = True,
    ) -> Change | None:
        """The lease's job stopped at ``at``: fold its service; requeue it, or end it with ``final``
        (or with the final status it already has: cancel/terminate). None if the lease is not active.

        ``checkpoint`` (with the iteration it holds) is the run's newest checkpoint, as its fact
        reported it; ``iterations`` the iteration the run reached. A requeued job's
        ``iterations_done`` goes back to its checkpoint's iteration (0 without one): a lost run
        (no fact: ``checkpoint`` None) keeps the newest checkpoint known, the one it resumed from
        or a later periodic one it reported (``checkpointed``), and a suspension's progress past
        its checkpoint is lost too. A job that ends keeps the iteration it reached."""
        lease = self.leases.get(lease_id)
        if lease is None:
            return None
        entry = self.jobs[lease.job_id]
        state = entry.state
        start = state.last_start_time if state.last_start_time is not None else lease.granted_at
        record = Changes()
        lifecycle.progress(
            state, at, since=start, service0=entry.service0, executed0=entry.executed0, gpus=lease.gpu_count,
            into=record,
        )
        changes: JobChanges = {}
        # A job already completed (its work done under an earlier lease) keeps that run's progress:
        # the checkpoint of a re-run stopped after it is older.
        behind = state.status is JobStatus.COMPLETED and iterations is not None and iterations < state.iterations_done
        if checkpoint is not None and _older(checkpoint_iteration, entry):
            # A newer checkpoint of an earlier run landed while this run went (``late_checkpoint``):
            # the job resumes from that one, not from this run's older one.
            checkpoint, checkpoint_iteration = entry.checkpoint_path, entry.checkpoint_iteration
        if checkpoint is not None and not behind:
            # A path reported without its iteration (job.completed and job.failed carry none) is
            # recorded as of unknown iteration rather than paired with the previous checkpoint's.
            changes["checkpoint_path"] = checkpoint
            changes["checkpoint_iteration"] = checkpoint_iteration
        if iterations is not None and not behind:
            changes["iterations_done"] = iterations
        status = final if final is not None else state.status
        if status.is_final:
            lifecycle.finish(state, status, at, into=record)
        else:
            lifecycle.suspend(state, at, preempted=count_preemption, into=record)
            if checkpoint is None:  # no fact (a lost run), or one without a checkpoint: the old one
                changes.update(self._rewind(entry.checkpoint_path, entry.checkpoint_iteration))
            else:
                changes.update(self._rewind(checkpoint, checkpoint_iteration))
        change = Change()
        change.put_lease(lease, LeaseState.RELEASED)
        self._detach(change, entry, lease)
        lost = checkpoint is None

        def note_lost() -> None:
            entry.released_lost = lost

        change.then(note_lost)
        change.transition(entry, record, changes)

        def fold() -> None:
            entry.service0 = state.attained_service
            entry.executed0 = state.executed_time

        change.then(fold)
        self._touch(change, entry)
        change.released.append(lease_id)
        return change

    @staticmethod
    def _rewind(checkpoint: str | None, checkpoint_iteration: int | None) -> JobChanges:
        """``iterations_done`` of a job that will resume from ``checkpoint``: the iteration it holds,
        0 without a checkpoint. Whatever the run did past it (in memory, from the job-metrics) is
        work to do again. (The simulator's runs always stop with a checkpoint and lose nothing; a
        live run can be lost.) A checkpoint of unknown iteration (see ``resume_iteration``) leaves
        ``iterations_done`` as it is."""
        if checkpoint is None:
            return {"iterations_done": 0}
        if checkpoint_iteration is None:
            return {}
        return {"iterations_done": checkpoint_iteration}

    def _detach(self, change: Change, entry: JobEntry, lease: Lease) -> None:
        def effect() -> None:
            lease.state = LeaseState.RELEASED
            self._unindex_lease(lease)
            if entry.lease is lease:
                entry.lease = None
                entry.released_lease_id = lease.lease_id
                entry.state.resumed_at = None
                entry.state.run_start_service = None

        change.then(effect)

    def finished_without_lease(
        self, job_id: str, status: JobStatus, at: float, checkpoint: str | None, iterations: int | None
    ) -> Change:
        """A completion or failure for a job that holds no lease now (e.g. its lease was released
        at the revoke deadline and the job ended during its grace period)."""
        entry = self.jobs.get(job_id)
        change = Change()
        if entry is None or entry.state.status.is_final or entry.lease is not None:
            return change
        record = Changes()
        lifecycle.finish(entry.state, status, at, into=record)
        changes: JobChanges = {}
        if checkpoint is not None:
            changes["checkpoint_path"] = checkpoint
            changes["checkpoint_iteration"] = None  # a completion or failure does not say
        if iterations is not None:
            changes["iterations_done"] = iterations
        change.transition(entry, record, changes)
        self._touch(change, entry)
        return change

    def completed_under_earlier_lease(
        self,
        job_id: str,
        at: float,
        checkpoint: str | None,
        iterations: int | None,
        *,
        grace_deadline: float,
    ) -> Change:
        """A ``job.completed`` for an earlier lease of a job that runs under a newer one.

        The earlier lease was released without this fact (omitted from its node's heartbeats past
        ``reconcile_grace_s``, or past its revoke deadline), the job was requeued and granted again,
        and then the durable fact landed: the job's work is done. It is completed (finished at
        ``at``, with that run's checkpoint and iterations) and its newer lease, if granted, is
        revoked with reason ``TERMINATE`` (``change.revokes``); the re-run's release keeps the
        final status.
        """
        entry = self.jobs.get(job_id)
        if entry is None or entry.lease is None:
            return Change()
        changes: JobChanges = {"finish_time": at, "queued_since": None}
        if checkpoint is not None:
            changes["checkpoint_path"] = checkpoint
            changes["checkpoint_iteration"] = None  # job.completed does not say
        if iterations is not None:
            changes["iterations_done"] = max(iterations, entry.state.iterations_done)
        return self.end(
            job_id, JobStatus.COMPLETED, RevokeReason.TERMINATE, now=at, grace_deadline=grace_deadline, extra=changes
        )

    def late_checkpoint(self, job_id: str, checkpoint: str | None, checkpoint_iteration: int | None) -> Change:
        """A suspension reported after the lease was already released (the run was lost, e.g. at
        its revoke deadline or with its node, and the worker's fact came later): keep its
        checkpoint if it is newer than the one the job would resume from, and resume from there.

        The job may have been granted again meanwhile (a returning node's heartbeat overtook its
        queued ``job.suspended``; issue 18): the newer checkpoint is kept all the same, so that the
        next run resumes from it unless the current run gets further (``release`` keeps the newer
        of the two). The current run, which resumed from the older one, runs on."""
        entry = self.jobs.get(job_id)
        change = Change()
        if entry is None or entry.state.status.is_final or checkpoint is None:
            return change
        current = self.resume_iteration(entry)
        if checkpoint_iteration is not None and current is not None and checkpoint_iteration < current:
            return change
        if entry.lease is not None and (checkpoint_iteration is None or checkpoint_iteration == current):
            return change  # nothing newer than what the running run resumed from
        changes: JobChanges = {"checkpoint_path": checkpoint, "checkpoint_iteration": checkpoint_iteration}
        if entry.lease is None:
            changes.update(self._rewind(checkpoint, checkpoint_iteration))
        change.update_job(entry, changes)
        if entry.lease is None:
            self._touch(change, entry)
        return change

    def checkpointed(self, job_id: str, lease_id: str, checkpoint: str, iteration: int) -> Change:
        """A periodic checkpoint of a run (``job.checkpointed``): the job now resumes from it.

        Kept only for the job's current run, or for the run released last while the job waits (the
        fact may land after a lost run's release: its consumer is not the one that saw the node go),
        and only if it is newer than the checkpoint the job would resume from; anything else (a
        finished job, an older lease, a redelivered or older checkpoint) is a no-op. A running job
        keeps its progress (``iterations_done`` only rises to the checkpoint's iteration, the
        metrics may lag) and a later loss of the run rewinds it to this checkpoint (``release``); a
        waiting job, rewound to an older checkpoint by that release, moves forward to this one.
        """
        entry = self.jobs.get(job_id)
        change = Change()
        if entry is None or entry.state.status.is_final:
            return change
        current = entry.lease is not None and entry.lease.lease_id == lease_id
        if not current:
            if entry.released_lease_id != lease_id:
                return change
            if entry.lease is not None:
                if not entry.released_lost:
                    return change  # it stopped with its checkpoint reported: nothing newer can come
                # The run released last, lost, reported it after a re-run was granted (a restarted
                # agent reports its predecessor's newest checkpoint, racing its own registration):
                # kept as a late checkpoint, without rewinding the re-run.
                return self.late_checkpoint(job_id, checkpoint, iteration)
        known = self.resume_iteration(entry)
        if known is not None and iteration <= known:
            return change
        changes: JobChanges = {"checkpoint_path": checkpoint, "checkpoint_iteration": iteration}
        if entry.state.iterations_done < iteration:
            changes["iterations_done"] = iteration
        change.update_job(entry, changes)
        if not current:
            # A waiting job's progress is what policies rank by; a running one's moves with the
            # metrics without a new state version (a plan in flight stays valid).
            self._touch(change, entry)
        return change

    def gpus_held_on(
        self, node_id: str, *, skip: set[str] | frozenset[str] = frozenset(), skip_stopped: bool = False
    ) -> set[int]:
        """Local GPUs of ``node_id`` held by active leases, except the leases in ``skip`` (and,
        with ``skip_stopped``, those whose job already reported it stopped)."""
        held: set[int] = set()
        for lease_id in self.by_node.get(node_id, ()):
            lease = self.leases[lease_id]
            if lease_id in skip or (skip_stopped and lease.stopped):
                continue
            for node, gpus in lease.parts:
                if node == node_id:
                    held.update(gpus)
        return held

    def leases_on(self, node_id: str) -> list[Lease]:
        return [self.leases[i] for i in sorted(self.by_node.get(node_id, ()))]

    def merge(self, changes: Iterable[Change | None]) -> Change:
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


def _older(checkpoint_iteration: int | None, entry: JobEntry) -> bool:
    """Whether a run's checkpoint at ``checkpoint_iteration`` is older than the one ``entry`` holds
    (both of known iteration)."""
    known = entry.checkpoint_iteration if entry.checkpoint_path else None
    return checkpoint_iteration is not None and known is not None and checkpoint_iteration < known
