"""``--emulate --speedup X``: the same facts as real jobs, on a clock X times faster, nothing launched."""

from __future__ import annotations

import time
from pathlib import Path

from schemas.job import JobSpec
from schemas.jobs import CompletionReason, JobCompleted, JobStarted, JobSuspended
from services.runtime.broker import Broker
from services.runtime.bus import Bus
from tests.integration.test_worker_harness import Scheduler, WorkerProcess, collect, wait_for


async def test_emulated_jobs_progress_on_a_scaled_clock_and_report_like_real_ones(
    broker: Broker, bus: Bus, namespace: str, tmp_path: Path
) -> None:
    facts = await collect(bus)
    worker = WorkerProcess(broker.url, namespace, "emu", tmp_path / "emu", "--fake-gpus", "2", "--emulate",
                           "--speedup", "100", "--emulate-iteration-s", "0.1", "--emulate-checkpoint-s", "5")
    await worker.start(facts)
    try:
        sched = Scheduler(bus)
        # 200 iterations x 0.1 s = 20 emulated seconds = 0.2 real seconds.
        short = sched.grant("emu", "emu-short", ["train.py"])
        short = short.model_copy(update={"spec": JobSpec(name="s", command=["train.py"], expected_iterations=200)})
        sent = time.monotonic()
        assert (await sched.send(short)).accepted
        done = await facts.end("emu-short", 10)
        elapsed = time.monotonic() - sent
        assert isinstance(done, JobCompleted), done
        assert done.iteration == 200
        assert done.reason is CompletionReason.ITERATIONS
        assert 0.15 <= elapsed < 3.0

        # 1000 emulated seconds (10 real): revoked early, it stops at a boundary after a 5/100 s checkpoint.
        spec = JobSpec(name="l", command=["train.py"], expected_duration_s=1000)
        long = sched.grant("emu", "emu-long", ["train.py"], gpus=[1]).model_copy(update={"spec": spec})
        assert (await sched.send(long)).accepted
        await facts.one(JobStarted, "emu-long")
        await wait_for(lambda: time.monotonic() - sent > elapsed + 0.3, 5, "some emulated progress")
        revoked = time.monotonic()
        assert (await sched.revoke(long)).accepted
        suspended = await facts.end("emu-long", 10)
        assert isinstance(suspended, JobSuspended), suspended
        assert 0 < suspended.iteration < 10_000
        assert suspended.checkpoint_iteration == suspended.iteration
        assert suspended.checkpoint_path == f"emulated://emu-long/{suspended.iteration}"
        assert time.monotonic() - revoked >= 0.05

        resumed = sched.grant("emu", "emu-long", ["train.py"], gpus=[1], resume=suspended)
        assert (await sched.send(resumed.model_copy(update={"spec": spec}))).accepted
        restart = await wait_for(
            lambda: [e for e in facts.of(JobStarted, "emu-long") if e.lease_id == resumed.lease_id]
        )
        assert restart[0].iteration == suspended.iteration
    finally:
        assert await worker.stop() == 0, worker.log_text()
