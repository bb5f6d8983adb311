"""A lease spread over two workers: who reports what, and a failure on one node stopping the other."""

from __future__ import annotations

import sys
from pathlib import Path

from schemas.jobs import FailureReason, JobFailed, JobStarted
from schemas.leases import LeaseGrant, WorldInfo
from services.runtime.broker import Broker
from services.runtime.bus import Bus
from services.worker.channel import Channel
from tests.integration.test_worker_harness import Scheduler, WorkerProcess, collect, wait_for, write_script


def two_node_grants(sched: Scheduler, job_id: str, command: list[str]) -> list[LeaseGrant]:
    first = sched.grant("mn-a", job_id, command)
    out = []
    for node_rank, node in enumerate(("mn-a", "mn-b")):
        world = WorldInfo(num_nodes=2, node_rank=node_rank, world_size=2, rank_offset=node_rank,
                          coordinator_node="mn-a", coordinator_host="127.0.0.1", coordinator_port=29999)
        out.append(first.model_copy(update={"node_id": node, "world": world}))
    return out


async def test_a_failed_rank_on_one_node_is_reported_there_and_stops_the_other_node(
    broker: Broker, bus: Bus, namespace: str, tmp_path: Path
) -> None:
    facts = await collect(bus)
    workers = [WorkerProcess(broker.url, namespace, node, tmp_path / node, "--fake-gpus", "1",
                             "--kill-after-s", "0.5") for node in ("mn-a", "mn-b")]  # fmt: skip
    for worker in workers:
        await worker.start(facts)
    try:
        sched = Scheduler(bus)
        script = write_script(tmp_path)
        # Rank 1 (on mn-b) fails after 3 iterations; rank 0 (on mn-a) would run for minutes.
        grants = two_node_grants(sched, "mn-job", [sys.executable, str(script), "100000", "0.01", "crash", "1"])
        for g in grants:
            assert (await sched.send(g)).accepted
        await wait_for(lambda: len(facts.of(JobStarted, "mn-job")) == 2, 20, "both parts started")
        assert {e.node_id for e in facts.of(JobStarted, "mn-job")} == {"mn-a", "mn-b"}
        failed = await facts.end("mn-job", 20)
        assert isinstance(failed, JobFailed), failed
        assert failed.node_id == "mn-b"
        assert failed.reason is FailureReason.EXIT_CODE
        assert failed.exit_code == 3
        # mn-a stops rank 0 (it would otherwise wait in a collective forever) and reports nothing itself.
        chan = Channel.open(tmp_path / "mn-a" / "leases" / grants[0].lease_id / "rank-0.chan")
        group = chan.group
        assert group is not None

        def rank0_gone() -> bool:
            try:
                Path(f"/proc/{group}").stat()
            except FileNotFoundError:
                return True
            return False

        await wait_for(rank0_gone, 10, "rank 0 stopped")
        await wait_for(lambda: "failed on node mn-b" in workers[0].log_text(), 15, "mn-a's log")
        assert len(facts.end_of("mn-job")) == 1
    finally:
        for worker in workers:
            assert await worker.stop() == 0, worker.log_text()
