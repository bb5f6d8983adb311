"""The scheduler service against a real nats-server and a real SQLite store.

Workers are ``tests.fake_workers.FakeWorkers`` (real bus, fake processes); placement is the real
placement service (``services/placement/service.py``), placing each round on the snapshot it carries.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar

import pytest

from schemas.control import JobsQuery, JobsReply
from schemas.job import JobSpec
from schemas.jobs import JobAccepted, JobArrived, JobCancel, JobSuspended, SuspendReason
from schemas.leases import LeaseAck, LeaseAckError, LeaseGrant, RevokeReason
from schemas.rounds import ScheduleRound
from schemas.subjects import (
    JOB_ACCEPTED,
    JOB_ARRIVED,
    JOB_CANCEL,
    JOB_SUSPENDED,
    QUERY_JOBS,
    SCHEDULE_ROUND,
    lease_grant,
)
from services.core.decisions import Ranking
from services.core.protocols import Trigger
from services.core.registry import SCHEDULING, UnknownPolicyError
from services.core.state import ClusterState, JobState, JobStatus
from services.placement.service import PlacementConfig, PlacementService
from services.runtime.broker import Broker
from services.runtime.bus import Bus, BusOptions
from services.runtime.config import ConfigError, load_config
from services.runtime.consumer import ConsumerOptions
from services.runtime.store import LeaseState
from services.scheduler.config import SchedulerConfig
from services.scheduler.executor import GrantRefusedError, LeaseExecutor
from services.scheduler.leases import Lease
from services.scheduler.service import SchedulerService
from tests.fake_workers import FakeWorkers

REPO = Path(__file__).resolve().parents[2]
FAST = ConsumerOptions(fetch_timeout_s=0.1, retry_backoff_s=0.05)


async def wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        await asyncio.sleep(0.02)


async def held_by_worker(workers: FakeWorkers, job_id: str) -> tuple[str, str]:
    """(node, lease id) once the fake worker holds ``job_id``'s grant (sent after the round)."""
    await wait_for(lambda: workers.lease_of(job_id) is not None, what=f"{job_id} granted on a worker")
    found = workers.lease_of(job_id)
    assert found is not None
    return found


def spec(name: str, gpus: int = 1, grace: float = 5.0) -> JobSpec:
    return JobSpec(name=name, command=["python", "train.py"], gpus=gpus, grace_period_s=grace)


class Cluster:
    """One namespace: a client bus, fake workers, and scheduler replicas sharing one store."""

    def __init__(self, broker: Broker, namespace: str, db: Path) -> None:
        self.broker = broker
        self.namespace = namespace
        self.db = db
        self.buses: list[Bus] = []
        self.replicas: list[tuple[SchedulerService, Bus, PlacementService | None]] = []
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

    async def start_scheduler(
        self, *, with_placement: bool = True, placement_policy: str = "consolidated", **settings: Any
    ) -> SchedulerService:
        """A scheduler replica and, unless ``with_placement`` is False, a real placement service
        beside it (the replicas' placement instances share the rounds, as deployed)."""
        defaults: dict[str, Any] = {
            "round_s": 0.3, "leader_ttl_s": 1.0, "plan_timeout_s": 2.0, "request_timeout_s": 0.5,
            "revoke_margin_s": 0.5, "lease_ttl_s": 30.0, "log_format": "text",
        }  # fmt: skip
        config = SchedulerConfig(
            nats=self.broker.url,
            namespace=self.namespace,
            db=str(self.db),
            instance=f"sched-{len(self.replicas)}",
            **{**defaults, **settings},
        )
        service = SchedulerService(config, consumer_options=FAST)
        bus = await self.connect(config.instance or "sched")
        await service.start(bus)
        placement = None
        if with_placement:
            placement = PlacementService(
                PlacementConfig(nats=self.broker.url, namespace=self.namespace, policy=placement_policy)
            )
            await placement.start(bus)
        self.replicas.append((service, bus, placement))
        return service

    async def crash(self, service: SchedulerService) -> None:
        """Stop a replica without resigning (as if its process died): its key must expire."""
        for s, bus, placement in self.replicas:
            if s is service:
                if placement is not None:
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
                if placement is not None:
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
            if placement is not None:
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
        # No placement until all five are queued: acceptances land in batches, in any order, and a
        # fill round between two batches would rightly start job-4 before job-0 was accepted.
        s = await c.start_scheduler(policy="fifo", with_placement=False, plan_timeout_s=0.3)
        await wait_for(lambda: s.is_leader and len(s.inventory) == 2, what="leader with 2 nodes")
        rounds: list[ScheduleRound] = []

        async def seen(message: ScheduleRound) -> None:
            rounds.append(message)

        await c.client.subscribe(SCHEDULE_ROUND, ScheduleRound, seen)
        for i in range(5):
            await c.submit(f"job-{i}", spec(f"job-{i}"))
        await c.submit("held-0", spec("held-0"), accept=False)
        await wait_for(lambda: all((e := s.book.entry(f"job-{i}")) is not None and e.state.status is JobStatus.QUEUED
                                   for i in range(5)), what="all five accepted")  # fmt: skip
        service, bus, _ = c.replicas[0]
        placement = PlacementService(PlacementConfig(nats=c.broker.url, namespace=c.namespace, policy="consolidated"))
        await placement.start(bus)
        c.replicas[0] = (service, bus, placement)  # stopped with the replica
        await wait_for(lambda: len(running_jobs(s)) == 4, what="4 jobs running")
        assert running_jobs(s) == {"job-0", "job-1", "job-2", "job-3"}  # FIFO: the first four
        await wait_for(lambda: len(workers.log) == 4, what="4 grants taken")
        grants = [entry for entry in workers.log if entry[0] == "grant"]
        assert len(grants) == 4
        assert {epoch for *_, epoch in grants} == {s.epoch}
        await wait_for(lambda: all(lease.started for lease in s.book.leases.values()), what="job.started applied")

        reply = await c.query()
        by_id = {v.job_id: v for v in reply.jobs}
        assert reply.epoch == s.epoch
        assert [v.job_id for v in reply.jobs] == sorted(by_id)
        assert {j for j, v in by_id.items() if v.status == "running"} == {"job-0", "job-1", "job-2", "job-3"}
        assert by_id["job-4"].status == "queued"
        # Why it waits: every GPU is taken, and where it stands in the last round's order (if one ranked it).
        assert re.fullmatch(
            r"needs 1 GPU, 0 of 4 free; (#1 of 1 waiting in|arrived after) round \d+", by_id["job-4"].reason or ""
        ), by_id["job-4"].reason
        assert by_id["job-0"].reason is None  # running
        assert rounds
        assert all(r.epoch == s.epoch and r.policy == "fifo" and not r.preempt for r in rounds)  # FIFO: no preemption
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
        assert [(lease.state, lease.epoch) for lease in leases] == [(LeaseState.GRANTED, s.epoch)]

        # A completion frees GPUs and the waiting job gets them.
        node, lease_id = await held_by_worker(workers, "job-1")
        await workers.finish(node, lease_id, completed=True)
        await wait_for(lambda: "job-4" in running_jobs(s), what="job-4 running")
        done = await c.query(job_ids=["job-1"])
        assert [(v.job_id, v.status) for v in done.jobs] == [("job-1", "completed")]
        assert workers.max_concurrent_runs == 1


def test_unknown_policy_lists_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown scheduling policy 'no-such-policy'; valid: .*las"):
        load_config(SchedulerConfig, flags={"policy": "no-such-policy", "db": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"policy 'las' rejects policy_options"):
        load_config(SchedulerConfig, flags={"policy": "las", "policy_options": {"starvation_s": -1}})
    with pytest.raises(UnknownPolicyError, match=r"valid: .*las"):  # a config built without validation
        SchedulerService(SchedulerConfig.model_construct(policy="no-such-policy", db=str(tmp_path)))


async def test_las_preempts_the_most_served_job_and_revokes_before_granting(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 2}, stop_delay_s=0.3)
        s = await c.start_scheduler(policy="las", round_s=0.2)
        await wait_for(lambda: s.is_leader and len(s.inventory) == 1, what="leader")
        await c.submit("old", spec("old"))
        await wait_for(lambda: "old" in running_jobs(s), what="old running")
        await asyncio.sleep(0.6)  # real time for old's attained service to grow past mid's (LAS ranks by it)
        await c.submit("mid", spec("mid"))
        await wait_for(lambda: "mid" in running_jobs(s), what="mid running")
        await asyncio.sleep(0.2)  # likewise mid's, past new's zero
        await c.submit("new", spec("new"))
        await wait_for(lambda: "new" in running_jobs(s), what="new running")
        await held_by_worker(workers, "new")

        # LAS: "new" (no service) outranks both; "old" has the most attained service, so it goes.
        events = [(what, job) for _, what, job in workers.timeline]
        assert ("revoke", "old") in events
        assert ("revoke", "mid") not in events[: events.index(("grant", "new"))]
        times: dict[tuple[str, str], float] = {}
        for t, what, job in workers.timeline:
            times.setdefault((what, job), t)  # first occurrences
        assert times[("revoke", "old")] < times[("suspended", "old")] < times[("grant", "new")]
        revoked = next(lid for cmd, lid, *_ in workers.log if cmd == "revoke")
        assert workers.revoke_reasons[revoked] == "preempt"
        old = s.book.entry("old")
        assert old is not None
        # The grant may precede the commit of the suspension (seen first on core NATS).
        await wait_for(lambda: old.state.status is JobStatus.QUEUED, what="old's suspension committed")
        assert old.state.preemptions == 1
        assert old.checkpoint_path == "/ckpt/old/10"
        assert old.state.attained_service >= 0.6  # 1 GPU x its running time, folded on suspension

        # Time-slicing goes on: "old" comes back from its checkpoint once the others caught up.
        await wait_for(lambda: "old" in running_jobs(s), timeout_s=10, what="old resumed")
        await held_by_worker(workers, "old")
        resumed = [fl.grant for n in workers.nodes.values() for fl in n.leases.values() if fl.grant.job_id == "old"]
        assert [(g.resume_from, g.resume_iteration, g.attempt) for g in resumed] == [("/ckpt/old/10", 10, 2)]
        assert workers.max_concurrent_runs == 1


async def test_cancel_revokes_a_running_job_and_ends_a_waiting_one(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 1})
        s = await c.start_scheduler(policy="fifo")
        await wait_for(lambda: s.is_leader and len(s.inventory) == 1, what="leader")
        await c.submit("a", spec("a"))
        await c.submit("b", spec("b"))
        await wait_for(lambda: "a" in running_jobs(s), what="a running")
        await c.client.publish(JOB_CANCEL, JobCancel(job_id="b", reason="not needed"))
        await c.client.publish(JOB_CANCEL, JobCancel(job_id="a"))
        await wait_for(lambda: not s.book.jobs, what="both jobs ended")
        lease_id = next(lid for cmd, lid, *_ in workers.log if cmd == "grant")
        assert workers.revoke_reasons == {lease_id: "cancel"}
        assert s.store is not None
        for job_id in ("a", "b"):
            record = await s.store.get_job(job_id)
            assert record is not None
            assert record.status is JobStatus.CANCELLED
            assert record.finish_time is not None
        reply = await c.query(include_finished=True)
        assert [(v.job_id, v.status) for v in reply.jobs] == [("a", "cancelled"), ("b", "cancelled")]
        assert [v.job_id for v in (await c.query()).jobs] == []
        assert [cmd for cmd, *_ in workers.log] == ["grant", "revoke"]  # "b" never ran

        # A cancel of a job that does not exist (its job.arrived is not in the stream before it) is
        # dead-lettered with the reason within seconds, once the arrivals' consumer has nothing left:
        # it neither waits for a job of that name to turn up later nor cancels it when it does.
        await c.client.publish(JOB_CANCEL, JobCancel(job_id="early"))
        term = s._term
        assert term is not None
        cancels = term.consumer_for[JOB_CANCEL]
        await wait_for(lambda: cancels.stats.dead_lettered == 1, what="the cancel dead-lettered", timeout_s=10)
        await c.submit("early", spec("early"))
        await wait_for(lambda: workers.lease_of("early") is not None, what="early running")
        store = s.store
        assert store is not None
        early = await store.get_job("early")
        assert early is not None
        assert early.status is JobStatus.RUNNING


async def test_redelivered_events_are_applied_once(broker: Broker, namespace: str, tmp_path: Path) -> None:
    from schemas.codec import encode

    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 1})
        s = await c.start_scheduler(policy="fifo", round_s=5.0)
        await wait_for(lambda: s.is_leader and len(s.inventory) == 1, what="leader")
        # Arrival and acceptance back to back (as admission publishes them): the acceptances'
        # consumer may handle its fact before the arrival's commit landed; it waits or retries.
        await c.client.publish(JOB_ARRIVED, JobArrived(job_id="j", spec=spec("j")))
        await c.client.publish(JOB_ACCEPTED, JobAccepted(job_id="j"))
        await wait_for(
            lambda: (e := s.book.entry("j")) is not None and e.state.status is JobStatus.QUEUED, what="j queued"
        )
        s.request_round()
        await wait_for(lambda: "j" in running_jobs(s), what="j running")
        node, lease_id = await held_by_worker(workers, "j")
        fact = await workers.finish(node, lease_id, completed=False, reason=SuspendReason.LEASE_EXPIRED)
        assert isinstance(fact, JobSuspended)
        await wait_for(lambda: s.book.jobs["j"].state.status is JobStatus.QUEUED, what="j suspended")
        # The same event again, as JetStream would redeliver it (a new message id defeats dedup).
        for copy in range(2):
            await c.client.js.publish(
                c.client.wire(f"job.suspended.{fact.node_id}"),
                encode(fact),
                headers={"Nats-Msg-Id": f"redelivery-{copy}"},
            )
        arrived_again = JobArrived(job_id="j", spec=spec("j"))
        await c.client.publish(JOB_ARRIVED, arrived_again)
        consumer = next(x for x in s._term.consumers if x.durable.endswith("scheduler-suspended"))  # type: ignore[union-attr]
        await wait_for(lambda: consumer.stats.handled >= 3, what="redeliveries handled")
        assert s.store is not None
        record = await s.store.get_job("j")
        assert record is not None
        assert record.preemptions == 1
        assert record.version == s.book.jobs["j"].version
        assert await s.store.is_applied(fact.event_id, f"{namespace}_scheduler-suspended")
        assert consumer.stats.failed == 0


async def test_a_silent_node_keeps_its_gpus_until_the_lease_ttl_has_passed(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    ttl = 1.5
    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 1, "n1": 1}, heartbeat_s=0.1)
        s = await c.start_scheduler(policy="fifo", round_s=0.2, lease_ttl_s=ttl, reconcile_grace_s=0.5)
        await wait_for(lambda: s.is_leader and len(s.inventory) == 2, what="leader")
        await c.submit("a", spec("a"))
        await wait_for(lambda: "a" in running_jobs(s), what="a running")
        node, lease_id = await held_by_worker(workers, "a")
        other = "n1" if node == "n0" else "n0"
        await c.submit("b", spec("b"))
        await wait_for(lambda: "b" in running_jobs(s), what="b running")
        await c.submit("c", spec("c"))
        workers.silent.add(node)
        await wait_for(lambda: s.book.jobs["a"].state.status is JobStatus.QUEUED, timeout_s=5, what="a requeued")
        # The TTL counts from the last heartbeat the scheduler received, never earlier than its publication
        # (on a loaded machine that heartbeat may be well before the node fell silent).
        assert time.monotonic() - workers.last_heartbeat_at[node] >= ttl
        assert not s.inventory.is_live(node)
        # Nobody was granted the silent node's GPU meanwhile.
        assert [n for cmd, _, n, _ in workers.log if cmd == "grant" and n == node] == [node]
        # The node comes back: it stopped "a" itself at the lease TTL, with a checkpoint at iteration 10.
        # Its heartbeat overtakes the job.suspended still in its outbox (issue 18's race, forced here
        # every time): the fact lands only after the node's GPU was granted again.
        late = await workers.finish(node, lease_id, completed=False, reason=SuspendReason.LEASE_EXPIRED,
                                    publish=False)  # fmt: skip
        workers.silent.discard(node)
        await wait_for(
            lambda: len([1 for cmd, _, n, _ in workers.log if cmd == "grant" and n == node]) == 2,
            what="the node's GPU granted again",
        )
        await c.client.publish(JOB_SUSPENDED, late)
        # The late checkpoint is newer than what a re-grant of "a" resumed from: it is kept.
        await wait_for(lambda: s.book.jobs["a"].checkpoint_path == "/ckpt/a/10", what="a's checkpoint recorded")
        assert s.book.resume_iteration(s.book.jobs["a"]) == 10
        assert workers.nodes[other].leases  # "b" kept running throughout
        assert workers.max_concurrent_runs == 1


async def test_a_follower_takes_over_with_a_higher_epoch_and_workers_refuse_the_old_one(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 2, "n1": 2})
        first = await c.start_scheduler(policy="fifo")
        second = await c.start_scheduler(policy="fifo")
        await wait_for(lambda: first.is_leader or second.is_leader, what="a leader")
        await asyncio.sleep(0.3)  # time for a wrongly elected second leader to show (one must never be)
        assert [first.is_leader, second.is_leader].count(True) == 1
        leader, follower = (first, second) if first.is_leader else (second, first)
        old_epoch = leader.epoch
        assert old_epoch is not None
        await wait_for(lambda: len(leader.inventory) == 2, what="nodes known")
        for i in range(3):
            await c.submit(f"job-{i}", spec(f"job-{i}"))
        await wait_for(lambda: len(running_jobs(leader)) == 3, what="3 running")
        await wait_for(lambda: len(workers.log) == 3, what="3 grants taken")
        before = {lid for cmd, lid, *_ in workers.log if cmd == "grant"}

        await c.crash(leader)
        crashed_at = time.monotonic()
        await wait_for(lambda: follower.is_leader, timeout_s=5, what="follower elected")
        assert time.monotonic() - crashed_at < 3.0  # about one leader TTL (1 s)
        new_epoch = follower.epoch
        assert new_epoch is not None
        assert new_epoch > old_epoch
        # The new leader knows the running jobs from the store: nothing is granted twice.
        assert running_jobs(follower) == {"job-0", "job-1", "job-2"}
        assert set(follower.book.leases) == before

        await c.submit("job-3", spec("job-3"))
        await wait_for(lambda: "job-3" in running_jobs(follower), what="job-3 running under the new leader")
        await wait_for(lambda: len(workers.log) == 4, what="job-3's grant taken")
        new_grants = [(lid, epoch) for cmd, lid, _, epoch in workers.log if cmd == "grant" and lid not in before]
        assert [epoch for _, epoch in new_grants] == [new_epoch]
        assert workers.max_concurrent_runs == 1

        # A command of the deposed leader's term is refused by a worker that has seen the new one.
        node = next(n for cmd, _, n, epoch in workers.log if cmd == "grant" and epoch == new_epoch)
        stale = LeaseGrant(
            epoch=old_epoch, lease_id="Lstale", job_id="job-9", node_id=node, gpus=[0], spec=spec("job-9")
        )
        ack = await c.client.request(lease_grant(node), stale, LeaseAck)
        assert not ack.accepted
        assert ack.error is LeaseAckError.STALE_EPOCH
        assert ack.epoch_seen == new_epoch
        reply = await c.query()
        assert reply.epoch == new_epoch


async def test_restarting_with_another_policy_keeps_running_jobs_and_loses_or_duplicates_none(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 2, "n1": 2})
        fifo = await c.start_scheduler(policy="fifo")
        await wait_for(lambda: fifo.is_leader and len(fifo.inventory) == 2, what="leader")
        jobs = [f"job-{i}" for i in range(8)]
        for job_id in jobs[:6]:
            await c.submit(job_id, spec(job_id))
        await wait_for(lambda: len(running_jobs(fifo)) == 4, what="4 running")
        await wait_for(lambda: len(workers.log) == 4, what="4 grants taken")
        leases_before = dict(fifo.book.leases)
        commands_before = len(workers.log)

        await c.stop_scheduler(fifo)
        for job_id in jobs[6:]:  # submitted while no scheduler runs: waiting on JetStream
            await c.submit(job_id, spec(job_id))
        las = await c.start_scheduler(policy="las", round_s=0.2)
        await wait_for(lambda: las.is_leader, what="las leads")
        assert las.policy.name == "las"
        # Running jobs keep running: the takeover re-grants nothing. LAS's rounds (every 0.2 s, the
        # first possibly before this check) may already time-slice, but a lease from before is
        # only ever revoked, never granted again, and no job runs twice at once.
        after = workers.log[commands_before:]
        assert all(lease_id not in leases_before for cmd, lease_id, _, _ in after if cmd == "grant"), after
        revoked = {lease_id for cmd, lease_id, _, _ in after if cmd == "revoke"}
        kept = {lease_id for lease_id in leases_before if lease_id not in revoked}
        assert kept <= set(las.book.leases)
        assert {leases_before[i].job_id for i in kept} <= running_jobs(las)
        assert workers.max_concurrent_runs == 1

        # Drive every job to completion; LAS time-slices meanwhile.
        completed: list[str] = []

        async def finish_running() -> None:
            for node in workers.nodes.values():
                for lease_id, held in list(node.leases.items()):
                    if not held.stopping and held.grant.is_coordinator:
                        completed.append(held.grant.job_id)
                        await workers.finish(node.node_id, lease_id, completed=True)

        deadline = time.monotonic() + 15
        while len(completed) < len(jobs) and time.monotonic() < deadline:
            await wait_for(
                lambda: (
                    any(not h.stopping for n in workers.nodes.values() for h in n.leases.values())
                    or len(completed) == len(jobs)
                ),
                what="something running",
            )
            await finish_running()
            await asyncio.sleep(0.05)
        assert sorted(completed) == jobs  # every job ran to completion exactly once
        assert workers.max_concurrent_runs == 1
        assert las.store is not None
        await wait_for(lambda: not las.book.jobs, what="book empty")
        for job_id in jobs:
            record = await las.store.get_job(job_id)
            assert record is not None
            assert record.status is JobStatus.COMPLETED, job_id


async def test_rounds_through_the_real_placement_service(broker: Broker, namespace: str, tmp_path: Path) -> None:
    from services.placement.service import PlacementConfig, PlacementService

    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 2, "n1": 2}, stop_delay_s=0.1)
        placement = PlacementService(PlacementConfig(nats=broker.url, namespace=namespace, policy="consolidated"))
        await placement.start(await c.connect("placement"))
        try:
            s = await c.start_scheduler(policy="las", with_placement=False)
            await wait_for(lambda: s.is_leader and len(s.inventory) == 2, what="leader")
            for i in range(3):
                await c.submit(f"big-{i}", spec(f"big-{i}", gpus=2))
            await wait_for(lambda: len(running_jobs(s)) == 2, what="two 2-GPU jobs running")
            for job_id in running_jobs(s):
                entry = s.book.entry(job_id)
                assert entry is not None
                assert entry.lease is not None
                assert len(entry.lease.parts) == 1  # consolidated: one node each
            # LAS time-slices: the waiting job (whichever the first round left out: equal service)
            # gets a node once the others have more service, in a later round.
            (waiting,) = {f"big-{i}" for i in range(3)} - running_jobs(s)
            await wait_for(lambda: waiting in running_jobs(s), timeout_s=10, what=f"{waiting} running")
            assert placement.plans >= 2
            assert workers.max_concurrent_runs == 1
            assert not workers.refused
        finally:
            await placement.stop()


class _ConvergedPolicy:
    """FIFO order; jobs named ``conv-*`` that run are reported converged (Blox §5.3 termination)."""

    name: ClassVar[str] = "test-converged"
    triggers: ClassVar[Trigger] = Trigger.TIMER

    def rank(self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Ranking:
        order = tuple(j.job_id for j in sorted(jobs.values(), key=lambda j: j.seq))
        done = {j.job_id: "converged" for j in jobs.values() if j.is_running and j.spec.name.startswith("conv")}
        return Ranking(order=order, terminate=done)


SCHEDULING.register("test-converged")(_ConvergedPolicy)


async def test_policy_termination_revokes_with_reason_terminate_and_completes_the_job(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 1})
        s = await c.start_scheduler(policy="test-converged")
        await wait_for(lambda: s.is_leader and len(s.inventory) == 1, what="leader")
        await c.submit("conv-1", spec("conv-1"))
        await c.submit("next", spec("next"))
        await wait_for(lambda: "next" in running_jobs(s), what="next running after conv-1 ended")
        lease_id = next(lid for cmd, lid, *_ in workers.log if cmd == "grant")
        assert workers.revoke_reasons == {lease_id: "terminate"}
        assert s.store is not None
        record = await s.store.get_job("conv-1")
        assert record is not None
        assert record.status is JobStatus.COMPLETED
        assert record.checkpoint_path == "/ckpt/conv-1/10"


async def test_the_module_runs_a_replica_that_leads_and_resigns_on_sigterm(
    broker: Broker, namespace: str, tmp_path: Path, bus: Bus
) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.scheduler", "--nats", broker.url, "--namespace", namespace,
        "--db", str(tmp_path / "db"), "--policy", "las", "--round-s", "1", "--leader-ttl-s", "2",
        "--log-format", "text", env=env, cwd=str(REPO),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        reply: JobsReply | None = None
        deadline = time.monotonic() + 20
        while reply is None:
            try:
                reply = await bus.request(QUERY_JOBS, JobsQuery(), JobsReply, timeout_s=0.5)
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
        assert reply.jobs == []
        assert reply.epoch > 0
        child.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(child.communicate(), 20)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    assert child.returncode == 0, stderr.decode()[-2000:]
    leader = await bus.kv("scheduler-leader", ttl_s=2)
    assert await leader.get("leader") is None  # resigned: a follower need not wait for the TTL


async def test_loss_reported_through_job_metrics_terminates_a_converged_job(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    import json

    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 1})
        s = await c.start_scheduler(policy="loss-termination")
        await wait_for(lambda: s.is_leader and len(s.inventory) == 1, what="leader")
        converging = JobSpec(name="fit", command=["python", "train.py"], loss_target=0.5, grace_period_s=5)
        await c.submit("fit", converging)
        # "after" only once "fit" holds the one GPU: submitted together, a fill round could take
        # "after"'s acceptance first and give it the GPU (2 runs in 14 failed so).
        _, lease_id = await held_by_worker(workers, "fit")
        await c.submit("after", spec("after"))
        await wait_for(lambda: (e := s.book.entry("after")) is not None and e.state.status is JobStatus.QUEUED,
                       what="after waiting")  # fmt: skip
        metrics = await c.client.kv("job-metrics", ttl_s=3600)
        await metrics.put("fit", json.dumps({"job_id": "fit", "iteration": 40, "loss": 0.9, "iteration_time_s": 0.5,
                                             "loss_history": [[1.0, 2.0], [2.0, 0.9]]}).encode())  # fmt: skip
        await wait_for(lambda: s.book.jobs["fit"].state.loss == 0.9, what="loss folded in")
        fit = s.book.jobs["fit"].state
        assert fit.loss_history == [(1.0, 2.0), (2.0, 0.9)]
        assert fit.iteration_time_s == 0.5
        # Two rounds that saw the loss run to their end: 0.9 is not converged, so neither decided a revoke
        # (a decision marks the lease in the book within its round; the worker hears it later).
        cues = s.cycle.cues_taken
        await wait_for(lambda: s.cycle.cues_taken >= cues + 2 and not s.cycle.in_round,
                       what="two rounds after the loss")  # fmt: skip
        lease = s.book.jobs["fit"].lease
        assert lease is not None
        assert lease.reason is None
        assert not workers.revoke_reasons
        await metrics.put("fit", json.dumps({"job_id": "fit", "iteration": 80, "loss": 0.5}).encode())
        await wait_for(lambda: "after" in running_jobs(s), what="after running once fit was terminated")
        assert workers.revoke_reasons == {lease_id: "terminate"}
        assert s.store is not None
        record = await s.store.get_job("fit")
        assert record is not None
        assert record.status is JobStatus.COMPLETED


async def test_a_completion_landing_after_its_lease_was_released_as_lost_ends_the_re_run(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    """A worker drops a finished job's lease from its heartbeats before its durable ``job.completed``
    lands. If the fact lags past ``reconcile_grace_s``, the lease counts as lost and the job is
    requeued and granted again; when the completion then lands, the job is completed (with that
    run's iterations) and the re-run is revoked, instead of the fact being dropped as stale and the
    job running twice to the end."""
    from schemas.jobs import JobCompleted
    from schemas.subjects import JOB_COMPLETED

    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 1}, heartbeat_s=0.1)
        s = await c.start_scheduler(policy="fifo", round_s=0.2, reconcile_grace_s=0.3)
        await wait_for(lambda: s.is_leader and len(s.inventory) == 1, what="leader")
        await c.submit("j", spec("j", grace=2.0))
        node, first = await held_by_worker(workers, "j")
        epoch = s.epoch
        # The job finishes: the worker forgets the lease, but its job.completed is held back.
        workers.nodes[node].leases.pop(first)
        workers.running["j"].discard(first)
        await wait_for(lambda: (held := workers.lease_of("j")) is not None and held[1] != first, timeout_s=5,
                       what="j requeued as lost and granted again")  # fmt: skip
        second = workers.lease_of("j")
        assert second is not None
        assert s.book.jobs["j"].state.preemptions == 1
        assert epoch is not None
        await c.client.publish(JOB_COMPLETED, JobCompleted(job_id="j", lease_id=first, node_id=node, epoch=epoch,
                                                           iteration=100, checkpoint_path="/ckpt/j/100"))  # fmt: skip
        await wait_for(lambda: "j" not in s.book.jobs, what="j completed and its re-run released")
        assert workers.revoke_reasons == {second[1]: "terminate"}
        assert not workers.nodes[node].leases
        assert s.store is not None
        record = await s.store.get_job("j")
        assert record is not None
        assert record.status is JobStatus.COMPLETED
        # The completed run's progress, not the re-run's checkpoint (iteration 10) reported at its revoke.
        assert record.iterations_done == 100
        assert record.checkpoint_path == "/ckpt/j/100"
        assert [cmd for cmd, *_ in workers.log].count("grant") == 2
        # The GPU is free for the next job.
        await c.submit("next", spec("next"))
        await held_by_worker(workers, "next")


async def test_commands_to_a_node_without_a_worker_get_no_answer_rather_than_an_error(bus: Bus) -> None:
    # Nothing serves the node's lease subjects (its worker died, or never started): the broker says
    # "no responders" at once. The executor must treat that as "no answer" and retry until its time
    # is up, as it does for a time-out, not let the error end the round (and the term).
    executor = LeaseExecutor(
        bus,
        epoch=1,
        is_current=lambda epoch: True,
        request_timeout_s=0.2,
        grant_attempts=2,
        max_parallel=4,
        hostname=lambda node: node,
    )
    lease = Lease(lease_id="lease-x", job_id="job-x", parts=(("node-gone", (0,)),), epoch=1, granted_at=time.time())
    assert await executor.revoke(lease, RevokeReason.PREEMPT, grace_s=1.0, until=time.time() + 0.5) is None
    with pytest.raises(GrantRefusedError, match="no answer"):
        await executor.grant(lease, spec("gone"), resume_from=None, resume_iteration=None, attempt=1)
    assert (executor.sent_grants, executor.sent_revokes) == (0, 0)


@pytest.mark.parametrize("held_fact_s", [4.0, 0.0])
async def test_after_a_failover_a_completion_the_old_leader_held_lands_before_the_lease_is_released(
    broker: Broker, namespace: str, tmp_path: Path, held_fact_s: float
) -> None:
    """A leader killed or frozen while it held a fetched ``job.completed`` hands it back only after
    the consumers' ``ack_wait``, and the node stopped listing the lease already. The new term waits
    ``held_fact_s`` before it releases such a lease as lost, so the completion lands first and the
    finished job is not granted again (the paused-leader chaos test saw it run twice). Here the
    completion is held back 1.5 s into the new term, against a ``reconcile_grace_s`` of 0.3 s; with
    ``held_fact_s`` 0 (the positive control) the lease is released as lost and the job granted again."""
    from schemas.jobs import JobCompleted
    from schemas.subjects import JOB_COMPLETED

    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 1}, heartbeat_s=0.1)
        first_leader = await c.start_scheduler(policy="fifo", round_s=0.2)
        await wait_for(lambda: first_leader.is_leader and len(first_leader.inventory) == 1, what="leader")
        await c.stop_scheduler(first_leader)
        s = await c.start_scheduler(policy="fifo", round_s=0.2, reconcile_grace_s=0.3, held_fact_s=held_fact_s)
        await wait_for(lambda: s.is_leader and len(s.inventory) == 1, what="the second leader")
        assert s.epoch is not None
        assert s.epoch >= 2
        await c.submit("j", spec("j", grace=2.0))
        node, lease = await held_by_worker(workers, "j")
        workers.nodes[node].leases.pop(lease)  # the job finished; its completion is held elsewhere
        workers.running["j"].discard(lease)
        if held_fact_s:
            await asyncio.sleep(1.5)  # the held fact's redelivery, well past reconcile_grace_s (not a wait for a fact)
            assert s.book.jobs["j"].state.preemptions == 0, "released as lost before the held completion could land"
        else:
            await wait_for(lambda: s.book.jobs["j"].state.preemptions == 1, timeout_s=10, what="j released as lost")
            # and granted again (the next round), before the late completion lands: the run twice
            await wait_for(lambda: [cmd for cmd, *_ in workers.log].count("grant") == 2, timeout_s=10,
                           what="j granted again")  # fmt: skip
        await c.client.publish(JOB_COMPLETED, JobCompleted(job_id="j", lease_id=lease, node_id=node, epoch=s.epoch,
                                                           iteration=100, checkpoint_path="/ckpt/j/100"))  # fmt: skip
        await wait_for(lambda: "j" not in s.book.jobs, what="j completed")
        assert [cmd for cmd, *_ in workers.log].count("grant") == (1 if held_fact_s else 2)
