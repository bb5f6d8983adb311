"""A worker cut off from the bus suspends its jobs after lease_ttl, and reports it once it is back.

The test owns its broker (the session one is shared), stops it under a running job, and restarts it.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from schemas.jobs import JobStarted, JobSuspended, SuspendReason
from services.runtime.broker import Broker
from services.runtime.bus import Bus, BusOptions
from services.worker.channel import Channel, ClientStatus
from tests.integration.test_worker_harness import Scheduler, WorkerProcess, collect, steps, wait_for, write_script

LEASE_TTL_S = 4.0
"""Long enough that a loaded machine's stalls stay small beside half of it (when the agent stops)."""


async def test_a_worker_cut_off_from_the_bus_suspends_its_jobs_after_lease_ttl(tmp_path: Path) -> None:
    broker = Broker(tmp_path / "nats")
    await broker.astart()
    bus = await Bus.connect(broker.url, name="test-cutoff", options=BusOptions(namespace="cutoff"))
    worker = WorkerProcess(
        broker.url,
        "cutoff",
        "lonely",
        tmp_path / "lonely",
        "--fake-gpus",
        "1",
        "--lease-ttl-s",
        str(LEASE_TTL_S),
        "--heartbeat-s",
        "0.2",
    )
    try:
        facts = await collect(bus)
        await worker.start(facts)
        sched = Scheduler(bus)
        script = write_script(tmp_path)
        grant = sched.grant("lonely", "cut-job", [sys.executable, str(script), "100000", "0.01"], grace_s=5)
        assert (await sched.send(grant)).accepted
        await facts.one(JobStarted, "cut-job")
        ckpt_dir = tmp_path / "lonely" / "checkpoints" / "cut-job"
        await wait_for(lambda: len(steps(ckpt_dir)) >= 3, what="progress")
        channel = Channel.open(tmp_path / "lonely" / "leases" / grant.lease_id / "rank-0.chan")

        await broker.astop()
        loop = asyncio.get_running_loop()
        cut_at = loop.time()
        # A short cut: optimistic leases keep running without the scheduler (progress, observed
        # well before the agent may start stopping at half the TTL).
        before = channel.iteration
        await wait_for(lambda: channel.iteration > before + 2, LEASE_TTL_S * 0.4, "progress while cut off")
        assert channel.status is ClientStatus.RUNNING
        assert loop.time() - cut_at < LEASE_TTL_S * 0.5
        await wait_for(lambda: channel.status is ClientStatus.STOPPED, 10, "the job stopped on its own")
        stopped_after = loop.time() - cut_at
        # The agent starts stopping after half the TTL without contact and is done within the TTL
        # (before the scheduler may reassign the GPUs).
        assert LEASE_TTL_S * 0.5 - 0.25 <= stopped_after <= LEASE_TTL_S
        stopped_at = channel.iteration

        await broker.astart()  # same port, same JetStream store
        # Facts are durable: read them from the stream (a core subscription may still be reconnecting
        # when the worker publishes).
        durable: list[JobSuspended] = []

        async def keep(event: JobSuspended) -> None:
            durable.append(event)

        await wait_for(lambda: bus.nc.is_connected, 10, "the test's reconnect")
        await bus.consume("job.suspended.*", JobSuspended, keep, durable="cutoff-test")
        suspended = (await wait_for(lambda: durable, 20, "job.suspended on the stream"))[0]
        assert isinstance(suspended, JobSuspended), suspended
        assert suspended.reason is SuspendReason.LEASE_EXPIRED
        assert suspended.iteration == stopped_at
        assert suspended.checkpoint_iteration == stopped_at
        assert steps(ckpt_dir) == list(range(stopped_at))
        channel.close()
    finally:
        code = await worker.stop()
        await bus.close()
        await broker.astop()
    assert code == 0, worker.log_text()
