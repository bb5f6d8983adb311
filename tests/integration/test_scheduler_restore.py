"""Time-slicing on the live scheduler keeps a job that is still restoring its checkpoint.

Real nats-server, SQLite store, scheduler service, and the real metrics service folding the
``metrics.job.<id>`` samples (what the worker agent publishes from a job's channel) into the
``job-metrics`` bucket the scheduler watches; workers are ``FakeWorkers`` (a revoke suspends at
iteration 10 with checkpoint ``/ckpt/<job>/10``) and placement runs inline. ``rr`` with a quantum
far shorter than the restore: a resumed run keeps its GPU until it reports an iteration of its own
(``services/scheduler/resume.py``), and a run that reports nothing only until the restore
allowance ends.
"""

from __future__ import annotations

import time
from pathlib import Path

from schemas.metrics import JobMetrics
from schemas.subjects import job_metrics
from services.metrics.service import MetricsConfig, MetricsService
from services.runtime.broker import Broker
from tests.fake_workers import FakeWorkers
from tests.integration.test_scheduler import Cluster, cluster, held_by_worker, spec, wait_for

QUANTUM_S = 0.3


async def start_metrics(c: Cluster) -> MetricsService:
    service = MetricsService(MetricsConfig(nats=c.broker.url, namespace=c.namespace, flush_interval_s=0.05))
    await service.start(await c.connect("metrics"))
    return service


async def report(c: Cluster, job_id: str, lease_id: str, iteration: int) -> None:
    """What the coordinator agent publishes from rank 0's channel."""
    sample = JobMetrics(job_id=job_id, lease_id=lease_id, rank=0, iteration=iteration)
    await c.client.publish(job_metrics(job_id), sample)


async def next_lease(workers: FakeWorkers, job_id: str, after: set[str]) -> str:
    """The lease id of ``job_id``'s next run on the workers (one not in ``after``)."""
    await wait_for(
        lambda: (held := workers.lease_of(job_id)) is not None and held[1] not in after,
        what=f"a new run of {job_id}",
    )
    _, lease_id = await held_by_worker(workers, job_id)
    return lease_id


def revoked(workers: FakeWorkers, lease_id: str) -> bool:
    return lease_id in workers.revoke_reasons


async def test_a_resumed_run_keeps_its_gpu_until_it_reports_an_iteration_past_its_checkpoint(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        metrics = await start_metrics(c)
        try:
            workers = await c.start_workers({"n0": 1})
            s = await c.start_scheduler(
                policy="rr", policy_options={"quantum_s": QUANTUM_S}, round_s=QUANTUM_S, restore_allowance_s=30.0
            )
            await wait_for(lambda: s.is_leader and len(s.inventory) == 1, what="leader")
            await c.submit("a", spec("a"))
            a1 = await next_lease(workers, "a", set())
            await c.submit("b", spec("b"))
            # Both report progress at once: time-slicing alternates them every quantum.
            await report(c, "a", a1, 1)
            b1 = await next_lease(workers, "b", set())
            await report(c, "b", b1, 1)
            a2 = await next_lease(workers, "a", {a1})
            grant = next(fl.grant for n in workers.nodes.values() for lid, fl in n.leases.items() if lid == a2)
            assert (grant.resume_from, grant.resume_iteration) == ("/ckpt/a/10", 10)

            # Resumed from iteration 10: the agent's first tick (before the restore) and the restored
            # position are no progress; the job keeps its GPU for many quanta.
            await report(c, "a", a2, 0)
            await report(c, "a", a2, 10)
            # Rounds ran to their end well past a's quantum (not a sleep that a slow machine outruns).
            cues = s.cycle.cues_taken
            await wait_for(
                lambda: s.cycle.cues_taken >= cues + 4 and not s.cycle.in_round and s.snapshot is not None
                and s.snapshot.now - s.book.leases[a2].granted_at > 3 * QUANTUM_S,
                timeout_s=20, what="rounds past a's quantum",
            )  # fmt: skip
            assert not revoked(workers, a2)
            assert s.book.leases[a2].reason is None  # nor decided, even if not heard yet
            lease = s.book.leases[a2]
            assert (lease.from_iteration, lease.progress_at) == (10, None)
            snapshot = s.snapshot
            assert snapshot is not None
            assert snapshot.now - lease.granted_at > 3 * QUANTUM_S
            assert snapshot.jobs["a"].resumed_at == lease.granted_at + 30.0

            # Its first iteration of this run ends the protection: the next round hands the GPU to b.
            reported = time.time()
            await report(c, "a", a2, 11)
            await wait_for(lambda: revoked(workers, a2), timeout_s=5, what="a's resumed run preempted")
            assert workers.revoke_reasons[a2] == "preempt"
            assert lease.progress_at is not None
            assert lease.granted_at <= lease.progress_at <= time.time()
            assert lease.progress_at >= reported - 0.5  # the sample's ts, taken just before it was published
            await next_lease(workers, "b", {b1})
            assert workers.max_concurrent_runs == 1
        finally:
            await metrics.stop()


async def test_a_run_that_never_reports_competes_once_the_restore_allowance_ends(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    allowance = 1.5
    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 1})
        s = await c.start_scheduler(
            policy="rr", policy_options={"quantum_s": QUANTUM_S}, round_s=QUANTUM_S, restore_allowance_s=allowance
        )
        await wait_for(lambda: s.is_leader and len(s.inventory) == 1, what="leader")
        await c.submit("a", spec("a"))
        await next_lease(workers, "a", set())
        await c.submit("b", spec("b"))
        await next_lease(workers, "b", set())
        times = {(what, job): t for t, what, job in reversed(workers.timeline)}  # first occurrences
        held = times[("revoke", "a")] - times[("grant", "a")]
        # Kept past its quantum for the allowance (counted from the grant's commit, just before the
        # worker saw it), then preempted (b runs). No upper bound on when: a loaded machine may run
        # the next round late, and that says nothing about the allowance. The margin is the grant's
        # way from its commit to the worker, which a loaded machine stretches too (still > 3 quanta).
        assert held >= allowance - 0.5, held
