"""Fill rounds against a real nats-server and SQLite store: under a timer-only policy (LAS, 300 s
rounds) a job submitted to a cluster with free GPUs starts at once, and a fill round never preempts."""

from __future__ import annotations

import asyncio
from pathlib import Path

from services.core.state import JobStatus
from services.runtime.broker import Broker
from tests.integration.test_scheduler import cluster, running_jobs, spec, wait_for


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
        await c.submit("trial", spec("trial"))
        await wait_for(lambda: (e := s.book.entry("trial")) is not None and e.state.status is JobStatus.QUEUED,
                       what="trial accepted")  # fmt: skip
        await asyncio.sleep(1.0)  # longer than churn debounce + a round: time for a wrong one to begin
        assert cycle.cues_taken == taken  # the arrival started no round (LAS reacts to its timer only)
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
        await asyncio.sleep(0.5)  # old gains attained service: LAS ranks a new job above it
        rounds_before = s.rounds_run
        await c.submit("new", spec("new"))
        await wait_for(lambda: s.book.entry("new") is not None, what="new accepted")
        await asyncio.sleep(1.0)
        assert running_jobs(s) == {"old"}
        assert s.rounds_run == rounds_before  # no free GPU: the fill round published nothing
        assert not [entry for entry in workers.log if entry[0] == "revoke"]
        s.request_round()  # the policy's own round (the tick, brought forward) preempts
        await wait_for(lambda: "new" in running_jobs(s), what="new running after the full round")
        assert [entry[0] for entry in workers.log].count("revoke") == 1
