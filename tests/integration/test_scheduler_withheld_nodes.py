"""A departed or silent node stops counting as free at once, in reasons and placement, while its
leases stand until the lease TTL (issue 15, item 4).

Before: a node's GPUs were free until it had been silent for the whole lease TTL (30 s), so a job
was placed on a node that was gone and ``roundhouse jobs`` said "needs 4 GPUs, 8 of 8 free". Now a
stopping worker says it drains with its first act (a heartbeat), and the scheduler withholds a
node it has not heard from for ``node_silent_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from pathlib import Path

from schemas.job import JobSpec
from services.runtime.broker import Broker
from services.scheduler.service import SchedulerService
from tests.fake_workers import FakeWorkers
from tests.integration.test_scheduler import cluster, held_by_worker, running_jobs, wait_for
from tests.integration.test_worker_harness import WorkerProcess, collect


def spec(name: str, gpus: int) -> JobSpec:
    return JobSpec(name=name, command=["python", "train.py"], gpus=gpus, grace_period_s=1.0)


async def beat(workers: FakeWorkers, nodes: set[str]) -> None:
    """Heartbeat the nodes in ``nodes`` (changed by the test as it goes) every 0.1 s."""
    while True:
        for node in sorted(nodes):
            await workers.heartbeat(node)
        await asyncio.sleep(0.1)  # the heartbeat period (a node's rhythm, not a wait for a fact)


def withheld(s: SchedulerService, node_id: str) -> bool:
    """Whether the scheduler takes no new work to ``node_id`` now (silent or draining)."""
    node = s.inventory.get(node_id)
    assert node is not None
    return not s.inventory.takes_work(node, s.replica.clock.monotonic())


async def test_a_silent_node_is_withheld_from_new_work_but_keeps_its_lease(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 2, "n1": 2})
        beating = {"n0"}
        heart = asyncio.create_task(beat(workers, beating))
        try:
            s = await c.start_scheduler(policy="fifo", node_silent_s=1.0, lease_ttl_s=30.0)
            await wait_for(lambda: s.is_leader and len(s.inventory) == 2, what="leader with 2 nodes")
            await wait_for(lambda: withheld(s, "n1"), what="n1 silent past node_silent_s")
            assert s.inventory.is_live("n1")  # still live: the TTL is 30 s

            await c.submit("a", spec("a", 2))
            await wait_for(lambda: "a" in running_jobs(s), what="a running")
            # Running in the book once the grant committed; the worker holds it once the grant arrived.
            node, _ = await held_by_worker(workers, "a")
            assert node == "n0"
            await c.submit("b", spec("b", 2))
            await wait_for(lambda: (e := s.book.entry("b")) is not None and e.state.is_waiting, what="b waiting")
            for _ in range(2):  # rounds run: b still waits, though n1's two GPUs hold nothing
                await s.run_round()
            assert "b" not in running_jobs(s)
            reply = await c.query(job_ids=["b"])
            assert re.match(r"needs 2 GPUs, 0 of 4 free", reply.jobs[0].reason or ""), reply.jobs[0].reason

            beating.add("n1")  # n1 speaks again: b starts there
            await wait_for(lambda: "b" in running_jobs(s), what="b running on n1")
            node, _ = await held_by_worker(workers, "b")
            assert node == "n1"

            beating.discard("n0")  # n0 falls silent: withheld from new work, its lease stands until the TTL
            await wait_for(lambda: withheld(s, "n0"), what="n0 silent past node_silent_s")
            await s.run_round()
            assert "a" in running_jobs(s)
            assert s.inventory.is_live("n0")
        finally:
            heart.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heart


async def test_a_departing_worker_is_withheld_at_once(broker: Broker, namespace: str, tmp_path: Path) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        facts = await collect(c.client)
        agent = WorkerProcess(broker.url, namespace, "leaving", tmp_path / "node", "--fake-gpus", "2",
                              "--heartbeat-s", "0.2", "--lease-ttl-s", "30")  # fmt: skip
        try:
            await agent.start(facts)
            s = await c.start_scheduler(policy="fifo", lease_ttl_s=30.0)  # silent after 15 s by default
            await wait_for(lambda: s.is_leader and len(s.inventory) == 1, timeout_s=15, what="leader with the node")
            stopped_at = time.monotonic()
            assert await agent.stop() == 0
            node = s.inventory.get("leaving")
            assert node is not None
            await wait_for(lambda: node.draining, timeout_s=3, what="the node said it leaves")
            await c.submit("late", spec("late", 1))
            await wait_for(lambda: (e := s.book.entry("late")) is not None and e.state.is_waiting, what="late waits")
            reply = await c.query(job_ids=["late"])
            assert re.match(r"needs 1 GPU, 0 of 2 free", reply.jobs[0].reason or ""), reply.jobs[0].reason
            assert time.monotonic() - stopped_at < 15  # well before silence or the TTL could have said so
            assert "late" not in running_jobs(s)
        finally:
            await agent.stop()
