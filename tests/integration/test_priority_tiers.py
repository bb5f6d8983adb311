"""Priority tiers through the real scheduler and placement services (issue 14, item 5).

Real nats-server, SQLite store, scheduler and placement, fake workers; the policy is srtf, which on
its own lets the job with the least time left run. A job of a higher tier preempts a lower tier's
running job however long it is; a job of a lower tier waits however short it is; ``query.jobs``
lists the queue in that order (``queue_position``).
"""

from __future__ import annotations

from pathlib import Path

from schemas.job import JobSpec
from services.runtime.broker import Broker
from tests.integration.test_scheduler import cluster, running_jobs, wait_for


def spec(name: str, *, duration: float, priority: int) -> JobSpec:
    return JobSpec(name=name, command=["python", "train.py"], gpus=1, grace_period_s=1.0,
                   expected_duration_s=duration, priority=priority)  # fmt: skip


async def test_a_higher_tier_preempts_and_a_lower_tier_waits(broker: Broker, namespace: str, tmp_path: Path) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        await c.start_workers({"n0": 1})
        # The jobs' owner ("default") is an operator here: only operators may raise a job's tier.
        s = await c.start_scheduler(policy="srtf", operators=("operator", "default"))
        await wait_for(lambda: s.is_leader and len(s.inventory) == 1, what="leader with one node")
        await c.submit("short", spec("short", duration=100.0, priority=0))
        await wait_for(lambda: running_jobs(s) == {"short"}, what="short running")

        await c.submit("tiny-low", spec("tiny-low", duration=5.0, priority=-1))  # srtf alone: first
        await c.submit("long-urgent", spec("long-urgent", duration=10_000.0, priority=5))  # srtf alone: last
        await wait_for(lambda: running_jobs(s) == {"long-urgent"}, timeout_s=15, what="the urgent job running")
        assert s.book.jobs["short"].state.preemptions == 1

        def queue() -> list[tuple[str, int | None]]:
            return [(v.job_id, v.queue_position) for v in reply.jobs if v.status == "queued"]

        reply = await c.query()
        for _ in range(20):  # until a round has ranked both
            if all(position is not None for _, position in queue()):
                break
            await s.run_round()
            reply = await c.query()
        else:
            raise AssertionError(f"no round ranked both queued jobs: {queue()}")
        assert sorted(queue(), key=lambda q: q[1] or 0) == [("short", 1), ("tiny-low", 2)]


async def test_a_user_cannot_raise_their_own_tier(broker: Broker, namespace: str, tmp_path: Path) -> None:
    """Issue 13 meets 14: a tier preempts lower tiers, so raising one is an operator's call; a user's
    ask above ``max_user_priority`` runs at that tier (and preempts nobody)."""
    async with cluster(broker, namespace, tmp_path) as c:
        await c.start_workers({"n0": 1})
        s = await c.start_scheduler(policy="srtf")  # operators: "operator" only
        await wait_for(lambda: s.is_leader and len(s.inventory) == 1, what="leader with one node")
        await c.submit("short", spec("short", duration=100.0, priority=0))
        await wait_for(lambda: running_jobs(s) == {"short"}, what="short running")
        await c.submit("pushy", spec("pushy", duration=10_000.0, priority=999))
        await wait_for(lambda: "pushy" in s.book.jobs, what="pushy arrived")
        assert s.book.jobs["pushy"].state.spec.priority == 0
        for _ in range(3):
            await s.run_round()
        assert running_jobs(s) == {"short"}
        assert s.book.jobs["short"].state.preemptions == 0
