"""The scheduler's failure paths with every part real (issue 18, item 2): the scheduler and its SQLite
store, the placement and admission services, worker agents as processes (``--emulate``, or launching
real commands), the user's client. Each test ends in what a user sees: ``roundhouse jobs --json``."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from schemas.job import JobSpec
from schemas.jobs import JobStarted
from schemas.nodes import NodeRegister
from services.runtime.broker import Broker
from tests.fake_clock import FakeClock
from tests.helpers import eventually
from tests.live_parts import REPO, emulated_job, live_parts


async def test_a_job_that_exits_non_zero_is_failed_with_its_exit_code_and_last_output(
    broker: Broker, tmp_path: Path
) -> None:
    async with live_parts(broker, tmp_path) as parts:
        leader = await parts.start_scheduler()
        await eventually(lambda: leader.is_leader, 15, "a leading scheduler")
        await parts.start_placement()
        await parts.start_worker("real-a", 1, emulate=False)
        await eventually(lambda: "real-a" in leader.inventory, 15, "real-a registered")
        await parts.start_admission()
        crash = [sys.executable, "-c", "import sys; print('loading data'); sys.stderr.write('boom: no data\\n'); "
                 "sys.exit(3)"]  # fmt: skip
        job = await parts.submit(JobSpec(name="crashes", command=crash, gpus=1))
        await parts.until_status(job, "failed")
        good = await parts.submit(JobSpec(name="fine", command=[sys.executable, "-c", "pass"], gpus=1))
        await parts.until_status(good, "completed")  # the failed run gave its GPU back

        seen = await parts.cli_jobs(job, good)
        assert seen[job]["status"] == "failed"
        assert seen[job]["exit_code"] == 3
        assert "boom: no data" in seen[job]["reason"]
        assert "real-a" in seen[job]["reason"]
        assert seen[good]["status"] == "completed"
        assert seen[good]["exit_code"] is None


async def test_admission_rejects_a_job_over_quota_and_holds_one_until_the_users_job_ends(
    broker: Broker, tmp_path: Path
) -> None:
    """job.rejected and job.held reach the scheduler's store: the user sees why, and the held job runs
    once admission lets it in (the user's first job ended)."""
    async with live_parts(broker, tmp_path) as parts:
        await parts.up({"node-a": 2}, admission="user-quota", admission_options={"max_jobs": 1, "max_gpus": 1})
        first = await parts.client.submit(emulated_job("first", seconds=300), job_id="q-first", timeout_s=20)
        second = await parts.client.submit(emulated_job("second", seconds=20), job_id="q-second", timeout_s=20)
        wide = await parts.client.submit(emulated_job("wide", gpus=2), job_id="q-wide", timeout_s=20)
        assert (first.outcome, second.outcome, wide.outcome) == ("accepted", "held", "rejected")

        held = await parts.until_status("q-second", "held")
        assert held.reason  # the user is told why it waits
        rejected = await parts.until_status("q-wide", "rejected")
        assert rejected.reason is not None
        assert "at most 1" in rejected.reason
        await parts.until_status("q-second", "completed", timeout_s=60)

        seen = await parts.cli_jobs("q-first", "q-second", "q-wide")
        assert {job: view["status"] for job, view in seen.items()} == {
            "q-first": "completed", "q-second": "completed", "q-wide": "rejected",
        }  # fmt: skip
        assert seen["q-second"]["first_start_time"] >= seen["q-first"]["finish_time"]
        assert seen["q-wide"]["first_start_time"] is None
        assert "request fewer GPUs" in seen["q-wide"]["reason"]


async def test_an_agent_restarted_under_its_running_job_re_registers_and_the_job_finishes_once(
    broker: Broker, tmp_path: Path
) -> None:
    """Node re-registration: the agent dies (SIGKILL) under a running job and comes back as a new
    incarnation. The scheduler revokes the old lease on the node; the new agent does not know it
    (unknown_lease), so it is released at its answer, not at the lease TTL (60 s, longer than the
    test may take), and the job runs again, on one node at a time, to completion."""
    async with live_parts(broker, tmp_path) as parts:
        await parts.up({"node-a": 1}, lease_ttl_s=60.0)
        job = await parts.submit(emulated_job("survivor", seconds=400))
        started = await parts.facts.one(JobStarted, job, 20)
        first = parts.workers["node-a"]
        assert first.process is not None
        first.process.send_signal(signal.SIGKILL)
        await first.process.wait()
        again = await parts.start_worker("node-a", 1)
        assert again.incarnation != first.incarnation

        await parts.until_status(job, "completed", timeout_s=45)
        runs = parts.facts.of(JobStarted, job)
        assert runs[0].lease_id == started.lease_id
        assert len({r.lease_id for r in runs}) == 2, runs  # killed once, run once more, never a third time
        # (From iteration 0: an emulated run checkpoints only when told to stop, and this one never was.)
        registers = [e for e in parts.facts.of(NodeRegister) if e.node_id == "node-a"]
        assert len({e.incarnation for e in registers}) == 2

        seen = (await parts.cli_jobs(job))[job]
        assert seen["status"] == "completed"
        assert seen["iterations_done"] == 4000  # 400 emulated s of 0.1 s iterations: all of them, once


async def test_rounds_time_out_without_placement_and_the_job_runs_once_placement_is_back(
    broker: Broker, tmp_path: Path
) -> None:
    async with live_parts(broker, tmp_path) as parts:
        leader = await parts.up({"node-a": 1}, plan_timeout_s=0.3)
        await parts.stop_placement(parts.placements[0])
        timed_out = leader.cycle.plans_timed_out
        job = await parts.submit(emulated_job("patient", seconds=20))
        await eventually(lambda: leader.cycle.plans_timed_out >= timed_out + 2, 20, "two rounds timed out")
        assert await parts.status_of(job) == "queued"
        assert not parts.facts.of(JobStarted, job)

        await parts.start_placement()
        await parts.until_status(job, "completed")
        seen = (await parts.cli_jobs(job))[job]
        assert seen["status"] == "completed"
        assert seen["preemptions"] == 0


async def test_a_leader_whose_renewals_stalled_steps_down_at_its_first_stale_store_write(
    broker: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Step-down after a stale store write. The leader's renewals stall while it believes it still
    leads (its election's clock stands still: a paused process's view), so its key expires and the
    follower takes over, claiming a newer term in the store. The old leader's next write (the grant
    of a job its book still holds) is fenced out: it steps down, and the job runs once, under the
    new term."""
    async with live_parts(broker, tmp_path) as parts:
        old = await parts.up({"node-a": 1}, plan_timeout_s=0.3)
        follower = await parts.start_scheduler()
        await parts.stop_placement(parts.placements[0])  # rounds find no placement: the job stays queued
        job = await parts.submit(emulated_job("fenced", seconds=20))
        await eventually(lambda: old.book.entry(job) is not None, 15, "the job in the old leader's book")
        election = old.election
        assert election is not None
        assert election._task is not None
        election.clock = FakeClock(monotonic=time.monotonic())  # its last renewal stays "just now"
        election._task.cancel()  # ... and no renewal follows
        await eventually(lambda: follower.is_leader, 20, "the follower leading")
        assert old.is_leader  # it still believes so
        assert follower.epoch is not None
        assert old.epoch is not None
        assert follower.epoch > old.epoch
        old_epoch = old.epoch

        await parts.start_placement()
        await eventually(lambda: old.replica.term is None, 20, "the old leader stepped down")
        assert not old.is_leader
        why = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stepping down")]
        assert why, "the old leader stepped down without saying why"
        assert f"term (epoch {old_epoch}) is over: a newer leader claimed the store" in why[0]
        await parts.until_status(job, "completed")
        runs = parts.facts.of(JobStarted, job)
        assert len(runs) == 1
        assert runs[0].epoch == follower.epoch
        seen = (await parts.cli_jobs(job))[job]
        assert seen["status"] == "completed"
        assert seen["preemptions"] == 0


async def test_a_leader_that_dies_under_a_running_job_is_replaced_and_the_job_runs_on_once(
    broker: Broker, tmp_path: Path
) -> None:
    """The follower takes over from the store (the job running, its lease) and the agent's
    heartbeats: the run goes on under the new term (never requeued, never started twice) and ends."""
    async with live_parts(broker, tmp_path) as parts:
        old = await parts.up({"node-a": 1})
        follower = await parts.start_scheduler()
        job = await parts.submit(emulated_job("steady", seconds=1000))
        started = await parts.facts.one(JobStarted, job, 20)
        old_epoch = old.epoch
        await parts.crash_scheduler(old)
        await eventually(lambda: follower.is_leader, 20, "the follower leading")
        assert follower.epoch is not None
        assert old_epoch is not None
        assert follower.epoch > old_epoch
        entry = follower.book.entry(job)
        assert entry is not None
        assert entry.lease is not None
        assert entry.lease.lease_id == started.lease_id  # loaded from the store, not requeued

        done = await parts.until_status(job, "completed", timeout_s=60)
        assert done.preemptions == 0
        assert [r.lease_id for r in parts.facts.of(JobStarted, job)] == [started.lease_id]
        seen = (await parts.cli_jobs(job))[job]
        assert seen["status"] == "completed"
        assert seen["iterations_done"] == 10000


async def test_plans_that_come_after_their_round_timed_out_are_dropped_and_the_job_runs_once(
    broker: Broker, tmp_path: Path
) -> None:
    """Stale plans: placement runs as its own process; frozen (SIGSTOP) past the plan time-out, it
    answers the rounds it missed once it thaws. Those plans are for rounds over: dropped, counted;
    a later round places the job, which runs once."""
    async with live_parts(broker, tmp_path) as parts:
        leader = await parts.up({"node-a": 1}, plan_timeout_s=0.5)
        await parts.stop_placement(parts.placements[0])
        log = (tmp_path / "placement.log").open("wb")
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "services.placement", "--nats", broker.url, "--namespace", parts.namespace,
            "--policy", "consolidated", "--log-format", "text", cwd=str(REPO), stdout=log, stderr=log,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        try:
            first = await parts.submit(emulated_job("first", seconds=10))
            await parts.until_status(first, "completed", timeout_s=60)  # the child places rounds
            timed_out, stale = leader.cycle.plans_timed_out, leader.cycle.plans_stale
            child.send_signal(signal.SIGSTOP)
            job = await parts.submit(emulated_job("late", seconds=10))
            await eventually(lambda: leader.cycle.plans_timed_out > timed_out, 20, "a round timed out")
            assert await parts.status_of(job) == "queued"
            child.send_signal(signal.SIGCONT)
            await eventually(lambda: leader.cycle.plans_stale > stale, 20, "a late plan dropped")
            await parts.until_status(job, "completed", timeout_s=60)
            assert len(parts.facts.of(JobStarted, job)) == 1
            seen = (await parts.cli_jobs(job))[job]
            assert seen["status"] == "completed"
            assert seen["preemptions"] == 0
        finally:
            if child.returncode is None:
                child.send_signal(signal.SIGCONT)
                child.terminate()
                await asyncio.wait_for(child.wait(), 15)
            log.close()
