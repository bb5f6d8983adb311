"""The scheduler without ``--packing`` (the default) against a placement that packs (issue 17).

A real nats-server and SQLite store, a real placement service running ``gandiva`` with packing
profiles, a fake worker with one GPU. The placement proposes, round after round, to pack a second
A3C job onto the GPU the first one holds; the scheduler, not packing, drops that launch with its
reason and persists nothing of it: the job stays queued, the store has no lease for it and no
grant reaches the worker, exactly as before packing existed."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from schemas.job import JobSpec
from services.core.packing import PackingModel
from services.core.state import JobStatus
from services.placement.service import PlacementConfig, PlacementService
from services.runtime.broker import Broker
from services.runtime.store import Store
from tests.integration.test_scheduler import cluster, running_jobs, wait_for


def a3c(name: str) -> JobSpec:
    return JobSpec(name=name, command=["python", "train.py"], model="a3c", grace_period_s=5.0)


async def test_without_packing_a_packed_launch_is_dropped_and_nothing_is_persisted(
    broker: Broker, namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="roundhouse.scheduler")
    profiles = {"profiles": PackingModel().policy_profiles()}
    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 1}, stop_delay_s=0.1)
        placement = PlacementService(
            PlacementConfig(nats=broker.url, namespace=namespace, policy="gandiva", policy_options=profiles)
        )
        await placement.start(await c.connect("placement"))
        try:
            s = await c.start_scheduler(policy="fifo", with_placement=False)
            assert s.cfg.packing is False
            await wait_for(lambda: s.is_leader and len(s.inventory) == 1, what="leader")
            await c.submit("first", a3c("first"))
            await wait_for(lambda: running_jobs(s) == {"first"}, what="first running")
            await c.submit("second", a3c("second"))
            dropped = "launch second: GPU 0 of n0 is not free"
            await wait_for(lambda: caplog.text.count(dropped) >= 3, what="three rounds proposing the packing")
            entry = s.book.entry("second")
            assert entry is not None
            assert entry.state.status is JobStatus.QUEUED
            assert entry.lease is None
            assert [job for _, kind, job in workers.timeline if kind == "grant"] == ["first"]
            assert not workers.refused  # dropped at the scheduler: no grant was even tried
        finally:
            await placement.stop()
    store = await Store.open(str(tmp_path / "db"))
    try:
        assert await store.leases_for_job("second", include_released=True) == []
        assert len(await store.leases_for_job("first", include_released=True)) == 1
    finally:
        await store.close()
