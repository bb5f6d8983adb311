"""The worker agent against forged commands and facts (issue 13): a refusal changes nothing, a peer's
fact counts only from the lease's gang, a checkpoint path from the bus stays in the job's directory.

One worker process (two fake GPUs) serves every test of this module; the test plays the scheduler
and the attacker, both with nothing but the bus.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from schemas.jobs import FailureReason, JobCompleted, JobFailed, JobStarted, JobSuspended
from schemas.leases import LeaseAckError, LeaseGrant, WorldInfo
from schemas.nodes import NodeHeartbeat
from schemas.subjects import JOB_FAILED, JOB_STARTED
from services.runtime.broker import Broker
from services.runtime.bus import Bus
from tests.integration.test_worker_harness import (
    Facts,
    Scheduler,
    WorkerProcess,
    job_id,
    one_worker,
    wait_for,
    write_script,
)

NODE = "trust-node"
HUGE_EPOCH = 2**53


@dataclass
class Cluster:
    bus: Bus
    facts: Facts
    scheduler: Scheduler
    worker: WorkerProcess
    script: Path
    work_dir: Path
    tmp: Path

    def ckpt_dir(self, job_id: str) -> Path:
        return self.work_dir / "checkpoints" / job_id

    def loop(self, iterations: int, sleep_s: float = 0.002) -> list[str]:
        return [sys.executable, str(self.script), str(iterations), str(sleep_s)]

    def epoch_on_disk(self) -> int | None:
        path = self.work_dir / "epoch"
        return int(path.read_text()) if path.exists() else None

    def fence(self) -> int:
        """The fence as the node's newest heartbeat tells it."""
        beats = [b for b in self.facts.of(NodeHeartbeat) if b.node_id == NODE]
        return int(beats[-1].epoch_seen)

    def dropped(self, lease_id: str, after: float = 0.0) -> bool:
        """Whether a heartbeat newer than ``after`` no longer lists the lease."""
        return any(b.node_id == NODE and b.ts > after and lease_id not in b.lease_ids
                   for b in self.facts.of(NodeHeartbeat))  # fmt: skip

    async def next_beat(self) -> NodeHeartbeat:
        seen = len(self.facts.of(NodeHeartbeat))
        beats = await wait_for(lambda: [b for b in self.facts.of(NodeHeartbeat)[seen:] if b.node_id == NODE])
        return beats[0]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
async def cluster(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    tmp = tmp_path_factory.mktemp("trust")
    async with one_worker(broker.url, tmp, NODE) as (bus, facts, worker, work_dir):
        yield Cluster(bus, facts, Scheduler(bus), worker, write_script(tmp), work_dir, tmp)


# --- attack 9: epoch poisoning ---------------------------------------------------------------------------
async def test_refused_commands_with_a_huge_epoch_move_no_fence_and_persist_nothing(cluster: Cluster) -> None:
    sched = cluster.scheduler
    # One accepted grant first, so that the fence has a known value (and an epoch file exists).
    held = sched.grant(NODE, job_id(), cluster.loop(100_000, 0.01), gpus=[1])
    assert (await sched.send(held)).accepted
    await cluster.facts.one(JobStarted, held.job_id)
    fence = (await sched.send(held)).epoch_seen
    assert fence == sched.epoch
    assert cluster.epoch_on_disk() == fence

    refusals = {
        "revoke of an unknown lease": await sched.revoke(sched.grant(NODE, job_id(), ["x"]), epoch=HUGE_EPOCH),
        "grant of a missing GPU": await sched.send(sched.grant(NODE, job_id(), ["x"], gpus=[7], epoch=HUGE_EPOCH)),
        "grant of a busy GPU": await sched.send(sched.grant(NODE, job_id(), ["x"], gpus=[1], epoch=HUGE_EPOCH)),
        "revoke naming another job": await sched.revoke(held.model_copy(update={"job_id": job_id()}), epoch=HUGE_EPOCH),
        "stop_at for a single-node lease": await sched.stop_at(held, 3, epoch=HUGE_EPOCH),
    }
    for what, ack in refusals.items():
        assert not ack.accepted, what
        assert ack.epoch_seen == fence, what
    assert refusals["revoke of an unknown lease"].error is LeaseAckError.UNKNOWN_LEASE
    assert refusals["revoke naming another job"].error is LeaseAckError.UNKNOWN_LEASE
    assert refusals["grant of a busy GPU"].error is LeaseAckError.GPU_BUSY
    # A repeated grant of a lease the node holds is acked as a duplicate: not a new acceptance either.
    duplicate = await sched.send(held.model_copy(update={"epoch": HUGE_EPOCH}))
    assert duplicate.duplicate
    assert duplicate.epoch_seen == fence
    assert cluster.epoch_on_disk() == fence
    assert (await cluster.next_beat()).epoch_seen == fence

    # The real scheduler is still obeyed: its revoke stops the lease, its next grant runs.
    assert (await sched.revoke(held)).accepted
    assert isinstance(await cluster.facts.end(held.job_id), JobSuspended)
    after = sched.grant(NODE, job_id(), cluster.loop(3))
    assert (await sched.send(after)).accepted
    assert isinstance(await cluster.facts.end(after.job_id), JobCompleted)


# --- attack 6: facts from peers ------------------------------------------------------------------------
def gang_grant(sched: Scheduler, job: str, command: list[str], *, node_rank: int, coordinator: str) -> LeaseGrant:
    world = WorldInfo(num_nodes=2, node_rank=node_rank, world_size=2, rank_offset=node_rank,
                      coordinator_node=coordinator, coordinator_host="127.0.0.1", coordinator_port=29_998)  # fmt: skip
    return sched.grant(NODE, job, command, world=world)


def failed(grant: LeaseGrant, node: str, **update: object) -> JobFailed:
    fact = JobFailed(job_id=grant.job_id, reason=FailureReason.EXIT_CODE, exit_code=3, lease_id=grant.lease_id,
                     node_id=node, epoch=grant.epoch, message="forged")  # fmt: skip
    return fact.model_copy(update=update)


def started(grant: LeaseGrant, node: str) -> JobStarted:
    return JobStarted(job_id=grant.job_id, lease_id=grant.lease_id, node_id=node, epoch=grant.epoch, gpus=[0])


async def test_a_peer_failure_counts_only_from_the_lease_gang(cluster: Cluster) -> None:
    sched, bus = cluster.scheduler, cluster.bus
    # This node coordinates a two-node lease; the other node is "peer-b" (never started here).
    grant = gang_grant(sched, job_id(), cluster.loop(100_000, 0.01), node_rank=0, coordinator=NODE)
    assert (await sched.send(grant)).accepted
    await cluster.facts.one(JobStarted, grant.job_id)
    forged = {
        "not in the gang": failed(grant, "intruder"),
        "this node itself": failed(grant, NODE),
        "unknown before its job.started": failed(grant, "peer-b"),
    }
    for fact in forged.values():
        await bus.publish(JOB_FAILED, fact)
    # Each wait reads only the log written since its facts were sent (an earlier line must not satisfy
    # it), and the next facts go out only once these were judged: the agent handles job.started and
    # job.failed on separate subscriptions, so peer-b's job.started must not overtake its forged
    # job.failed. The time-outs are generous: this is a real agent process on a loaded machine.
    ignored = "job.failed of lease {} from node {} ignored: node {} is not known to share lease"
    await wait_for(lambda: ignored.format(grant.lease_id, "peer-b", "peer-b") in cluster.worker.log_text(), 15,
                   "the refusal of peer-b's job.failed before its job.started")  # fmt: skip
    assert ignored.format(grant.lease_id, "intruder", "intruder") in cluster.worker.log_text()
    seen = len(cluster.worker.log_text())
    await bus.publish(JOB_STARTED, started(grant, "peer-b"))  # peer-b takes the gang's one other place
    await bus.publish(JOB_STARTED, started(grant, "intruder"))  # no place left for anyone else
    await wait_for(lambda: "2 nodes are all known already" in cluster.worker.log_text()[seen:], 15, "the refusal")
    other_job, seen = job_id(), len(cluster.worker.log_text())
    for fact in (
        failed(grant, "intruder"),
        failed(grant, "peer-b", job_id=other_job),
        failed(grant, "peer-b", epoch=grant.epoch + 1),
    ):
        await bus.publish(JOB_FAILED, fact)
    for why in (
        ignored.format(grant.lease_id, "intruder", "intruder"),
        f"lease {grant.lease_id} runs job {grant.job_id}, not {other_job}",
        f"lease {grant.lease_id} was granted in epoch {grant.epoch}, not {grant.epoch + 1}",
    ):
        await wait_for(lambda why=why: why in cluster.worker.log_text()[seen:], 15, f"the log line {why!r}")
    beat = await cluster.next_beat()
    assert grant.lease_id in beat.lease_ids, "a forged job.failed stopped the lease"
    assert "failed on node" not in cluster.worker.log_text()

    # The real peer's failure does stop the local ranks (nothing reported: the peer reported it).
    await bus.publish(JOB_FAILED, failed(grant, "peer-b"))
    await wait_for(lambda: f"lease {grant.lease_id} failed on node peer-b" in cluster.worker.log_text(), 15)
    await wait_for(lambda: cluster.dropped(grant.lease_id, after=beat.ts), 10, "the lease gone")
    assert not [e for e in cluster.facts.end_of(grant.job_id) if getattr(e, "message", None) != "forged"]


async def test_stop_at_is_taken_only_for_a_lease_this_node_holds_as_a_non_coordinator(cluster: Cluster) -> None:
    sched = cluster.scheduler
    part = gang_grant(sched, job_id(), cluster.loop(100_000, 0.01), node_rank=1, coordinator="coord-a")
    assert (await sched.send(part)).accepted
    await cluster.facts.one(JobStarted, part.job_id)
    other_job = await sched.stop_at(part.model_copy(update={"job_id": job_id()}), 3, epoch=sched.epoch)
    assert other_job.error is LeaseAckError.UNKNOWN_LEASE
    assert part.job_id in other_job.message
    unknown = await sched.stop_at(part.model_copy(update={"lease_id": "l-nosuch"}), 3, epoch=sched.epoch)
    assert unknown.error is LeaseAckError.UNKNOWN_LEASE
    assert (await cluster.next_beat()).lease_ids.count(part.lease_id) == 1

    single = sched.grant(NODE, job_id(), cluster.loop(100_000, 0.01), gpus=[1])
    assert (await sched.send(single)).accepted
    alone = await sched.stop_at(single, 3, epoch=sched.epoch)
    assert alone.error is LeaseAckError.WRONG_NODE
    assert "alone" in alone.message

    # The real thing: the lease's part here stops after the iteration the coordinator fixed.
    ok = await sched.stop_at(part, 3, epoch=sched.epoch)
    assert ok.accepted
    await wait_for(lambda: cluster.dropped(part.lease_id), 15, "the lease part stopped")
    assert (await sched.revoke(single)).accepted
    await cluster.facts.end(single.job_id)


# --- attack 2: checkpoint paths from the bus -------------------------------------------------------------
class Payload:
    """Pickled, it runs ``open(marker, "w")`` when loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return open, (str(self.marker), "w")


def plant(path: Path, marker: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps({"format": "roundhouse-checkpoint", "version": 1, "iteration": 7,
                                   "epoch": 0, "batch_index": 7, "extra": Payload(marker)}))  # fmt: skip
    # The positive control: loaded the unsafe way, the file does run its payload.
    pickle.loads(path.read_bytes())
    assert marker.exists()
    marker.unlink()
    return path


@pytest.mark.parametrize("where", ["elsewhere", "dot-dot", "symlink", "other-job", "relative"])
async def test_a_checkpoint_outside_the_job_directory_is_not_handed_to_the_job(cluster: Cluster, where: str) -> None:
    sched = cluster.scheduler
    job = job_id()
    marker = cluster.tmp / f"pwned-{job}"
    evil = plant(cluster.tmp / "attacker" / f"{job}.pt", marker)
    job_dir = cluster.ckpt_dir(job)
    job_dir.mkdir(parents=True, exist_ok=True)
    if where == "elsewhere":
        path = str(evil)
    elif where == "dot-dot":
        path = str(job_dir / ".." / ".." / ".." / "attacker" / f"{job}.pt")
    elif where == "symlink":
        (job_dir / "checkpoint.pt").symlink_to(evil)
        path = str(job_dir / "checkpoint.pt")
    elif where == "other-job":
        path = str(plant(cluster.ckpt_dir(job_id()) / "checkpoint.pt", marker))
    else:
        path = f"attacker/{job}.pt"
    grant = sched.grant(NODE, job, cluster.loop(3)).model_copy(update={"resume_from": path, "resume_iteration": 7})
    ack = await sched.send(grant)
    assert ack.accepted
    assert "starting from scratch" in ack.message
    start = await cluster.facts.one(JobStarted, job)
    assert start.resumed_from is None
    assert start.iteration == 0
    end = await cluster.facts.end(job)
    assert isinstance(end, JobCompleted), end
    assert end.iteration == 3
    assert end.checkpoint_path == str(job_dir.resolve() / "checkpoint.pt")
    assert not marker.exists()
