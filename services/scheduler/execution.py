"""Carrying out decisions: a round's revokes and grants, and revokes outside rounds.

A round's valid plan (``rounds.validate_plan``) is executed **revokes first**: the leases are marked
revoking (committed), the revokes sent, and the round waits for each ``job.suspended`` or the grace
deadline, past which the lease is released without it. **Then grants**: the new leases and their
jobs' RUNNING state are committed in one store request, and the grants themselves are sent after
the round (``_dispatch_grants``, as kube-scheduler binds after its scheduling cycle); a grant no
worker takes is rolled back. The next round's execution, and any revoke outside a round (cancel,
terminate, a stray lease), first waits for the grants still in flight, so a revoke never overtakes
its grant. The wire side (request-reply, retries, the epoch fence) is ``executor.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable

from schemas.leases import LeaseAckError, RevokeReason
from services.core.state import JobStatus
from services.runtime.store import StaleWriteError
from services.scheduler.book import Change
from services.scheduler.executor import DeposedError, GrantRefusedError, LeaseExecutor
from services.scheduler.leases import Lease, new_lease_id
from services.scheduler.packing import GpuLoad
from services.scheduler.replica import Replica
from services.scheduler.rounds import ValidPlan
from services.scheduler.term import Term
from services.scheduler.timings import RoundTimings

log = logging.getLogger("roundhouse.scheduler")


class Execution:
    """Executes plans and revokes for the term the replica leads."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica

    def grace(self, job_id: str) -> float:
        """The job's grace period (0 for a job the book no longer has)."""
        entry = self.replica.book.entry(job_id)
        return entry.state.spec.grace_period_s if entry is not None else 0.0

    # --- releases and requeues ---------------------------------------------------------------
    async def release(self, lease_ids: Iterable[str], at: float, *, count_preemption: bool = True) -> None:
        """Release these leases (those still active) at ``at``, in one commit."""
        r = self.replica
        async with r.lock:
            book = r.book
            await r.commit(book.merge(book.release(i, at, count_preemption=count_preemption) for i in lease_ids))

    async def requeue(self, job_ids: list[str]) -> None:
        """RUNNING jobs found without a lease (at election): they wait again. Call with the lock held."""
        r = self.replica
        now = r.clock.time()
        await r.commit(r.book.merge(r.book.requeue(job_id, now) for job_id in job_ids))

    # --- a round's plan ----------------------------------------------------------------------
    async def execute(self, valid: ValidPlan, term: Term, timings: RoundTimings | None = None) -> None:
        """Revokes first, wait for the suspensions (or their deadlines), then grants."""
        r = self.replica
        timings = timings or RoundTimings()
        if term.dispatch is not None and not term.dispatch.done():
            await asyncio.wait([term.dispatch])  # the previous round's grants first
        t0 = time.perf_counter()
        executor = term.executor
        now = r.clock.time()
        margin = r.cfg.revoke_margin_s
        async with r.lock:
            book = r.book
            changes: list[Change | None] = []
            for job_id, reason in valid.terminate.items():
                entry = book.entry(job_id)
                if entry is None:
                    continue
                grace = entry.state.spec.grace_period_s
                changes.append(
                    book.end(
                        job_id,
                        JobStatus.COMPLETED,
                        RevokeReason.TERMINATE,
                        now=now,
                        grace_deadline=now + grace + margin,
                        message=reason,
                    )
                )
            for job_id in valid.suspend:
                entry = book.entry(job_id)
                if entry is None:
                    continue
                reason = RevokeReason.MIGRATE if job_id in valid.launch else RevokeReason.PREEMPT
                changes.append(book.revoke(job_id, reason, now + entry.state.spec.grace_period_s + margin))
            stopping = book.merge(changes)
            await r.commit(stopping)
        if stopping.revokes:
            await self._stop_leases(executor, stopping.revokes, timings)
        t1 = time.perf_counter()
        await self._grant(executor, valid, timings)
        timings.grant = time.perf_counter() - t1
        timings.revoke = t1 - t0 - timings.wait

    async def _stop_leases(
        self, executor: LeaseExecutor, revokes: list[tuple[Lease, RevokeReason]], timings: RoundTimings
    ) -> None:
        r = self.replica
        deadline = max((lease.revoke_deadline or r.clock.time()) for lease, _ in revokes)
        acks = await asyncio.gather(
            *(executor.revoke(lease, reason, self.grace(lease.job_id), lease.revoke_deadline or deadline)
              for lease, reason in revokes),
            return_exceptions=True,
        )  # fmt: skip
        for result in acks:
            if isinstance(result, DeposedError):
                raise result
        gone = [
            lease.lease_id for (lease, _), ack in zip(revokes, acks, strict=True)
            if not isinstance(ack, BaseException) and ack is not None and ack.error is LeaseAckError.UNKNOWN_LEASE
        ]  # fmt: skip
        if gone:
            await self.release(gone, r.clock.time(), count_preemption=False)
        leases = [lease for lease, _ in revokes if lease.lease_id in r.book.leases]
        t0 = time.perf_counter()
        late = await executor.wait_released(leases, deadline, self._still_running)
        timings.wait = time.perf_counter() - t0
        if late:
            log.warning("%d revokes passed their deadline without job.suspended; releasing", len(late))
            await self.release(late, r.clock.time())

    def _still_running(self, lease_id: str) -> bool:
        lease = self.replica.book.leases.get(lease_id)
        return lease is not None and not lease.stopped

    async def _grant(self, executor: LeaseExecutor, valid: ValidPlan, timings: RoundTimings) -> None:
        if not valid.launch:
            return
        r = self.replica
        moving = [
            lease
            for job_id in valid.launch
            if (entry := r.book.entry(job_id)) is not None and (lease := entry.lease) is not None and lease.stopped
        ]
        if moving:  # a migrating job is granted again only once its release is committed
            await executor.wait_released(moving, r.clock.time() + 5.0, lambda i: i in r.book.leases)
        now = r.clock.time()
        async with r.lock:
            book = r.book
            held_on: dict[str, set[int]] = {}
            load = GpuLoad(book, skip_stopped=True) if r.cfg.packing else None  # packing counts leases per GPU
            changes: list[Change | None] = []
            leases: list[Lease] = []
            for job_id, parts in valid.launch.items():
                taken = False
                for node, gpus in parts:
                    if node not in held_on:
                        held_on[node] = book.gpus_held_on(node, skip_stopped=True)
                    busy = load.full(node, gpus) if load is not None else bool(held_on[node].intersection(gpus))
                    taken = taken or busy or not r.inventory.is_live(node)
                if taken:
                    continue
                lease = Lease(new_lease_id(), job_id, parts, executor.epoch, now)
                change = book.grant(job_id, lease, now)
                if change is not None:
                    for node, gpus in parts:
                        held_on[node].update(gpus)
                        if load is not None:
                            load.claim(node, gpus)
                    changes.append(change)
                    leases.append(lease)
            await r.commit(book.merge(changes))
        if leases and r.term is not None:
            term = r.term
            started = time.perf_counter()
            term.dispatch = asyncio.ensure_future(self._dispatch_grants(executor, leases, timings, started))
            term.tasks.add(term.dispatch)
            term.dispatch.add_done_callback(term.tasks.discard)

    async def _dispatch_grants(
        self, executor: LeaseExecutor, leases: list[Lease], timings: RoundTimings, started: float
    ) -> None:
        """Send a round's grants and wait for the acks, after the round itself has ended (as
        kube-scheduler binds after its scheduling cycle): the leases are in the store already,
        and a grant no worker takes is rolled back here. The next round's execution waits for
        this to finish, so its revokes never overtake these grants."""
        try:
            await self._send_grants(executor, leases)
        except (DeposedError, StaleWriteError) as exc:
            await self.replica.step_down(exc)
        finally:
            timings.grants_acked = time.perf_counter() - started

    async def _send_grants(self, executor: LeaseExecutor, leases: list[Lease]) -> None:
        results = await asyncio.gather(*(self._send_grant(executor, lease) for lease in leases), return_exceptions=True)
        failed: list[str] = []
        for lease, result in zip(leases, results, strict=True):
            if isinstance(result, DeposedError):
                raise result
            if isinstance(result, BaseException):
                log.warning("%s", result)
                failed.append(lease.lease_id)
        if failed:
            r = self.replica
            async with r.lock:
                await r.commit(r.book.merge(r.book.grant_failed(i) for i in failed))

    async def _send_grant(self, executor: LeaseExecutor, lease: Lease) -> None:
        entry = self.replica.book.entry(lease.job_id)
        if entry is None:
            raise GrantRefusedError(f"job {lease.job_id} is gone")
        state = entry.state
        await executor.grant(
            lease, state.spec, resume_from=entry.checkpoint_path,
            # Fixed at the grant's commit: the iteration a report must pass to count as this run's
            # progress (resume.py); the metrics may have moved iterations_done since.
            resume_iteration=lease.from_iteration if entry.checkpoint_path else None,
            attempt=state.preemptions + 1, shared=self.replica.cfg.packing,
        )  # fmt: skip

    # --- revokes outside a round -------------------------------------------------------------
    def send_revokes(self, change: Change) -> None:
        """Revoke the leases a committed change asks to stop (cancel, terminate), in the background."""
        term = self.replica.term
        if term is None:
            return
        for lease, reason in change.revokes:
            term.spawn(self._revoke_in_background(term, lease, reason), "revoke")

    async def _revoke_in_background(self, term: Term, lease: Lease, reason: RevokeReason) -> None:
        """Revoke outside a round (cancel, terminate, unknown lease), then release at the deadline."""
        r = self.replica
        grace = self.grace(lease.job_id)
        deadline = lease.revoke_deadline or (r.clock.time() + grace + r.cfg.revoke_margin_s)
        if term.dispatch is not None and not term.dispatch.done():
            await asyncio.wait([term.dispatch])  # never overtake the grant of this very lease
        try:
            ack = await term.executor.revoke(lease, reason, grace, deadline)
        except DeposedError as exc:
            await r.step_down(exc)
            return
        if lease.lease_id not in r.book.leases:
            return

        def held(lease_id: str) -> bool:
            return lease_id in r.book.leases

        if ack is not None and ack.error is LeaseAckError.UNKNOWN_LEASE and not lease.stopped:
            await self.release([lease.lease_id], r.clock.time(), count_preemption=False)
            return
        await term.executor.wait_released([lease], deadline, held)
        if lease.stopped and held(lease.lease_id):
            # The fast path (``job.suspended`` seen on core NATS, facts.on_suspension_seen) wakes the
            # wait before the durable fact is applied, and only that fact carries the run's
            # checkpoint: it releases the lease itself. Releasing here instead requeued the job
            # without its checkpoint, and the next round started it over from iteration 0 (drain
            # --now lost 1 checkpoint in 3). So wait for it, up to the deadline as before; the same
            # holds when the worker no longer knew the lease because it had already suspended it.
            await term.executor.wait_released([lease], deadline, held)
        await self.release([lease.lease_id], r.clock.time())

    def revoke_strays(self, term: Term, strays: Iterable[Lease]) -> None:
        """Revoke leases a worker runs that the scheduler does not hold (``reconcile.py``)."""
        for lease in strays:
            term.spawn(self._revoke_stray(term, lease), "revoke-stray")

    async def _revoke_stray(self, term: Term, lease: Lease) -> None:
        with contextlib.suppress(DeposedError):
            until = self.replica.clock.time() + self.replica.cfg.request_timeout_s
            await term.executor.revoke(lease, RevokeReason.PREEMPT, 0.0, until)
