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
from services.runtime.broker import Broker
from tests.integration.test_worker_harness import Facts, Scheduler, job_id, one_worker, write_script

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
