"""The ETA of a queued job does not count a drained node's free GPUs (issue 14, item 7), against a
real broker, scheduler and placement service with fake worker agents.

n1 is drained and idle, n0's only GPU runs a job declared to take 1,000 s: a queued job waits for
n0, so its ETA is about 1,000 s (before, the ETA's simulation placed it on n1 at once: ETA 0).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from schemas.job import JobSpec
from services.runtime.broker import Broker
from tests.integration.test_node_drain import beating, drain, leader, waiting
from tests.integration.test_scheduler import Cluster, cluster, held_by_worker, wait_for


def timed(name: str, duration_s: float) -> JobSpec:
    return JobSpec(name=name, command=["python", "train.py"], gpus=1, expected_duration_s=duration_s)


async def eta_of(c: Cluster, job_id: str, timeout_s: float = 20.0) -> float:
    """The job's ``eta_s`` once the leader's ETA run has one (polled; bounded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        view = (await c.query(job_ids=[job_id])).jobs[0]
        if view.eta_s is not None:
            return view.eta_s
        assert time.monotonic() < deadline, f"no ETA for {job_id} within {timeout_s} s: {view}"
        await asyncio.sleep(0.05)


async def test_a_drained_nodes_free_gpus_do_not_shorten_an_eta(broker: Broker, namespace: str, tmp_path: Path) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 1, "n1": 1})
        async with beating(workers):
            s = await leader(c, eta_executor="thread", eta_interval_s=0.1)
            await drain(c.client, "n1", reason="maintenance")
            await c.submit("a", timed("a", 1000.0))
            assert (await held_by_worker(workers, "a"))[0] == "n0"
            await c.submit("b", timed("b", 100.0))
            await wait_for(lambda: waiting(s, "b"), what="b waiting")
            eta = await eta_of(c, "b")
            assert 900.0 < eta <= 1000.0, eta  # behind a (1,000 s), not on n1's free GPU

            await drain(c.client, "n1", undo=True)  # and it was n1 that held b back
            assert (await held_by_worker(workers, "b"))[0] == "n1"
