"""Issue 13 on the scheduler's side: a worker's ``stale_epoch`` alone does not depose it (attack 9),
and a plan for a round not in flight changes nothing (attack 12).

A node whose fence was pushed to 2^53 (a forged revoke, before workers moved their fence only for
commands they accepted) answered every grant ``stale_epoch``, and every leader stepped down on it,
17 times. The executor now asks the store whether a newer term was claimed: none was, so the answer
is that node's refusal of the grant (rolled back), the leader keeps its term, and jobs run on the
other nodes. Real nats-server, real SQLite store, fake workers.
"""

from __future__ import annotations

from pathlib import Path

from schemas.rounds import NodeGpus, PlacementPlan
from schemas.subjects import PLACEMENT_PLAN
from services.runtime.broker import Broker
from tests.integration.test_scheduler import cluster, running_jobs, spec, wait_for


async def test_a_worker_claiming_a_newer_epoch_does_not_depose_the_leader(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 1, "n1": 1})
        workers.nodes["n0"].epoch_seen = 2**53  # every command to n0 is answered stale_epoch
        s = await c.start_scheduler(policy="fifo")
        await wait_for(lambda: s.is_leader and len(s.inventory) == 2, what="leader with 2 nodes")
        epoch = s.epoch
        await c.submit("a", spec("a"))
        await c.submit("b", spec("b"))
        await wait_for(lambda: len(running_jobs(s)) == 1, what="one job running on n1")
        term = s._term
        assert term is not None
        await wait_for(lambda: term.executor.unconfirmed_stale >= 1, what="n0's stale_epoch seen")
        seen = term.executor.unconfirmed_stale
        # Later rounds offer n0 again and hear stale_epoch again: still no step-down.
        await wait_for(lambda: term.executor.unconfirmed_stale >= seen + 2, what="n0 offered twice more")
        assert s.is_leader
        assert s.epoch == epoch
        assert s._term is term
        # Each round's grant to n0 is written before it is sent and rolled back at n0's refusal, so a
        # lease on n0 may be in the book for a moment (a loaded run caught one): wait it out, and
        # check that nothing but the job on n1 ever ran.
        await wait_for(lambda: [lease.nodes for lease in s.book.leases.values()] == [("n1",)]
                       and len(running_jobs(s)) == 1, what="only n1's lease once n0's refusal is applied")  # fmt: skip
        assert not workers.nodes["n0"].leases  # n0 refused every grant: it never ran anything
        assert s.is_leader


async def test_a_plan_for_a_round_not_in_flight_is_dropped_without_effect(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        await c.start_workers({"n0": 1})
        s = await c.start_scheduler(policy="fifo")
        await wait_for(lambda: s.is_leader and len(s.inventory) == 1, what="leader")
        await c.submit("a", spec("a", gpus=2))  # never fits: stays queued
        await wait_for(lambda: "a" in s.book.jobs, what="a queued")
        stale = s.cycle.plans_stale
        version = s.book.state_version
        forged = PlacementPlan(
            round=10**6, state_version=version, epoch=s.epoch or 0, policy="consolidated",
            launch={"a": [NodeGpus(node_id="n0", gpus=[0])], "ghost": [NodeGpus(node_id="n0", gpus=[0])]},
        )  # fmt: skip
        await c.client.publish(PLACEMENT_PLAN, forged)
        await wait_for(lambda: s.cycle.plans_stale > stale, what="the plan dropped as stale")
        assert s.book.leases == {}
        assert running_jobs(s) == set()
