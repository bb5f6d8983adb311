"""A cancelled job that never opened its lease channel (a plain script, no ``roundhouse.train``) is
stopped at once: SIGTERM first, so a script that saves on SIGTERM (as under Slurm) can, then SIGKILL
``kill_after_s`` later. Before, the agent sat out the whole grace period waiting for an iteration
boundary that could never come: a ``roundhouse cancel`` of a plain job held its GPUs for the grace
period (30 s by default) for nothing. A preemption still waits for a boundary: a training job still
starting reaches its first one and keeps that progress (tests/e2e/test_cluster_las.py's jobs start
more slowly than LAS's 2 s round on a loaded machine, and never progressed when killed at once)."""

from __future__ import annotations

import sys
import textwrap
import time
import uuid
from pathlib import Path

from schemas.jobs import JobStarted, JobSuspended
from schemas.leases import LeaseAck, LeaseGrant, LeaseRevoke, RevokeReason
from schemas.subjects import lease_revoke
from services.runtime.broker import Broker
from services.runtime.bus import Bus
from tests.integration.test_worker_harness import Facts, Scheduler, one_worker, wait_for

NODE = "plain-node"
SAVES_ON_SIGTERM = textwrap.dedent(
    """
    import pathlib, signal, sys, time

    out = pathlib.Path(sys.argv[1])

    def save(signum, frame):
        out.write_text("saved")
        sys.exit(0)

    signal.signal(signal.SIGTERM, save)
    out.with_suffix(".up").write_text("up")
    while True:
        time.sleep(0.05)
    """
)


async def start_plain_job(scheduler: Scheduler, facts: Facts, tmp_path: Path, name: str) -> tuple[LeaseGrant, Path]:
    script = tmp_path / "plain.py"
    script.write_text(SAVES_ON_SIGTERM)
    saved = tmp_path / f"{name}.txt"
    grant = scheduler.grant(NODE, f"{name}-{uuid.uuid4().hex[:8]}", [sys.executable, str(script), str(saved)])
    assert (await scheduler.send(grant)).accepted
    await facts.one(JobStarted, grant.job_id)
    await wait_for(saved.with_suffix(".up").exists, what="the script to be running")
    return grant, saved


async def revoke(bus: Bus, scheduler: Scheduler, grant: LeaseGrant, reason: RevokeReason, grace_s: float) -> None:
    command = LeaseRevoke(epoch=scheduler.epoch, lease_id=grant.lease_id, job_id=grant.job_id, node_id=NODE,
                          reason=reason, grace_s=grace_s)  # fmt: skip
    assert (await bus.request(lease_revoke(NODE), command, LeaseAck, timeout_s=5)).accepted


async def test_a_cancelled_plain_job_is_signalled_at_once_and_a_preempted_one_after_the_grace(
    broker: Broker, tmp_path: Path
) -> None:
    async with one_worker(broker.url, tmp_path, NODE) as (bus, facts, _worker, _work_dir):
        scheduler = Scheduler(bus)

        cancelled, saved = await start_plain_job(scheduler, facts, tmp_path, "cancelled")
        revoked_at = time.monotonic()
        await revoke(bus, scheduler, cancelled, RevokeReason.CANCEL, grace_s=600)
        end = await facts.end(cancelled.job_id, timeout_s=60)
        assert isinstance(end, JobSuspended), end
        assert end.grace_expired  # signalled, not stopped at a boundary
        assert end.checkpoint_path is None
        # The grace period is 600 s; SIGTERM at once and SIGKILL 0.5 s later end it in seconds (the
        # 60 s wait above is only the bound of a loaded machine; this is the check).
        assert time.monotonic() - revoked_at < 30
        assert saved.read_text() == "saved"  # it got SIGTERM, and the time to act on it

        preempted, saved = await start_plain_job(scheduler, facts, tmp_path, "preempted")
        revoked_at = time.monotonic()
        await revoke(bus, scheduler, preempted, RevokeReason.PREEMPT, grace_s=2)
        end = await facts.end(preempted.job_id, timeout_s=60)
        assert isinstance(end, JobSuspended), end
        assert end.grace_expired
        assert time.monotonic() - revoked_at >= 2  # the grace was given to reach a boundary
        assert saved.read_text() == "saved"


async def test_a_new_lease_of_a_job_waits_for_its_stopping_run_on_other_gpus(broker: Broker, tmp_path: Path) -> None:
    # The scheduler releases a revoked lease at its deadline and may grant the job again at once,
    # here on GPU 1 of the same node while the old run on GPU 0 is still stopping: the new run
    # starts only once the old one's processes are gone (its end is reported first).
    async with one_worker(broker.url, tmp_path, NODE) as (bus, facts, _worker, _work_dir):
        scheduler = Scheduler(bus)
        old, _saved = await start_plain_job(scheduler, facts, tmp_path, "twin")
        # Stopping for 4 s: the grant below reaches the agent well within it, even on a loaded machine.
        await revoke(bus, scheduler, old, RevokeReason.PREEMPT, grace_s=4)
        again = scheduler.grant(NODE, old.job_id, list(old.spec.command), gpus=[1])
        ack = await scheduler.send(again)
        assert ack.accepted, ack
        assert "waiting for a stopping lease" in ack.message
        starts = await wait_for(lambda: facts.of(JobStarted, old.job_id)[1:], timeout_s=60, what="the second run")
        ended = [f for f in facts.of(JobSuspended, old.job_id) if f.lease_id == old.lease_id]
        assert ended, "the new run started before the old one ended"
        assert ended[0].ts <= starts[0].ts
        assert starts[0].lease_id == again.lease_id
        await revoke(bus, scheduler, again, RevokeReason.CANCEL, grace_s=10)
        await wait_for(lambda: [f for f in facts.of(JobSuspended, old.job_id) if f.lease_id == again.lease_id],
                       what="the second run's end")  # fmt: skip
