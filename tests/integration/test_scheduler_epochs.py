"""Epochs never go back, even when NATS loses all its data (issue 12): the store keeps the last term's
epoch, and a new leader's epoch is above it whatever the election's KV revision says. Workers that
remember the old epoch then accept the new leader's grants (before: every grant was refused until
the KV revisions caught up, about as long as the cluster's age). Real nats-servers (its own, wiped),
a real SQLite store kept across the wipe, fake workers that remember the highest epoch they saw."""

from __future__ import annotations

import shutil
from pathlib import Path

from schemas.job import JobSpec
from schemas.jobs import JobAccepted, JobArrived
from schemas.subjects import JOB_ACCEPTED, JOB_ARRIVED
from services.placement.service import PlacementConfig, PlacementService
from services.runtime.broker import Broker
from services.runtime.bus import Bus, BusOptions
from services.scheduler.config import SchedulerConfig
from services.scheduler.service import SchedulerService
from tests.fake_workers import FakeWorkers
from tests.integration.test_scheduler import FAST, wait_for

NAMESPACE = "epochs"


async def _run_until_granted(broker: Broker, db: Path, job_id: str, epoch_seen: int) -> tuple[int, int]:
    """Start a scheduler, placement and a fake worker that has seen ``epoch_seen``; submit ``job_id``;
    return the leader's epoch and the epoch of the grant the worker accepted."""
    options = BusOptions(namespace=NAMESPACE)
    buses = [await Bus.connect(broker.url, name=n, options=options, provision=True) for n in ("s", "p", "w", "c")]
    scheduler = SchedulerService(SchedulerConfig(
        nats=broker.url, namespace=NAMESPACE, db=str(db), round_s=0.3, leader_ttl_s=1.0, plan_timeout_s=2.0,
        request_timeout_s=0.5, log_format="text",
    ), consumer_options=FAST)  # fmt: skip
    placement = PlacementService(PlacementConfig(nats=broker.url, namespace=NAMESPACE))
    workers = FakeWorkers(buses[2], {"n0": 2})
    workers.nodes["n0"].epoch_seen = epoch_seen
    try:
        await placement.start(buses[1])
        await workers.start()
        await scheduler.start(buses[0])
        await wait_for(lambda: scheduler.is_leader and len(scheduler.inventory) == 1, what="leader with a node")
        spec = JobSpec(name=job_id, command=["python", "train.py"])
        await buses[3].publish(JOB_ARRIVED, JobArrived(job_id=job_id, spec=spec))
        await buses[3].publish(JOB_ACCEPTED, JobAccepted(job_id=job_id))
        await wait_for(lambda: workers.lease_of(job_id) is not None, what=f"{job_id} granted", timeout_s=15)
        epoch = scheduler.epoch
        assert epoch is not None
        return epoch, workers.nodes["n0"].epoch_seen
    finally:
        await scheduler.stop()
        await placement.stop()
        await workers.stop()
        for bus in buses:
            await bus.close()


async def test_a_leader_after_nats_lost_its_data_has_an_epoch_above_every_earlier_one(tmp_path: Path) -> None:
    db = tmp_path / "store"
    first = Broker(tmp_path / "nats")
    await first.astart()
    try:
        # Several terms, so the store's floor is above what a fresh KV revision will be.
        epochs = []
        for n in range(3):
            epoch, seen = await _run_until_granted(first, db, f"before-{n}", epoch_seen=0)
            epochs.append(epoch)
            assert seen == epoch
    finally:
        await first.astop()
    assert epochs == sorted(set(epochs))
    shutil.rmtree(tmp_path / "nats")  # every stream, bucket and KV revision is gone
    second = Broker(tmp_path / "nats")
    await second.astart()
    try:
        # The worker remembers the highest epoch it saw; the new leader's grant must pass its fence.
        epoch, seen = await _run_until_granted(second, db, "after", epoch_seen=epochs[-1])
    finally:
        await second.astop()
    assert epoch > epochs[-1]
    assert seen == epoch

