"""Failures with real parts: kill -9 of random services, agents and the broker, and a paused leader.

The cluster is ``tests/chaos_cluster.py``'s (the processes ``roundhouse up`` runs, with two
scheduler replicas sharing one SQLite store and worker agents that emulate their jobs). Outcomes are
judged from the store (every job completed, none lost or left waiting) and from the workers' own
facts (no job ran under two leases at once); every wait is on a fact, bounded.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from schemas.control import JobsQuery
from services.runtime.bus import Bus
from services.runtime.logs import parse_timestamp
from services.runtime.store import Store
from tests.chaos_cluster import (
    BROKER,
    ChaosConfig,
    ChaosPlan,
    CommandWatch,
    Submitter,
    audit,
    connect,
    create_database,
    drop_database,
    leader,
    run_chaos,
    running,
    short_job,
    until,
    wait_drained,
)
from tests.integration.conftest_store import postgres_url


@pytest.mark.timeout(240)
async def test_kill_9_of_random_services_agents_and_the_broker_loses_and_doubles_no_job(tmp_path: Path) -> None:
    config = ChaosConfig(state_dir=tmp_path / "cluster", schedulers=2, workers=2, gpus_per_worker=4)
    plan = ChaosPlan(
        jobs=50, seed=12, submit_every_s=0.3, job_s=(1.0, 3.0), chaos_after_s=6.0, mean_gap_s=2.0,
        down_s=(0.3, 2.0), opening=("leader", BROKER, "worker", "placement", "admission"), drain_timeout_s=100.0,
    )  # fmt: skip
    async with running(config) as cluster:
        result = await run_chaos(cluster, plan)
    a = result.audit
    summary = result.summary()
    assert min(result.kills.get(kind, 0) for kind in ("scheduler", BROKER, "worker")) >= 1, summary
    assert (a.lost, a.stuck, a.double_runs) == ([], [], []), summary
    assert a.completed == a.jobs == 50, summary
    assert not result.crashes, summary  # every exit was a kill of ours


PAUSE_S = 12.0
"""How long the leader stays frozen: 6 leader TTLs, past the consumers' ack_wait (what it fetched is
redelivered to its successor meanwhile, and it must not ack it when it wakes up)."""


@pytest.fixture(params=["sqlite", "postgresql"])
async def replicas_store(request: pytest.FixtureRequest) -> AsyncIterator[str | None]:
    """The replicas' store: the SQLite file ``up`` uses (None), or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield None
        return
    await postgres_url()  # skips, with the reason, where no PostgreSQL answers
    database_url = await create_database()
    try:
        yield database_url
    finally:
        await drop_database(database_url)


@pytest.mark.timeout(240)
async def test_a_paused_leader_applies_and_acks_nothing_once_deposed(
    tmp_path: Path, replicas_store: str | None
) -> None:
    """SIGSTOP the leading scheduler for longer than its leader TTL while jobs arrive: the other replica
    takes over; SIGCONT: the old one steps down and hands back what it fetched. No job is lost, left
    waiting or run twice, and the new leader's view and the store agree on every job.

    On PostgreSQL the other replica takes over while the leader is still frozen, wherever the freeze
    caught it. On SQLite it does too unless the freeze caught the leader inside a write: SQLite's file
    lock then holds every other writer until the frozen process wakes (docs/failure.md, "A leader
    frozen in the middle of a write"), so there the takeover is only required once it woke."""
    ttl = 2.0
    config = ChaosConfig(state_dir=tmp_path / "cluster", schedulers=2, workers=2, gpus_per_worker=4, leader_ttl_s=ttl,
                         db=replicas_store)  # fmt: skip
    rng = random.Random(7)
    async with running(config) as cluster:
        client = await connect(cluster, "paused-leader")
        bus = client.bus
        watch = CommandWatch(bus)
        await watch.start()
        submitter = Submitter(client)

        async def submit(count: int, gap_s: float) -> None:
            for _ in range(count):
                index = len(submitter.job_ids)
                await submitter.submit(short_job(index, rng, config, (0.5, 2.0)), f"paused-{index}")
                await asyncio.sleep(gap_s)

        async def leading() -> bool:
            found = await leader(bus)
            return found is not None and found[1] in watch.first_seen

        await submit(10, 0.05)
        await until(leading, "a leader that sent a command", timeout_s=60)
        old = await leader(bus)
        assert old is not None
        old_instance, old_epoch = old
        paused_at = cluster.pause(old_instance)
        try:
            await submit(40, 0.05)  # arrivals keep coming while it is frozen, fetched by its open pulls
            if replicas_store is not None:
                await took_over(watch, bus, old_instance, old_epoch, paused_at=paused_at, ttl=ttl)  # while it is frozen
            while time.time() < paused_at + PAUSE_S:  # frozen as long as in the report
                await submit(1, 0.1)
        finally:
            resumed_at = cluster.resume(old_instance)
        new_epoch = await took_over(watch, bus, old_instance, old_epoch, paused_at=paused_at, ttl=ttl)

        def stepped_down() -> bool:
            return any(r.get("msg", "").startswith("no longer leader") and parse_timestamp(r.get("ts", 0)) >= resumed_at
                       for r in cluster.log_records(old_instance))  # fmt: skip

        async def deposed() -> bool:
            return stepped_down()

        await until(deposed, "the resumed replica stepped down", timeout_s=30)
        await submit(10, 0.05)  # and after it woke up
        assert await wait_drained(cluster.store_target, submitter.job_ids, timeout_s=90), "not drained"
        result = await audit(cluster, bus, submitter.job_ids)
        assert (result.lost, result.stuck, result.double_runs) == ([], [], []), result
        assert result.completed == len(submitter.job_ids) >= 60
        assert result.completed_twice == [], result
        # The leader's memory and the store agree (the old failure: "held" in one, "queued" in the other).
        reply = await client.jobs(JobsQuery(job_ids=sorted(submitter.job_ids), include_finished=True))
        assert {v.job_id: v.status for v in reply.jobs} == dict.fromkeys(submitter.job_ids, "completed")
        store = await Store.open(cluster.store_target)
        try:
            assert await store.term() >= new_epoch > old_epoch  # nothing of the old term came back
        finally:
            await store.close()
        await watch.stop()
        await client.close()
        assert not cluster.crash_reports()


async def took_over(
    watch: CommandWatch, bus: Bus, old_instance: str, old_epoch: int, *, paused_at: float, ttl: float
) -> int:
    """Wait until a replica other than ``old_instance`` leads and sent a command; its epoch."""
    new_epoch, _ = await watch.first_after(old_epoch, timeout_s=60)
    current = await leader(bus)
    assert current is not None
    assert current[0] != old_instance
    assert time.time() - paused_at >= ttl * 2 / 3  # it lost the key by its TTL, not earlier
    return new_epoch
