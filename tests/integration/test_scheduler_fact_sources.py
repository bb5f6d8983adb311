"""Issue 13, deliverable 4: a worker's fact is applied only if it comes from the node that holds
that lease, for that job, in the lease's epoch; a heartbeat speaks only about its own node's leases.

Real nats-server, real SQLite store, the real placement service, fake worker agents. The broker
vouches for the speaking node (``job.completed.<node>``: the test publishes as that node would);
what the scheduler checks is whether that node may speak about the lease and job it names. Each
forged message is refused (counted by reason), persists nothing (the job's row keeps its version,
the event is not marked applied) and is acked, not dead-lettered; the jobs beside it run and end.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from schemas.jobs import (
    CompletionReason,
    FailureReason,
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobSuspended,
    SuspendReason,
)
from schemas.nodes import HeldLease, NodeHeartbeat
from schemas.subjects import (
    JOB_CHECKPOINTED,
    JOB_COMPLETED,
    JOB_FAILED,
    JOB_SUSPENDED,
    NODE_HEARTBEAT,
)
from services.core.state import JobStatus
from services.runtime.broker import Broker
from services.runtime.store import LeaseState
from services.scheduler.replica import CONSUMERS
from services.scheduler.service import SchedulerService
from tests.fake_workers import FakeWorkers
from tests.integration.test_scheduler import Cluster, cluster, held_by_worker, running_jobs, spec, wait_for


@asynccontextmanager
async def two_running(
    broker: Broker, namespace: str, tmp_path: Path
) -> AsyncIterator[tuple[Cluster, SchedulerService, FakeWorkers]]:
    """``victim`` and ``legit`` running, one per 1-GPU node, and ``waiting`` (4 GPUs) that never runs."""
    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 1, "n1": 1})
        s = await c.start_scheduler(policy="fifo")
        await wait_for(lambda: s.is_leader and len(s.inventory) == 2, what="leader with 2 nodes")
        await c.submit("victim", spec("victim"))
        await c.submit("legit", spec("legit"))
        await c.submit("waiting", spec("waiting", gpus=4))
        await wait_for(lambda: running_jobs(s) == {"victim", "legit"}, what="victim and legit running")
        await wait_for(lambda: all(lease.started for lease in s.book.leases.values()), what="both started")
        yield c, s, workers


def refusals(s: SchedulerService, key: str) -> int:
    return s.replica.refusals.counts[key]


Fact = JobCompleted | JobFailed | JobCheckpointed | JobSuspended


async def forge_and_expect_refusal(c: Cluster, s: SchedulerService, subject: str, fact: Fact, key: str) -> None:
    """Publish ``fact`` as its node would, wait for its refusal, and check that nothing was persisted."""
    job_id = fact.job_id
    assert s.store is not None
    before = await s.store.get_job(job_id)
    assert before is not None
    count = refusals(s, key)
    await c.client.publish(subject, fact)
    await wait_for(lambda: refusals(s, key) > count, what=f"refusal {key}")
    after = await s.store.get_job(job_id)
    assert after is not None
    assert (after.status, after.version, after.checkpoint_path) == (
        before.status,
        before.version,
        before.checkpoint_path,
    )
    consumer = f"{c.namespace}_{CONSUMERS[subject]}"
    assert not await s.store.is_applied(fact.event_id, consumer)


def assert_nothing_dead_lettered(s: SchedulerService) -> None:
    term = s._term
    assert term is not None
    assert sum(consumer.stats.dead_lettered for consumer in term.consumers) == 0


async def legit_jobs_still_end(s: SchedulerService, workers: FakeWorkers) -> None:
    """The victim still runs under its lease; both jobs then complete from their own nodes."""
    assert s.store is not None
    assert "victim" in running_jobs(s)
    for job_id in ("legit", "victim"):
        node, lease_id = await held_by_worker(workers, job_id)
        await workers.finish(node, lease_id, completed=True)
    for job_id in ("legit", "victim"):
        await wait_for(lambda: job_id not in s.book.jobs, what=f"{job_id} finished")  # noqa: B023 (called at once)
        record = await s.store.get_job(job_id)
        assert record is not None
        assert record.status is JobStatus.COMPLETED


async def test_forged_completions_are_refused_and_persist_nothing(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    async with two_running(broker, namespace, tmp_path) as (c, s, workers):
        victim_node, victim_lease = await held_by_worker(workers, "victim")
        other = "n1" if victim_node == "n0" else "n0"
        epoch = s.book.leases[victim_lease].epoch
        # A real lease id, spoken by the other node.
        await forge_and_expect_refusal(c, s, JOB_COMPLETED, JobCompleted(
            job_id="victim", lease_id=victim_lease, node_id=other, epoch=epoch, iteration=1,
            reason=CompletionReason.EXITED,
        ), "job.completed:other_node")  # fmt: skip
        # A made-up lease id, from the victim's own node.
        await forge_and_expect_refusal(c, s, JOB_COMPLETED, JobCompleted(
            job_id="victim", lease_id="L" + uuid.uuid4().hex, node_id=victim_node, epoch=epoch, iteration=1,
        ), "job.completed:unknown_lease")  # fmt: skip
        # The real lease from its own node, but another epoch.
        await forge_and_expect_refusal(c, s, JOB_COMPLETED, JobCompleted(
            job_id="victim", lease_id=victim_lease, node_id=victim_node, epoch=epoch + 1, iteration=1,
        ), "job.completed:wrong_epoch")  # fmt: skip
        # A job that never ran: no lease of it exists anywhere.
        await forge_and_expect_refusal(c, s, JOB_COMPLETED, JobCompleted(
            job_id="waiting", lease_id=victim_lease, node_id=victim_node, epoch=epoch, iteration=1,
        ), "job.completed:other_job")  # fmt: skip
        await forge_and_expect_refusal(c, s, JOB_COMPLETED, JobCompleted(
            job_id="waiting", lease_id="L" + uuid.uuid4().hex, node_id=other, epoch=epoch, iteration=1,
        ), "job.completed:unknown_lease")  # fmt: skip
        assert s.book.jobs["waiting"].state.status is JobStatus.QUEUED
        assert s.book.leases[victim_lease].state is LeaseState.GRANTED
        assert not [entry for entry in workers.log if entry[0] == "revoke"]  # nothing was stopped
        assert_nothing_dead_lettered(s)
        await legit_jobs_still_end(s, workers)


async def test_forged_failures_are_refused(broker: Broker, namespace: str, tmp_path: Path) -> None:
    async with two_running(broker, namespace, tmp_path) as (c, s, workers):
        victim_node, victim_lease = await held_by_worker(workers, "victim")
        other = "n1" if victim_node == "n0" else "n0"
        epoch = s.book.leases[victim_lease].epoch
        await forge_and_expect_refusal(c, s, JOB_FAILED, JobFailed(
            job_id="victim", lease_id=victim_lease, node_id=other, epoch=epoch, reason=FailureReason.SIGNAL,
            signal=9, message="forged",
        ), "job.failed:other_node")  # fmt: skip
        # Naming no lease: only about the lease the job holds, from a node of it.
        await forge_and_expect_refusal(c, s, JOB_FAILED, JobFailed(
            job_id="victim", node_id=other, reason=FailureReason.LAUNCH_ERROR, message="forged",
        ), "job.failed:other_node")  # fmt: skip
        await forge_and_expect_refusal(c, s, JOB_FAILED, JobFailed(
            job_id="waiting", node_id=other, reason=FailureReason.LAUNCH_ERROR, message="forged",
        ), "job.failed:no_lease")  # fmt: skip
        assert s.book.jobs["waiting"].state.status is JobStatus.QUEUED
        assert s.book.jobs["victim"].reason is None  # the forged message was not even kept as the reason
        assert_nothing_dead_lettered(s)
        await legit_jobs_still_end(s, workers)


async def test_forged_checkpoints_and_suspensions_record_no_path(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    async with two_running(broker, namespace, tmp_path) as (c, s, workers):
        victim_node, victim_lease = await held_by_worker(workers, "victim")
        other = "n1" if victim_node == "n0" else "n0"
        epoch = s.book.leases[victim_lease].epoch
        evil = "/tmp/attacker/evil.pt"
        await forge_and_expect_refusal(c, s, JOB_CHECKPOINTED, JobCheckpointed(
            job_id="victim", lease_id=victim_lease, node_id=other, epoch=epoch, checkpoint_path=evil, iteration=50,
        ), "job.checkpointed:other_node")  # fmt: skip
        await forge_and_expect_refusal(c, s, JOB_SUSPENDED, JobSuspended(
            job_id="victim", lease_id=victim_lease, node_id=other, epoch=epoch, reason=SuspendReason.PREEMPTED,
            iteration=50, checkpoint_path=evil, checkpoint_iteration=50,
        ), "job.suspended:other_node")  # fmt: skip
        # A suspension of a job that never ran, naming another job's lease: its path must not stick.
        await forge_and_expect_refusal(c, s, JOB_SUSPENDED, JobSuspended(
            job_id="waiting", lease_id=victim_lease, node_id=victim_node, epoch=epoch,
            reason=SuspendReason.PREEMPTED, iteration=50, checkpoint_path=evil, checkpoint_iteration=50,
        ), "job.suspended:other_job")  # fmt: skip
        for job_id in ("victim", "waiting"):
            assert s.book.jobs[job_id].checkpoint_path is None
        lease = s.book.leases[victim_lease]
        assert (lease.state, lease.stopped) == (LeaseState.GRANTED, False)
        assert_nothing_dead_lettered(s)
        await legit_jobs_still_end(s, workers)


async def test_a_heartbeat_naming_another_nodes_lease_is_refused_whole(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    async with two_running(broker, namespace, tmp_path) as (c, s, workers):
        victim_node, victim_lease = await held_by_worker(workers, "victim")
        other = "n1" if victim_node == "n0" else "n0"
        epoch = s.book.leases[victim_lease].epoch
        node = workers.nodes[other]
        beat = NodeHeartbeat(
            node_id=other, incarnation=node.incarnation, seq=node.seq + 1, epoch_seen=epoch,
            leases=[HeldLease(lease_id=victim_lease, job_id="victim", epoch=epoch, gpus=[0])],
        )  # fmt: skip
        count = refusals(s, "node.heartbeat:other_node")
        await c.client.publish(NODE_HEARTBEAT, beat)
        await wait_for(lambda: refusals(s, "node.heartbeat:other_node") > count, what="heartbeat refused")
        # No stray revoke was sent for it anywhere, and the victim's lease is as it was.
        assert not [entry for entry in workers.log if entry[0] == "revoke"]
        assert s.book.leases[victim_lease].state is LeaseState.GRANTED
        await legit_jobs_still_end(s, workers)


async def test_a_new_incarnation_revokes_only_its_own_nodes_leases_on_the_node(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    async with two_running(broker, namespace, tmp_path) as (_, s, workers):
        victim_node, victim_lease = await held_by_worker(workers, "victim")
        legit_node, legit_lease = await held_by_worker(workers, "legit")
        assert legit_node != victim_node
        # The legit node's agent restarts; its fake processes keep running (FakeWorkers forgets them
        # only with a new incarnation, so keep a copy to see that the revoke reaches the node).
        await workers.register(legit_node, new_incarnation=True)
        await wait_for(lambda: legit_lease not in s.book.leases, what="the restarted node's lease released")
        # The node answered unknown_lease for it (its new agent holds nothing): released, never
        # while the victim's lease on the other node changes.
        assert s.book.leases[victim_lease].state is LeaseState.GRANTED
        assert "victim" in running_jobs(s)
        assert not [entry for entry in workers.log if entry[0] == "revoke" and entry[1] == victim_lease]
        await wait_for(lambda: "legit" in running_jobs(s), what="legit granted again")
        await legit_jobs_still_end(s, workers)
