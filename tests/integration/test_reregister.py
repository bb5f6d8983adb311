"""A leader whose store does not know a live node asks it to register again (issue 18).

The store is restored from a backup taken before the node registered (or NATS lost the durable
``node.register``): the new leader drops the node's heartbeats as unknown. Without
``node.reregister.<node>`` it would never learn about the node and a job would stay queued for
good; with it, the node registers again and the job runs. What a user sees is checked with
``roundhouse jobs --json --all``."""

from __future__ import annotations

from pathlib import Path

from schemas.jobs import JobStarted
from schemas.nodes import NodeRegister
from services.runtime.broker import Broker
from tests.helpers import eventually
from tests.live_parts import emulated_job, live_parts


async def test_a_leader_on_a_store_that_never_saw_a_live_node_asks_it_to_register_and_runs_a_job(
    broker: Broker, tmp_path: Path
) -> None:
    async with live_parts(broker, tmp_path) as parts:
        old = await parts.start_scheduler()
        await eventually(lambda: old.is_leader, 15, "a leading scheduler")
        backup = parts.back_up_store("before-nodes.db")  # no node registered yet
        await parts.start_placement()
        worker = await parts.start_worker("node-a", 1)
        await eventually(lambda: "node-a" in old.inventory, 15, "node-a registered")
        await parts.start_admission()
        registers_before = len([e for e in parts.facts.of(NodeRegister) if e.incarnation == worker.incarnation])
        await parts.crash_scheduler(old)

        new = await parts.start_scheduler(db=backup)
        await eventually(lambda: new.is_leader, 20, "a leader on the restored store")
        assert new.epoch is not None
        # The agent kept running and never reconnected: only the leader's ask makes it register again.
        await eventually(lambda: "node-a" in new.inventory, 30, "node-a registered with the new leader")
        again = [e for e in parts.facts.of(NodeRegister) if e.incarnation == worker.incarnation]
        assert len(again) > registers_before  # the same incarnation, registered once more
        asks = new.nodes.reregisters_sent
        assert asks >= 1

        job = await parts.submit(emulated_job("after-restore", seconds=10))
        await parts.until_status(job, "completed", timeout_s=60)
        assert [s.node_id for s in parts.facts.of(JobStarted, job)] == ["node-a"]
        seen = await parts.cli_jobs(job)
        assert seen[job]["status"] == "completed"
        assert seen[job]["iterations_done"] == 100
        assert seen[job]["preemptions"] == 0
        # Once registered, the node's heartbeats match: the leader asks nothing more.
        assert new.nodes.reregisters_sent == asks
        assert "registering again" in worker.log_text()
