"""The leader's in-memory copy of its jobs and leases, and every state transition as store writes.

The store is authoritative; the book mirrors the unfinished jobs and the active leases so that a
round's snapshot costs memory reads, not a 20,000-row query. Each transition is computed as a
:class:`Change` (``change.py``): the store operations *and* the in-memory effect. The caller commits
the operations (``Store.apply_event`` for an event, so a redelivery is a no-op) and only then calls
``Change.commit()``; nothing in memory moves if the write fails. Every job update names the version
the book last wrote (``expected_version``), so a deposed leader's late write fails with
``StaleWriteError`` instead of overwriting its successor's.

Transitions (admit, launch, suspend or requeue, finish) and progress are ``services.core.lifecycle``'s,
the very functions the simulator applies to its jobs: the book records each one (``into=Changes()``)
to write it to the store, and applies the recorded values to the job when ``Change.commit()`` runs.

This module keeps the book's state: the entries (``entry.py``), the indexes policies and nodes read
(``active``, ``leases``, ``by_node``, ``state_version``), loading from the store, the snapshot's
``refresh`` and the queries. The transitions are functions of the book, one module per concern,
bound to ``JobBook`` by the same names (no wrapper: a method's signature and call cost):
``intake.py`` (``job.arrived`` and admission's verdicts), ``leasing.py`` (grant, revoke, end,
requeue, release and late completions) and ``checkpoints.py`` (which checkpoint a run resumes from,
periodic and late checkpoints). They read ``jobs`` and ``leases`` and change the indexes through
``_touch`` (file the entry again and bump ``state_version`` on commit), ``_index_lease`` and
``_unindex_lease``; ``arrived`` files a new entry itself.

Attained service (Tiresias' GPU-seconds, what LAS ranks by): a running job's stored value is the
service it had when its lease started; ``refresh(now)`` adds ``gpus x (now - last_start_time)``
for the snapshot, and a release folds the same amount into the stored value
(``lifecycle.progress``).

Restore: ``refresh(now)`` also sets a running job's ``resumed_at`` (``resume.py``): its run's first
reported progress, bounded by ``launch + restore_allowance_s``, so time-slicing policies keep a job
that is still restoring its checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from services.core import lifecycle
from services.core.state import JobState, JobStatus
from services.runtime.store import JobRecord, LeaseState
from services.scheduler import checkpoints, intake, leasing
from services.scheduler.change import Change, merge
from services.scheduler.entry import JobEntry
from services.scheduler.intake import JobNotArrivedError
from services.scheduler.leases import Lease
from services.scheduler.resume import DEFAULT_RESTORE_ALLOWANCE_S, resumed_at
from services.scheduler.topology import Topology, UnknownGpuError

__all__ = ["Change", "JobBook", "JobEntry", "JobNotArrivedError"]


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

    # --- indexes ---------------------------------------------------------------------------
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
        """On commit, file ``entry`` again (``active``; gone once final without a lease) and bump
        ``state_version``."""

        def effect() -> None:
            self._reindex(entry)
            self.state_version += 1

        change.then(effect)

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
            entry.reason, entry.exit_code, entry.signal = record.reason, record.exit_code, record.signal
            self.jobs[record.job_id] = entry
            self._next_seq = max(self._next_seq, record.seq + 1)
        for lease in leases:
            owner = self.jobs.get(lease.job_id)
            if owner is None:
                continue
            self._index_lease(lease)
            owner.lease = lease
            lease.from_iteration = checkpoints.resume_iteration(owner) or 0
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

    resume_iteration = staticmethod(checkpoints.resume_iteration)

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
        return merge(changes)

    # --- transitions (module docstring): each returns the Change to commit ------------------
    # admission's facts
    arrived = intake.arrived
    accepted = intake.accepted
    held = intake.held
    rejected = intake.rejected
    # user intent and policy decisions
    end = leasing.end
    requeue = leasing.requeue
    revoke = leasing.revoke
    grant = leasing.grant
    grant_failed = leasing.grant_failed
    # workers' facts
    release = leasing.release
    finished_without_lease = leasing.finished_without_lease
    completed_under_earlier_lease = leasing.completed_under_earlier_lease
    late_checkpoint = checkpoints.late_checkpoint
    checkpointed = checkpoints.checkpointed
