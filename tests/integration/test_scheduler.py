"""The scheduler service against a real nats-server and a real SQLite store.

Workers are ``services.scheduler.fakes.FakeWorkers`` (real bus, fake processes); placement is
``InlinePlacement`` (the placement policy run on the scheduler's own round snapshot) until the
placement service exists.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from schemas.control import JobsQuery, JobsReply
from schemas.job import JobSpec
from schemas.jobs import JobAccepted, JobArrived, JobCancel, JobSuspended, SuspendReason
from schemas.leases import LeaseAck, LeaseAckError, LeaseGrant
from schemas.subjects import JOB_ACCEPTED, JOB_ARRIVED, JOB_CANCEL, JOB_SUSPENDED, QUERY_JOBS, lease_grant
from services.core.registry import UnknownPolicyError
from services.core.state import JobStatus
from services.runtime.broker import Broker
from services.runtime.bus import Bus, BusOptions
from services.runtime.consumer import ConsumerOptions
from services.runtime.store import LeaseState, Store
from services.scheduler.config import SchedulerConfig
from services.scheduler.fakes import FakeWorkers, InlinePlacement
from services.scheduler.service import SchedulerService

FAST = ConsumerOptions(fetch_timeout_s=0.1, retry_backoff_s=0.05)


async def wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        await asyncio.sleep(0.02)


def spec(name: str, gpus: int = 1, grace: float = 5.0) -> JobSpec:
    return JobSpec(name=name, command=["python", "train.py"], gpus=gpus, grace_period_s=grace)


class Cluster:
    """One namespace: a client bus, fake workers, and scheduler replicas sharing one store."""

    def __init__(self, broker: Broker, namespace: str, db: Path) -> None:
        self.broker = broker
        self.namespace = namespace
        self.db = db
        self.buses: list[Bus] = []
        self.replicas: list[tuple[SchedulerService, Bus, InlinePlacement]] = []
        self.client: Bus
        self.workers: FakeWorkers

    async def connect(self, name: str) -> Bus:
        bus = await Bus.connect(self.broker.url, name=name, options=BusOptions(namespace=self.namespace))
        self.buses.append(bus)
        return bus

    async def start_workers(self, nodes: dict[str, int], **options: Any) -> FakeWorkers:
        heartbeat_s = options.pop("heartbeat_s", None)
        self.workers = FakeWorkers(await self.connect("workers"), nodes, **options)
        await self.workers.start(heartbeat_s=heartbeat_s)
        return self.workers

    async def start_scheduler(self, **settings: Any) -> SchedulerService:
        defaults: dict[str, Any] = {
            "round_s": 0.3, "leader_ttl_s": 1.0, "plan_timeout_s": 2.0, "request_timeout_s": 0.5,
            "revoke_margin_s": 0.5, "lease_ttl_s": 30.0, "log_format": "text",
        }  # fmt: skip
        config = SchedulerConfig(nats=self.broker.url, namespace=self.namespace, db=str(self.db),
                                 instance=f"sched-{len(self.replicas)}", **{**defaults, **settings})
        service = SchedulerService(config, consumer_options=FAST)
        bus = await self.connect(config.instance or "sched")
        await service.start(bus)
        placement = InlinePlacement(bus, service)
        await placement.start()
        self.replicas.append((service, bus, placement))
        return service

    async def crash(self, service: SchedulerService) -> None:
        """Stop a replica without resigning (as if its process died): its key must expire."""
        for s, bus, placement in self.replicas:
            if s is service:
                await placement.stop()
                assert service.election is not None
                await service.election.stop(resign=False)
                service.election = None
                await service.stop()
                await bus.close()
                self.buses.remove(bus)

    async def stop_scheduler(self, service: SchedulerService) -> None:
        for s, bus, placement in self.replicas:
            if s is service:
                await placement.stop()
                await service.stop()
                await bus.close()
                self.buses.remove(bus)

    async def submit(self, job_id: str, job_spec: JobSpec, *, accept: bool = True) -> None:
        await self.client.publish(JOB_ARRIVED, JobArrived(job_id=job_id, spec=job_spec))
        if accept:
            await self.client.publish(JOB_ACCEPTED, JobAccepted(job_id=job_id))

    async def query(self, **fields: Any) -> JobsReply:
        return await self.client.request(QUERY_JOBS, JobsQuery(**fields), JobsReply, timeout_s=2.0)

    async def close(self) -> None:
        for service, _, placement in list(self.replicas):
            await placement.stop()
            await service.stop()
        if hasattr(self, "workers"):
            await self.workers.stop()
        for bus in self.buses:
            await bus.close()


@asynccontextmanager
async def cluster(broker: Broker, namespace: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(broker, namespace, tmp_path / "db")
    c.client = await c.connect("client")
    try:
        yield c
    finally:
        await c.close()


def running_jobs(s: SchedulerService) -> set[str]:
    return {j for j, e in s.book.jobs.items() if e.state.status is JobStatus.RUNNING}


async def test_rounds_grant_gpus_to_accepted_jobs_and_query_shows_them(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 2, "n1": 2})
        s = await c.start_scheduler(policy="fifo")
        await wait_for(lambda: s.is_leader and len(s.inventory) == 2, what="leader with 2 nodes")
        for i in range(5):
            await c.submit(f"job-{i}", spec(f"job-{i}"))
        await c.submit("held-0", spec("held-0"), accept=False)
        await wait_for(lambda: len(running_jobs(s)) == 4, what="4 jobs running")
        assert running_jobs(s) == {"job-0", "job-1", "job-2", "job-3"}  # FIFO: the first four
        grants = [entry for entry in workers.log if entry[0] == "grant"]
        assert len(grants) == 4
        assert {epoch for *_, epoch in grants} == {s.epoch}
        await wait_for(lambda: all(l.started for l in s.book.leases.values()), what="job.started applied")

        reply = await c.query()
        by_id = {v.job_id: v for v in reply.jobs}
        assert reply.epoch == s.epoch
        assert [v.job_id for v in reply.jobs] == sorted(by_id)
        assert {j for j, v in by_id.items() if v.status == "running"} == {"job-0", "job-1", "job-2", "job-3"}
        assert by_id["job-4"].status == "queued"
        assert by_id["held-0"].status == "held"
        assert sum(len(g) for v in by_id.values() for g in v.placement.values()) == 4
        page = await c.query(limit=2, after="job-0")
        assert [v.job_id for v in page.jobs] == ["job-1", "job-2"]
        assert page.truncated
        assert [v.job_id for v in (await c.query(statuses=["queued"])).jobs] == ["job-4"]

        # The store agrees: leases granted under this epoch, jobs running.
        assert s.store is not None
        record = await s.store.get_job("job-0")
        assert record is not None
        assert record.status is JobStatus.RUNNING
        leases = await s.store.leases_for_job("job-0")
        assert [(l.state, l.epoch) for l in leases] == [(LeaseState.GRANTED, s.epoch)]

        # A completion frees GPUs and the waiting job gets them.
        node, lease_id = workers.lease_of("job-1") or ("", "")
        await workers.finish(node, lease_id, completed=True)
        await wait_for(lambda: "job-4" in running_jobs(s), what="job-4 running")
        done = await c.query(job_ids=["job-1"])
        assert [(v.job_id, v.status) for v in done.jobs] == [("job-1", "completed")]
        assert workers.max_concurrent_runs == 1


def test_unknown_policy_lists_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(UnknownPolicyError, match="valid: .*las"):
        SchedulerService(SchedulerConfig(policy="no-such-policy", db=str(tmp_path)))
