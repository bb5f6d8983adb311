"""Fill rounds against a real nats-server and SQLite store: under a timer-only policy (LAS, 300 s
rounds) a job submitted to a cluster with free GPUs starts at once, and a fill round never preempts."""

from __future__ import annotations

import asyncio
from pathlib import Path

from schemas.rounds import RoundTrigger
from services.runtime.broker import Broker
from services.scheduler.service import SchedulerService
from tests.integration.test_scheduler import cluster, running_jobs, spec, wait_for


def churn_spy(scheduler: SchedulerService, reason: RoundTrigger) -> list[RoundTrigger]:
    """Churn of ``reason`` the replica passes to its round timer from now on (the timer decides at
    that call whether a round is due, so a test can check the decision instead of waiting it out)."""
    heard: list[RoundTrigger] = []
    replica = scheduler.replica
    passed_on = replica.churn

    def churn(why: RoundTrigger) -> None:
        passed_on(why)
        if why is reason:
            heard.append(why)

    replica.churn = churn  # type: ignore[method-assign]
    return heard


async def test_a_job_on_free_gpus_starts_without_waiting_for_the_tick(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        await c.start_workers({"n0": 2})
        s = await c.start_scheduler(policy="las", round_s=300.0)
        await wait_for(lambda: s.is_leader and len(s.inventory) == 1, what="leader with a node")
        rounds_before = s.rounds_run
        await c.submit("trial", spec("trial"))
        await wait_for(lambda: "trial" in running_jobs(s), timeout_s=5.0, what="trial running before the tick")
        assert s.rounds_run == rounds_before + 1
        assert s.timings is not None
        assert s.timings.launched == 1
        assert s.timings.suspended == 0


async def test_without_fill_rounds_the_job_waits_for_the_policys_round(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        await c.start_workers({"n0": 2})
        s = await c.start_scheduler(policy="las", round_s=300.0, fill_between_rounds=False)
        await wait_for(lambda: s.is_leader and len(s.inventory) == 1, what="leader with a node")
        # The term's first rounds (its first tick, the node's registration) are over and none is
        # asked for before the job arrives, so any round that starts the job is one its arrival caused.
        cycle, term = s.cycle, s._term
        assert term is not None
        await wait_for(lambda: cycle.cues_taken >= 1 and not cycle.in_round and not term.timer.pending,
                       what="the term's first rounds over")  # fmt: skip
        taken = cycle.cues_taken
        arrivals = churn_spy(s, RoundTrigger.ARRIVAL)
        await c.submit("trial", spec("trial"))
        # The timer decides at the churn call whether a round is due: once the arrival's churn was
        # heard (after its commit landed), "no round asked for" is a fact, not a wait that ran out.
        await wait_for(lambda: arrivals, what="trial's arrival heard by the round timer")
        assert s.book.entry("trial") is not None
        assert not term.timer.pending  # the arrival asked for no round (LAS reacts to its timer only)
        assert cycle.cues_taken == taken
        assert not cycle.in_round
        assert "trial" not in running_jobs(s)
        s.request_round()
        await wait_for(lambda: "trial" in running_jobs(s), what="trial running after a full round")


async def test_a_fill_round_never_preempts_but_the_policys_round_does(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 1}, stop_delay_s=0.2)
        s = await c.start_scheduler(policy="las", round_s=300.0)
        await wait_for(lambda: s.is_leader and len(s.inventory) == 1, what="leader with a node")
        await c.submit("old", spec("old"))
        await wait_for(lambda: "old" in running_jobs(s), what="old running (fill round)")
        # Real time must pass for old to gain attained service (LAS then ranks the new job above it);
        # the scheduler's clock is the system clock here, so this sleep is that passing time.
        await asyncio.sleep(0.5)
        rounds_before, cues_before = s.rounds_run, s.cycle.cues_taken
        arrivals = churn_spy(s, RoundTrigger.ARRIVAL)
        await c.submit("new", spec("new"))
        await wait_for(lambda: arrivals, what="new's arrival heard by the round timer")
        # The arrival asked for a fill round (and only that): wait until it was taken and is over.
        await wait_for(lambda: s.cycle.cues_taken > cues_before and not s.cycle.in_round, what="the fill round run")
        assert running_jobs(s) == {"old"}
        assert s.rounds_run == rounds_before  # no free GPU: the fill round published nothing
        assert not [entry for entry in workers.log if entry[0] == "revoke"]
        s.request_round()  # the policy's own round (the tick, brought forward) preempts
        await wait_for(lambda: "new" in running_jobs(s), what="new running after the full round")
        assert [entry[0] for entry in workers.log].count("revoke") == 1
