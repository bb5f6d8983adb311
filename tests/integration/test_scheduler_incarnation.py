"""A worker agent's new incarnation: its registration revokes the node's leases on the node, never releases
them blind.

Found by the chaos benchmark (``python -m benchmarks.chaos``): an agent killed and restarted at once
took grants the scheduler was still retrying (sent while the old agent was gone) before its
``node.register`` was applied; applying it released every lease of the node, those included, and the
next round granted their jobs on another node while the new agent ran them (3 double runs of 200).
"""

from __future__ import annotations

import uuid
from pathlib import Path

from schemas.subjects import NODE_REGISTER
from services.core.state import JobStatus
from services.runtime.broker import Broker
from tests.integration.test_scheduler import cluster, held_by_worker, running_jobs, spec, wait_for


async def test_a_new_incarnation_that_took_a_grant_already_stops_it_before_the_job_runs_elsewhere(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 1, "n1": 1}, stop_delay_s=0.3)
        s = await c.start_scheduler(policy="fifo", round_s=0.2)
        await wait_for(lambda: s.is_leader and len(s.inventory) == 2, what="leader with 2 nodes")
        await c.submit("x", spec("x"))
        x_node, x_lease = await held_by_worker(workers, "x")
        await c.submit("a", spec("a", grace=60.0))
        node, lease_id = await held_by_worker(workers, "a")
        await workers.finish(x_node, x_lease, completed=True)  # x_node is free: where "a" would go next
        await wait_for(lambda: "x" not in running_jobs(s), what="x completed")
        # The agent restarts and the new one holds the lease (a retried grant reached it) when its
        # registration is applied.
        workers.nodes[node].incarnation = uuid.uuid4()
        await workers.bus.publish(NODE_REGISTER, workers.register_message(node))
        # The scheduler asks the node to stop it rather than granting the job elsewhere meanwhile; the
        # agent suspends it and only then does the job run again.
        revoked = ("revoke", lease_id, node, s.epoch)
        await wait_for(lambda: revoked in workers.log or workers.max_concurrent_runs > 1, what="the lease revoked")
        assert workers.max_concurrent_runs == 1, f"a granted elsewhere while the new agent ran it: {workers.log}"
        await wait_for(lambda: (found := workers.lease_of("a")) is not None and found[1] != lease_id,
                       timeout_s=20, what="a granted again after its suspension")  # fmt: skip
        assert workers.max_concurrent_runs == 1


async def test_the_leases_a_new_incarnation_does_not_hold_are_released_at_its_answer_not_at_a_deadline(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 1})
        s = await c.start_scheduler(policy="fifo", round_s=0.2)
        await wait_for(lambda: s.is_leader and len(s.inventory) == 1, what="leader")
        await c.submit("a", spec("a", grace=600.0))  # a release at the revoke's deadline would take 10 min
        node, lease_id = await held_by_worker(workers, "a")
        await workers.register(node, new_incarnation=True)  # its processes are gone with the old agent
        await wait_for(lambda: (found := workers.lease_of("a")) is not None and found[1] != lease_id,
                       timeout_s=30, what="a granted again on the restarted node")  # fmt: skip
        assert "a" in running_jobs(s)
        assert s.book.jobs["a"].state.status is JobStatus.RUNNING
