"""NATS data wiped with the store kept: the cluster resumes from the store alone (issue 12).

Real parts: a nats-server of the test's own (its data directory deleted, a fresh server started on a
new port), the SQLite store kept, the scheduler, placement, admission with a policy that holds jobs
(``load-threshold``), and fake workers whose jobs keep running on their nodes through the wipe (as
real training processes would; the agents reconnect to the new server, re-register with the same
incarnation and keep reporting their leases).

Before the wipe: 4 GPUs, 9 one-GPU jobs under ``load-threshold`` (factor 1.5: admitted demand at most
6 before a job is let in): 7 admitted (4 running, 3 queued), 2 held. After it: admission starts from
the scheduler's store (``query.admission``) with the 7 admitted jobs' demand and the held queue in
its order; the running jobs are known to the scheduler and not started again; as jobs complete, the
queued ones start and the held ones are let in, in order. Every job completes exactly once.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

from schemas.control import JobsQuery, JobsReply
from schemas.job import JobSpec
from schemas.jobs import JobAccepted, JobArrived, JobCompleted, JobHeld
from schemas.subjects import JOB_ACCEPTED, JOB_ARRIVED, JOB_COMPLETED, JOB_HELD, QUERY_JOBS
from services.admission.service import AdmissionConfig, AdmissionService
from services.core.state import JobStatus
from services.placement.service import PlacementConfig, PlacementService
from services.runtime.broker import Broker
from services.runtime.bus import Bus, BusOptions
from services.scheduler.config import SchedulerConfig
from services.scheduler.service import SchedulerService
from tests.fake_workers import FakeWorkers
from tests.integration.test_scheduler import FAST, wait_for

NAMESPACE = "wipe"
NODES = {"n0": 2, "n1": 2}
JOBS = [f"j{i}" for i in range(1, 10)]
ADMITTED = JOBS[:7]
HELD = JOBS[7:]


class Stack:
    """Admission, one scheduler replica and placement on one broker; the verdicts and completions seen."""

    def __init__(self, broker: Broker, db: Path) -> None:
        self.broker = broker
        self.db = db
        self.buses: list[Bus] = []
        self.verdicts: list[tuple[str, str]] = []
        self.completed: Counter[str] = Counter()
        self.admission = AdmissionService(AdmissionConfig(
            nats=broker.url, namespace=NAMESPACE, policy="load-threshold", policy_options={"factor": 1.5},
            reoffer_interval_s=60, log_format="text",
        ))  # fmt: skip
        self.scheduler = SchedulerService(SchedulerConfig(
            nats=broker.url, namespace=NAMESPACE, db=str(db), policy="fifo", round_s=0.3, leader_ttl_s=1.0,
            plan_timeout_s=2.0, request_timeout_s=0.5, revoke_margin_s=0.5, lease_ttl_s=30.0, log_format="text",
        ), consumer_options=FAST)  # fmt: skip
        self.placement = PlacementService(PlacementConfig(nats=broker.url, namespace=NAMESPACE))

    async def connect(self, name: str) -> Bus:
        bus = await Bus.connect(self.broker.url, name=name, options=BusOptions(namespace=NAMESPACE))
        self.buses.append(bus)
        return bus

    async def start(self, workers: FakeWorkers) -> Bus:
        """Start everything (the workers reconnect to this broker); returns the client's bus."""
        client = await self.connect("client")

        async def accepted(event: JobAccepted) -> None:
            self.verdicts.append(("accepted", event.job_id))

        async def held(event: JobHeld) -> None:
            self.verdicts.append(("held", event.job_id))

        async def completed(event: JobCompleted) -> None:
            self.completed[event.job_id] += 1

        await client.subscribe(JOB_ACCEPTED, JobAccepted, accepted)
        await client.subscribe(JOB_HELD, JobHeld, held)
        await client.subscribe(JOB_COMPLETED, JobCompleted, completed)
        workers.bus = await self.connect("workers")
        await workers.start(heartbeat_s=0.5)
        await self.placement.start(await self.connect("placement"))
        await self.admission.start(await self.connect("admission"))
        await self.scheduler.start(await self.connect("scheduler"))
        await wait_for(lambda: self.scheduler.is_leader and len(self.scheduler.inventory) == len(NODES),
                       what="a leading scheduler that knows both nodes")  # fmt: skip
        await wait_for(self.admission.ready.is_set, what="admission started from the store")
        return client

    async def stop(self, workers: FakeWorkers) -> None:
        await self.admission.stop()
        await self.scheduler.stop()
        await self.placement.stop()
        await workers.stop()  # the agents lose the bus; their jobs keep running
        for bus in self.buses:
            await bus.close()

    def status(self, job_id: str) -> JobStatus | None:
        entry = self.scheduler.book.entry(job_id)
        return entry.state.status if entry is not None else None

    def statuses(self, wanted: JobStatus) -> set[str]:
        return {j for j in JOBS if self.status(j) is wanted}


def running_on_workers(workers: FakeWorkers) -> set[str]:
    return {job for job, leases in workers.running.items() if leases}


async def complete_one(workers: FakeWorkers) -> str | None:
    """Complete the job of one lease that is not stopping (what a finishing training run reports)."""
    for node in workers.nodes.values():
        for lease_id, held in node.leases.items():
            if not held.stopping and held.grant.is_coordinator:
                await workers.finish(node.node_id, lease_id, completed=True)
                return held.grant.job_id
    return None


async def test_the_cluster_resumes_from_the_store_after_all_nats_data_is_wiped(tmp_path: Path) -> None:
    db = tmp_path / "store"
    workers = FakeWorkers(None, NODES)  # type: ignore[arg-type]  # given a bus by Stack.start
    first = Broker(tmp_path / "nats-first")
    await first.astart()
    before = Stack(first, db)
    try:
        client = await before.start(workers)
        for job_id in JOBS:
            spec = JobSpec(name=job_id, command=["python", "train.py"], gpus=1)
            await client.publish(JOB_ARRIVED, JobArrived(job_id=job_id, spec=spec))
        await wait_for(lambda: len(before.verdicts) == len(JOBS), what="a verdict for every job")
        assert before.verdicts == [("accepted", j) for j in ADMITTED] + [("held", j) for j in HELD]
        await wait_for(lambda: len(running_on_workers(workers)) == 4 and len(before.statuses(JobStatus.RUNNING)) == 4,
                       what="4 jobs running")  # fmt: skip
        await wait_for(lambda: len(before.statuses(JobStatus.QUEUED)) == 3, what="3 jobs queued")
        running = running_on_workers(workers)
        assert running == {"j1", "j2", "j3", "j4"}  # FIFO
        assert before.statuses(JobStatus.HELD) == set(HELD)
        epoch_before = before.scheduler.epoch
    finally:
        await before.stop(workers)
        await first.astop()

    # Every stream, consumer, bucket and KV revision is gone; the store and the running jobs are not.
    shutil.rmtree(tmp_path / "nats-first")
    second = Broker(tmp_path / "nats-second")
    await second.astart()
    assert second.url != first.url
    after = Stack(second, db)
    try:
        client = await after.start(workers)
        admission, scheduler = after.admission, after.scheduler
        assert scheduler.epoch is not None
        assert epoch_before is not None
        assert scheduler.epoch > epoch_before
        # Admission started from the store: the admitted demand and the held queue, in its order.
        assert admission.start_stats["admitted"] == len(ADMITTED)
        assert admission.start_stats["held"] == len(HELD)
        assert set(admission.ledger.admitted) == set(ADMITTED)
        assert list(admission.ledger.held) == HELD  # demand 7 > 6: both stay held, in order
        assert admission.inventory.total_gpus == 4
        # The scheduler knows the running jobs (their leases) and the queued and held ones.
        assert after.statuses(JobStatus.RUNNING) == running
        assert after.statuses(JobStatus.QUEUED) == {"j5", "j6", "j7"}
        assert after.statuses(JobStatus.HELD) == set(HELD)
        assert {e.lease.lease_id for j in running if (e := scheduler.book.entry(j)) and e.lease} == {
            lease_id for leases in workers.running.values() for lease_id in leases
        }

        # Jobs finish one by one: queued ones start, held ones are let in as capacity frees.
        done: list[str] = []
        while len(done) < len(JOBS):
            await wait_for(lambda: bool(running_on_workers(workers)), what="a job running", timeout_s=15)
            job_id = await complete_one(workers)
            assert job_id is not None
            done.append(job_id)
            await wait_for(lambda: after.status(job_id) is None, what=f"{job_id} completed in the scheduler")  # noqa: B023
        await wait_for(lambda: sum(after.completed.values()) == len(JOBS), what="every completion seen")
        reply = await client.request(
            QUERY_JOBS, JobsQuery(job_ids=JOBS, include_finished=True), JobsReply, timeout_s=2.0
        )
        assert {v.job_id: v.status for v in reply.jobs} == dict.fromkeys(JOBS, "completed")
    finally:
        await after.stop(workers)
        await second.astop()

    assert sorted(done) == sorted(JOBS)
    assert after.completed == Counter(dict.fromkeys(JOBS, 1)), "a job completed more than once"
    grants = Counter(job for _, what, job in workers.timeline if what == "grant")
    assert grants == Counter(dict.fromkeys(JOBS, 1)), f"a job was started more than once: {grants}"
    assert workers.max_concurrent_runs == 1
    # After the wipe, admission let in exactly the held jobs, each once (held again first: the same
    # verdicts, given again on the new stream), and nothing admitted before was admitted again.
    assert [v for v in after.verdicts if v[0] == "accepted"] == [("accepted", j) for j in HELD]
    assert [v for v in after.verdicts if v[0] == "held"] == [("held", j) for j in HELD]
