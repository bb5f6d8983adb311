"""Facts into the book: admission's verdicts, users' cancels and the workers' job facts.

Each durable consumer's handler turns its event into a ``JobBook`` transition and commits it
(``Replica.commit``: idempotent by event id, in one transaction with its effect) before the
consumer acks; a redelivered event changes nothing. Arrivals and acceptances are pipelined
(``Replica.commit_later``) so a fetched batch shares one transaction. Decisions that depend on
which lease a fact names (``job.started``, ``job.completed``/``job.failed``) are taken by
``reconcile.py``; revokes they call for are sent by ``execution.py``.

Nothing is applied before its source is checked (``trust.py``): a worker's fact only if its node
holds that lease, for that job, in the fact's epoch; a cancel only from the job's owner or an
operator. A refused message writes nothing and is acked (counted in ``Replica.refusals``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Collection
from typing import Any

from schemas.job import JobSpec
from schemas.jobs import (
    JobAccepted,
    JobArrived,
    JobCancel,
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobHeld,
    JobRejected,
    JobStarted,
    JobSuspended,
    SuspendReason,
)
from schemas.leases import RevokeReason
from schemas.rounds import RoundTrigger
from schemas.subjects import (
    JOB_ACCEPTED,
    JOB_ARRIVED,
    JOB_CANCEL,
    JOB_CHECKPOINTED,
    JOB_COMPLETED,
    JOB_FAILED,
    JOB_HELD,
    JOB_REJECTED,
    JOB_STARTED,
    JOB_SUSPENDED,
)
from services.core.state import JobStatus
from services.runtime.consumer import ConsumerHandler, Unapplicable
from services.runtime.kv import KVEntry
from services.runtime.store import JobChanges, LeaseState
from services.scheduler.book import Change, JobNotArrivedError
from services.scheduler.execution import Execution
from services.scheduler.failures import failure_changes
from services.scheduler.metrics import apply_metrics
from services.scheduler.reconcile import Finished, Started, fact_time, judge_finished, judge_started, stray_lease
from services.scheduler.replica import CONSUMERS, Replica
from services.scheduler.trust import (
    LeaseSource,
    Refusal,
    check_fact,
    may_operate,
    permission_denied,
    source_from_rows,
)

log = logging.getLogger("roundhouse.scheduler")

_LeaseFact = JobStarted | JobCheckpointed | JobSuspended | JobCompleted | JobFailed
"""A worker's fact about a lease it ran: checked against its source before it is applied."""


def allowed_priority(spec: JobSpec, max_user_priority: int, operators: Collection[str]) -> JobSpec:
    """``spec`` with its priority capped at ``max_user_priority`` unless an operator submitted it.

    A priority tier preempts lower tiers (issue 14): left to each user, anyone could put their jobs
    above everyone else's. As in Slurm, raising a job's tier is the operators' call; lowering one's
    own is always allowed."""
    if spec.priority <= max_user_priority or spec.user in operators:
        return spec
    return spec.model_copy(update={"priority": max_user_priority})


class JobFacts:
    """The handlers of the job subjects' durable consumers, plus two fast readers (module doc)."""

    def __init__(self, replica: Replica, execution: Execution) -> None:
        self.replica = replica
        self.execution = execution
        self._arriving: dict[str, asyncio.Future[None]] = {}
        """job.arrived commits queued but not landed yet, by job id."""

    def consumers(self) -> dict[str, tuple[type[Any], ConsumerHandler[Any]]]:
        """Subject -> (event model, handler) of each durable consumer this part runs."""
        return {
            JOB_ARRIVED: (JobArrived, self.on_arrived),
            JOB_ACCEPTED: (JobAccepted, self.on_accepted),
            JOB_HELD: (JobHeld, self.on_held),
            JOB_REJECTED: (JobRejected, self.on_rejected),
            JOB_CANCEL: (JobCancel, self.on_cancel),
            JOB_STARTED: (JobStarted, self.on_started),
            JOB_CHECKPOINTED: (JobCheckpointed, self.on_checkpointed),
            JOB_SUSPENDED: (JobSuspended, self.on_suspended),
            JOB_COMPLETED: (JobCompleted, self.on_completed),
            JOB_FAILED: (JobFailed, self.on_failed),
        }

    # --- admission's facts and user intent ---------------------------------------------------
    async def on_arrived(self, event: JobArrived) -> Awaitable[None] | None:
        r = self.replica
        spec = allowed_priority(event.spec, r.cfg.max_user_priority, r.cfg.operators)
        if spec is not event.spec:
            log.warning("job %s: %s may submit at priority %d at most, not %d; it runs at %d",
                        event.job_id, event.spec.user, r.cfg.max_user_priority, event.spec.priority, spec.priority,
                        extra={"job_id": event.job_id})  # fmt: skip
        # Pipelined (see Replica.commit_later): a fetched batch of arrivals becomes one transaction.
        async with r.lock:
            pending = r.commit_later(
                r.book.arrived(event.job_id, spec, event.ts),
                event_id=event.event_id,
                consumer=CONSUMERS[JOB_ARRIVED],
                on_conflict=lambda: log.info("job %s already exists; ignoring its new job.arrived", event.job_id),
            )
            if pending is not None:
                # job.accepted is consumed concurrently and may overtake this commit: let it wait.
                job_id = event.job_id
                self._arriving[job_id] = pending
                pending.add_done_callback(lambda _: self._arriving.pop(job_id, None))
            return pending

    async def _unknown_job(self, event: JobAccepted | JobCancel, subject: str) -> None:
        """Returns if the job is in the store (it finished: nothing to do); raises otherwise."""
        await self._may_still_arrive(event, subject)
        assert self.replica.store is not None
        if await self.replica.store.get_job(event.job_id) is not None:
            return
        raise Unapplicable(f"{subject} for job {event.job_id!r}, which never arrived")

    async def _may_still_arrive(self, event: JobAccepted | JobCancel, subject: str) -> None:
        """A fact about a job the book and the store do not know: retried (``JobNotArrivedError``, a
        short back-off) while its job.arrived may still be on its way, and returns once it cannot.

        The job's arrival, if any, was stored before this fact (admission answers what it read; a
        user cancels what it submitted), so it can no longer come once the arrivals' consumer has
        handled every message stored before this one, as the server counts it: a batch fetched by a
        leader that was killed or paused holding it is not handled, and comes back to this one only
        after the consumer's ``ack_wait``. Then the fact is dead-lettered with the reason at once
        (``Unapplicable``) instead of holding an ack-pending slot through every retry."""
        term = self.replica.term
        arrivals = term.consumer_for.get(JOB_ARRIVED) if term is not None else None
        own = term.consumer_for.get(subject) if term is not None else None
        if arrivals is None or own is None:
            raise JobNotArrivedError(f"{subject} for job {event.job_id!r}: no consumer of arrivals to ask")
        seq, fetched_at = own.current()
        if not await arrivals.handled_before(seq, since=fetched_at):
            raise JobNotArrivedError(f"{subject} for job {event.job_id!r} before its job.arrived was applied")

    async def on_accepted(self, event: JobAccepted) -> Awaitable[None] | None:
        r = self.replica
        assert r.store is not None
        landing = self._arriving.get(event.job_id)
        if landing is not None and not landing.done():
            await asyncio.wait([landing])  # its job.arrived is committing right now
        elif r.book.entry(event.job_id) is None:
            await self._may_still_arrive(event, JOB_ACCEPTED)  # without the lock: a flood costs little
        async with r.lock:
            if r.book.entry(event.job_id) is None:
                await self._unknown_job(event, JOB_ACCEPTED)
                return None  # finished (e.g. cancelled) before admission answered
            change = r.book.accepted(event.job_id, r.clock.time())
            # The round this arrival triggers must see the job: churn once the commit has landed.
            return r.commit_later(
                change, event_id=event.event_id, consumer=CONSUMERS[JOB_ACCEPTED],
                after=lambda: r.churn(RoundTrigger.ARRIVAL),
            )  # fmt: skip

    async def on_held(self, event: JobHeld) -> None:
        self.replica.book.held(event.job_id, event.reason).commit()

    async def on_rejected(self, event: JobRejected) -> None:
        r = self.replica
        async with r.lock:
            change = r.book.rejected(event.job_id, event.reason, r.clock.time())
            await r.commit(change, event_id=event.event_id, consumer=CONSUMERS[JOB_REJECTED])

    async def on_cancel(self, event: JobCancel) -> None:
        r = self.replica
        assert r.store is not None
        now = r.clock.time()
        if r.book.entry(event.job_id) is None:
            await self._may_still_arrive(event, JOB_CANCEL)  # without the lock: a flood costs little
        async with r.lock:
            entry = r.book.entry(event.job_id)
            if entry is None:
                await self._unknown_job(event, JOB_CANCEL)
            elif not may_operate(event.user, entry.state.spec.user, r.cfg.operators):
                why = permission_denied(event.user, "cancel", entry.state.spec.user)
                r.refusals.refuse(JOB_CANCEL, Refusal.PERMISSION_DENIED, f"{why} {event.job_id}")
                return
            grace = entry.state.spec.grace_period_s if entry is not None else 0.0
            change = r.book.end(
                event.job_id,
                JobStatus.CANCELLED,
                RevokeReason.CANCEL,
                now=now,
                grace_deadline=now + grace + r.cfg.revoke_margin_s,
                message=event.reason or "cancelled",
            )
            applied = await r.commit(change, event_id=event.event_id, consumer=CONSUMERS[JOB_CANCEL])
        if applied:
            self.execution.send_revokes(change)

    # --- workers' facts ----------------------------------------------------------------------
    async def _refused(self, subject: str, event: _LeaseFact, *, coordinator_only: bool) -> bool:
        """Whether ``event`` must not be applied: its node does not hold its lease, for its job, in
        its epoch (``trust.check_fact``). A refusal is counted and logged; nothing is written."""
        refusal = await self._check_source(event, coordinator_only=coordinator_only)
        if refusal is None:
            return False
        self.replica.refusals.refuse(subject, refusal, self._describe(event))
        return True

    async def _check_source(self, event: _LeaseFact, *, coordinator_only: bool) -> Refusal | None:
        if event.lease_id is None:
            # A failure reported without its lease (a launch that failed early): only about the
            # lease the job holds now, and only from a node of it.
            entry = self.replica.book.entry(event.job_id)
            if entry is None or entry.lease is None:
                return Refusal.NO_LEASE
            source: LeaseSource | None = LeaseSource.of(entry.lease)
        else:
            source = await self._source(event.lease_id, event.job_id)
        return check_fact(event.node_id, event.job_id, event.epoch, source, coordinator_only=coordinator_only)

    async def _source(self, lease_id: str, job_id: str) -> LeaseSource | None:
        """The lease ``lease_id`` as the book holds it, else as the store recorded it for ``job_id``:
        a release keeps its rows, so the fact of a run released before it landed (lost with its
        node, past its revoke deadline) is still checked against the node and epoch it ran under."""
        r = self.replica
        held = r.book.leases.get(lease_id)
        if held is not None:
            return LeaseSource.of(held)
        assert r.store is not None
        return source_from_rows(lease_id, await r.store.leases_for_job(job_id, include_released=True))

    @staticmethod
    def _describe(event: _LeaseFact) -> str:
        return f"job {event.job_id} lease {event.lease_id} epoch {event.epoch} from node {event.node_id}"

    async def on_started(self, event: JobStarted) -> None:
        r = self.replica
        if await self._refused(JOB_STARTED, event, coordinator_only=False):
            return
        now = r.clock.time()
        held = r.book.leases.get(event.lease_id)
        entry = r.book.entry(event.job_id)
        verdict = judge_started(
            event.lease_id, event.job_id, event.ts, held=held, job_lease=entry.lease if entry is not None else None,
            now=now, lease_ttl_s=r.cfg.lease_ttl_s,
        )  # fmt: skip
        if verdict is Started.OURS and held is not None:
            held.started = True
        elif verdict is Started.STRAY and r.term is not None:
            stray = stray_lease(
                event.node_id, lease_id=event.lease_id, job_id=event.job_id, gpus=event.gpus, epoch=event.epoch, now=now
            )
            self.execution.revoke_strays(r.term, [stray])

    async def on_checkpointed(self, event: JobCheckpointed) -> None:
        r = self.replica
        if await self._refused(JOB_CHECKPOINTED, event, coordinator_only=True):
            return  # its checkpoint path is not recorded: the job's next run would load it
        # Persisted, not only kept in memory: a run lost after a failover must still rewind to it.
        async with r.lock:
            change = r.book.checkpointed(event.job_id, event.lease_id, event.checkpoint_path, event.iteration)
            await r.commit(change, event_id=event.event_id, consumer=CONSUMERS[JOB_CHECKPOINTED])

    async def on_suspended(self, event: JobSuspended) -> None:
        r = self.replica
        if await self._refused(JOB_SUSPENDED, event, coordinator_only=True):
            return  # nothing released, no checkpoint path recorded
        now = r.clock.time()
        # What survives a suspension is its checkpoint: the job resumes from the iteration the
        # checkpoint holds, not from event.iteration (later when the grace period ran out).
        ckpt_iter = event.checkpoint_iteration if event.checkpoint_path is not None else None
        async with r.lock:
            book = r.book
            lease = book.leases.get(event.lease_id)
            change: Change | None
            if lease is not None and lease.job_id == event.job_id:
                entry = book.jobs[lease.job_id]
                at = fact_time(event.ts, entry.state.last_start_time, now)
                change = book.release(
                    event.lease_id, at, checkpoint=event.checkpoint_path, checkpoint_iteration=ckpt_iter,
                    iterations=ckpt_iter,
                )  # fmt: skip
            else:
                change = book.late_checkpoint(event.job_id, event.checkpoint_path, ckpt_iter)
            await r.commit(change, event_id=event.event_id, consumer=CONSUMERS[JOB_SUSPENDED])
        if event.reason is not SuspendReason.PREEMPTED:
            r.churn(RoundTrigger.COMPLETION)

    async def on_suspension_seen(self, event: JobSuspended) -> None:
        """The fast path of a revoke: the same fact on core NATS, before the durable consumer has
        committed it. The round waiting for it may grant the GPUs at once: the worker's processes
        have exited, and the release's commit is queued ahead of any later write of the book
        (after a crash, the durable consumer redelivers the fact and the release happens then)."""
        r = self.replica
        lease = r.book.leases.get(event.lease_id)
        if lease is None or lease.state is not LeaseState.REVOKING:
            return
        # Checked as the durable fact is: a forged "stopped" would hand the GPUs of a job that
        # still runs to another (only the coordinator reports it, under the lease's epoch).
        refusal = check_fact(event.node_id, event.job_id, event.epoch, LeaseSource.of(lease), coordinator_only=True)
        if refusal is not None:
            r.refusals.refuse(JOB_SUSPENDED, refusal, self._describe(event))
            return
        lease.stopped = True
        if r.term is not None:
            r.term.executor.released([lease.lease_id])

    async def on_metrics(self, entry: KVEntry) -> None:
        r = self.replica
        if r.term is not None:
            apply_metrics(r.book, entry, r.clock.time())

    async def on_completed(self, event: JobCompleted) -> None:
        if await self._refused(JOB_COMPLETED, event, coordinator_only=True):
            return
        await self._finished(event, CONSUMERS[JOB_COMPLETED], JobStatus.COMPLETED, details=None)

    async def on_failed(self, event: JobFailed) -> None:
        # Any node of the lease: a rank fails where it runs (its peers stop theirs on this fact).
        if await self._refused(JOB_FAILED, event, coordinator_only=False):
            return
        await self._finished(event, CONSUMERS[JOB_FAILED], JobStatus.FAILED, details=failure_changes(event))

    async def _finished(
        self, event: JobCompleted | JobFailed, consumer: str, status: JobStatus, *, details: JobChanges | None
    ) -> None:
        r = self.replica
        job_id, lease_id, ts, checkpoint, iteration = (
            event.job_id, event.lease_id, event.ts, event.checkpoint_path, event.iteration
        )  # fmt: skip
        now = r.clock.time()
        async with r.lock:
            book = r.book
            entry = book.entry(job_id)
            if entry is None:
                return
            lease = entry.lease
            verdict = judge_finished(status, lease_id, lease.lease_id if lease is not None else None)
            if verdict is Finished.RELEASE and lease is not None:
                at = fact_time(ts, entry.state.last_start_time, now)
                change = book.release(
                    lease.lease_id, at, final=status, checkpoint=checkpoint, iterations=iteration, extra=details
                )
            elif verdict is Finished.WITHOUT_LEASE:
                change = book.finished_without_lease(job_id, status, now, checkpoint, iteration, details)
            elif verdict is Finished.COMPLETED_EARLIER and lease is not None:
                log.warning("job %s completed under its earlier lease %s; revoking its re-run %s",
                            job_id, lease_id, lease.lease_id)  # fmt: skip
                grace = entry.state.spec.grace_period_s
                change = book.completed_under_earlier_lease(
                    job_id, min(ts, now), checkpoint, iteration, grace_deadline=now + grace + r.cfg.revoke_margin_s
                )
            else:
                return  # a failure of an earlier run of a job that runs under another lease now
            applied = await r.commit(change, event_id=event.event_id, consumer=consumer)
        if applied and change is not None:
            self.execution.send_revokes(change)
        r.churn(RoundTrigger.COMPLETION)
