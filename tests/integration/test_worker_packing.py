"""A real worker agent with packing (issue 17): it runs two leases on one GPU when both grants are
marked ``shared``, and still refuses ``gpu_busy`` to an unmarked (ordinary or forged) grant of a
busy GPU and to a shared grant of a GPU an exclusive lease holds."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from schemas.jobs import JobCompleted, JobStarted, JobSuspended
from schemas.leases import LeaseAckError, LeaseGrant
from schemas.nodes import NodeHeartbeat
from services.runtime.broker import Broker
from tests.integration.test_worker_harness import Facts, Scheduler, job_id, one_worker, wait_for, write_script

NODE = "packing-node"


@dataclass
class Node:
    facts: Facts
    scheduler: Scheduler
    script: Path

    def grant(self, iterations: int, sleep_s: float, *, gpu: int, shared: bool) -> LeaseGrant:
        command = [sys.executable, str(self.script), str(iterations), str(sleep_s)]
        grant = self.scheduler.grant(NODE, job_id(), command, gpus=[gpu])
        return grant.model_copy(update={"shared": shared})


@pytest.fixture(scope="module")
async def node(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Node]:
    tmp = tmp_path_factory.mktemp("packing")
    async with one_worker(broker.url, tmp, NODE) as (bus, facts, _worker, _work_dir):
        yield Node(facts, Scheduler(bus), write_script(tmp))


async def test_two_shared_leases_run_on_one_gpu_and_both_complete(node: Node) -> None:
    first = node.grant(500, 0.01, gpu=0, shared=True)  # ~5 s: still running when the second starts
    second = node.grant(150, 0.01, gpu=0, shared=True)
    assert (await node.scheduler.send(first)).accepted
    await node.facts.one(JobStarted, first.job_id)
    ack = await node.scheduler.send(second)
    assert ack.accepted, ack
    assert ack.message == ""  # nothing to wait for: it runs beside the first, not after it
    started = await node.facts.one(JobStarted, second.job_id)
    assert list(started.gpus) == [0]
    assert node.facts.end_of(first.job_id) == []  # both on GPU 0 at once
    assert isinstance(await node.facts.end(first.job_id), JobCompleted)
    assert isinstance(await node.facts.end(second.job_id), JobCompleted)


async def test_an_unmarked_grant_of_a_busy_gpu_is_still_refused(node: Node) -> None:
    shared = node.grant(100_000, 0.01, gpu=0, shared=True)
    exclusive = node.grant(100_000, 0.01, gpu=1, shared=False)
    for grant in (shared, exclusive):
        assert (await node.scheduler.send(grant)).accepted
        await node.facts.one(JobStarted, grant.job_id)
    beside_shared = await node.scheduler.send(node.grant(10, 0.01, gpu=0, shared=False))
    beside_exclusive = await node.scheduler.send(node.grant(10, 0.01, gpu=1, shared=True))
    for ack in (beside_shared, beside_exclusive):
        assert not ack.accepted
        assert ack.error is LeaseAckError.GPU_BUSY
    for grant in (shared, exclusive):
        assert (await node.scheduler.revoke(grant)).accepted
        assert isinstance(await node.facts.end(grant.job_id), JobSuspended)


async def test_a_full_gpu_and_a_jobs_own_gpu_refuse_shared_grants_and_move_no_fence(node: Node) -> None:
    # Two shared leases fill GPU 0 (MAX_JOBS_PER_GPU): the heartbeat lists both on GPU 0, each under
    # its own lease, which is what the scheduler's reconciliation matches (by lease id, not by GPU).
    # A third shared grant, even with a huge epoch, is refused gpu_busy and moves no fence; so is a
    # second lease of a job that runs there (packed beside itself it would run twice), and a shared
    # grant from an older epoch is refused as stale.
    first = node.grant(100_000, 0.01, gpu=0, shared=True)
    second = node.grant(100_000, 0.01, gpu=0, shared=True)
    for grant in (first, second):
        assert (await node.scheduler.send(grant)).accepted
        await node.facts.one(JobStarted, grant.job_id)

    def both_listed() -> bool:
        beats = [b for b in node.facts.of(NodeHeartbeat) if b.node_id == NODE]
        held = {h.lease_id: list(h.gpus) for h in beats[-1].leases} if beats else {}
        return held.get(first.lease_id) == [0] and held.get(second.lease_id) == [0]

    await wait_for(both_listed, what="a heartbeat listing both leases on GPU 0")
    third = node.grant(10, 0.01, gpu=0, shared=True).model_copy(update={"epoch": 2**53})
    refused = await node.scheduler.send(third)
    assert (refused.accepted, refused.error, refused.epoch_seen) == (
        False,
        LeaseAckError.GPU_BUSY,
        node.scheduler.epoch,
    )
    assert (await node.scheduler.revoke(second)).accepted
    assert isinstance(await node.facts.end(second.job_id), JobSuspended)
    own_job = node.grant(10, 0.01, gpu=0, shared=True).model_copy(update={"job_id": first.job_id})
    refused = await node.scheduler.send(own_job)
    assert (refused.accepted, refused.error) == (False, LeaseAckError.JOB_RUNNING)
    stale = node.grant(10, 0.01, gpu=0, shared=True).model_copy(update={"epoch": node.scheduler.epoch - 1})
    refused = await node.scheduler.send(stale)
    assert (refused.accepted, refused.error) == (False, LeaseAckError.STALE_EPOCH)
    assert node.facts.of(JobStarted, third.job_id) == []
    assert len(node.facts.of(JobStarted, first.job_id)) == 1  # it ran once
    assert (await node.scheduler.revoke(first)).accepted
    assert isinstance(await node.facts.end(first.job_id), JobSuspended)


async def test_a_second_lease_of_a_running_job_is_refused_on_any_gpu_and_says_which_runs(node: Node) -> None:
    # The last line of defence against a double run: a scheduler that lost track of a live run
    # grants the job again on a free GPU of the same node. The agent refuses it job_running, naming
    # the running lease; a grant of the busy GPU names who holds it and the rule it breaks.
    first = node.grant(100_000, 0.01, gpu=0, shared=False)
    assert (await node.scheduler.send(first)).accepted
    await node.facts.one(JobStarted, first.job_id)
    again = node.grant(10, 0.01, gpu=1, shared=False).model_copy(update={"job_id": first.job_id})
    refused = await node.scheduler.send(again)
    assert (refused.accepted, refused.error) == (False, LeaseAckError.JOB_RUNNING)
    assert f"already runs here under lease {first.lease_id}" in refused.message, refused.message
    busy = await node.scheduler.send(node.grant(10, 0.01, gpu=0, shared=False))
    assert (busy.accepted, busy.error) == (False, LeaseAckError.GPU_BUSY)
    assert f"GPU 0: lease {first.lease_id} (job {first.job_id}, exclusive)" in busy.message, busy.message
    assert "needs its GPUs free" in busy.message
    assert (await node.scheduler.revoke(first)).accepted
    assert isinstance(await node.facts.end(first.job_id), JobSuspended)
    assert len(node.facts.of(JobStarted, first.job_id)) == 1  # it ran once
