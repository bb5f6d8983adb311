"""More of the scheduler's failure paths with every part real (issue 18, item 2; the first ones are in
``test_failure_paths.py``): a grant the node refuses, rolled back; a new leader that finds a running
job's node gone; a lease a node runs that the scheduler does not hold (its store was restored from a
backup), revoked. Each test ends in what a user sees: ``roundhouse jobs --json --all``."""

from __future__ import annotations

import logging
import signal
import uuid
from pathlib import Path

import pytest

from schemas.jobs import JobStarted, JobSuspended, SuspendReason
from schemas.nodes import NodeHeartbeat, NodeRegister
from schemas.subjects import NODE_REGISTER
from services.runtime.broker import Broker
from tests.helpers import eventually
from tests.live_parts import LiveParts, emulated_job, live_parts


async def kill_agent(parts: LiveParts, node_id: str) -> None:
    """SIGKILL ``node_id``'s agent (its emulated runs die with it) and forget it: it is not stopped at the end."""
    worker = parts.workers.pop(node_id)
    assert worker.process is not None
    worker.process.send_signal(signal.SIGKILL)
    await worker.process.wait()


async def test_a_grant_the_node_refuses_is_rolled_back_and_the_job_runs_once_the_node_can_take_it(
    broker: Broker, tmp_path: Path
) -> None:
    """The node registered a GPU it no longer has (a GPU fell off the bus: its register is replayed
    with two GPUs, the agent has one). The grant of a two-GPU job is refused (no_such_gpu) round after
    round and rolled back each time: the job waits, never started, no preemption counted. Once the
    agent restarts with both GPUs, the job runs, once."""
    async with live_parts(broker, tmp_path) as parts:
        leader = await parts.up({"node-a": 1})
        first = parts.workers["node-a"]
        registered = next(e for e in parts.facts.of(NodeRegister) if e.incarnation == first.incarnation)
        gpu = registered.gpus[0]
        lost = gpu.model_copy(update={"index": 1, "uuid": f"GPU-{uuid.uuid4()}"})
        claimed = registered.model_copy(update={"event_id": uuid.uuid4(), "gpus": [gpu, lost]})
        await (await parts.connect("stale-register")).publish(NODE_REGISTER, claimed)
        await eventually(lambda: (n := leader.inventory.get("node-a")) is not None and n.gpus == (0, 1), 15,
                         "the scheduler counting two GPUs on node-a")  # fmt: skip

        job = await parts.submit(emulated_job("wide", gpus=2, seconds=20))
        await eventually(lambda: first.log_text().count("refused no_such_gpu") >= 2, 30, "two grants refused")
        # The first refusal was rolled back before the next round granted again: the job waits.
        view = (await parts.jobs(job))[job]
        assert view.status in ("queued", "running")  # between a rollback and the next (refused) grant
        assert not parts.facts.of(JobStarted, job)

        # The agent restarts with both GPUs. Placement stops first and the last grant settles: a grant
        # retried across the restart would reach the new agent before its register is applied, and
        # the register's revoke of the node's old leases would then preempt that run (see the report).
        await parts.stop_placement(parts.placements[0])
        term = leader.replica.term
        assert term is not None
        settled = lambda: term.dispatch is None or term.dispatch.done()  # noqa: E731
        await eventually(lambda: (e := leader.book.entry(job)) is not None and e.lease is None and settled(), 15,
                         "the last grant rolled back")  # fmt: skip
        await kill_agent(parts, "node-a")
        again = await parts.start_worker("node-a", 2)
        await eventually(lambda: (n := leader.inventory.get("node-a")) is not None
                         and n.incarnation == str(again.incarnation), 15, "the new agent registered")  # fmt: skip
        await parts.start_placement()
        done = await parts.until_status(job, "completed", timeout_s=60)
        runs = parts.facts.of(JobStarted, job)
        assert len(runs) == 1, runs
        assert sorted(runs[0].gpus) == [0, 1]
        assert done.preemptions == 0  # a grant no worker took is no preemption
        seen = (await parts.cli_jobs(job))[job]
        assert seen["status"] == "completed"
        assert seen["preemptions"] == 0
        assert seen["iterations_done"] == 200


async def test_a_new_leader_requeues_the_job_of_a_node_that_died_while_no_leader_was_there(
    broker: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Requeue at election: the leader dies, then the agent of the node running the job. The new
    leader loads the job running and its lease from the store, gives every node a fresh TTL (nobody
    knows when they last spoke), hears nothing from that node for the TTL and requeues the job,
    which runs again on the other node, once."""
    caplog.set_level(logging.WARNING, logger="roundhouse.scheduler")
    async with live_parts(broker, tmp_path) as parts:
        old = await parts.up({"node-a": 1, "node-b": 1}, lease_ttl_s=3.0)
        # 15 s of real time at speed-up 100: far longer than crashing the leader and killing the
        # agent take on a loaded machine (at 1 s the job finished on its node first, 1 run in 2 beside
        # a CPU hog, and nothing was left to requeue).
        job = await parts.submit(emulated_job("stranded", seconds=1500))
        started = await parts.facts.one(JobStarted, job, 20)
        gone = started.node_id
        survivor = "node-b" if gone == "node-a" else "node-a"
        old_epoch = old.epoch
        await parts.crash_scheduler(old)
        await kill_agent(parts, gone)

        new = await parts.start_scheduler(lease_ttl_s=3.0)
        await eventually(lambda: new.is_leader, 20, "a new leader")
        done = await parts.until_status(job, "completed", timeout_s=120)
        silent = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"node {gone} silent")]
        assert silent, "the job was not requeued for its node's silence"
        runs = parts.facts.of(JobStarted, job)
        assert [(r.node_id, r.epoch) for r in runs] == [(gone, old_epoch), (survivor, new.epoch)]
        assert done.preemptions == 1
        seen = (await parts.cli_jobs(job))[job]
        assert seen["status"] == "completed"
        assert seen["preemptions"] == 1
        assert seen["iterations_done"] == 15000  # run again from iteration 0: the lost run never checkpointed


async def test_a_lease_a_restored_store_does_not_know_is_revoked_and_its_process_stopped(
    broker: Broker, tmp_path: Path
) -> None:
    """Revokes of unknown leases: the store is restored from a backup taken before a job was
    submitted, and a replica on it takes over. The node still runs that job's lease, of the old
    epoch; the new leader holds no such lease, so it revokes it: the run stops (job.suspended), the
    node's heartbeats list nothing, and its GPU takes the next job."""
    async with live_parts(broker, tmp_path) as parts:
        old = await parts.up({"node-a": 1})
        backup = parts.back_up_store("backup.db")
        job = await parts.submit(emulated_job("forgotten", seconds=1000))
        started = await parts.facts.one(JobStarted, job, 20)
        await parts.crash_scheduler(old)

        new = await parts.start_scheduler(db=backup)
        await eventually(lambda: new.is_leader, 20, "a leader on the restored store")
        assert new.book.entry(job) is None  # the backup never heard of it
        stopped = await parts.facts.one(JobSuspended, job, 30)
        assert stopped.lease_id == started.lease_id
        assert stopped.reason is SuspendReason.PREEMPTED  # revoked, not the agent's own lease-TTL cut-off
        assert new.epoch is not None
        assert stopped.epoch == started.epoch < new.epoch
        await eventually(
            lambda: any(h.node_id == "node-a" and h.ts > stopped.ts and not h.leases
                        for h in parts.facts.of(NodeHeartbeat)), 15, "node-a holding no lease",
        )  # fmt: skip

        after = await parts.submit(emulated_job("next", seconds=10))
        await parts.until_status(after, "completed", timeout_s=60)
        assert [r.lease_id for r in parts.facts.of(JobStarted, job)] == [started.lease_id]  # never run again
        seen = await parts.cli_jobs(job, after)
        # (The forgotten job is not listed: the restored store lost it, and the accepted event it came
        # from was acked by the old leader. Recovering it is not this path's job; see the report.)
        assert seen[after]["status"] == "completed"
        assert seen[after]["iterations_done"] == 100
        assert seen[after]["preemptions"] == 0
