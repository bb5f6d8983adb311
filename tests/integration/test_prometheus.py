"""``/metrics`` scraped over HTTP from a running scheduler and placement (issue 15, item 1).

The services run under ``run_service`` (as ``roundhouse service`` runs them) with
``metrics_port=0`` against a real nats-server; workers are ``tests.fake_workers.FakeWorkers``.
The test submits jobs and reads the series Prometheus would: queue depth moves as a job waits and
starts, grants count, a completion lands in the JCT histogram, rounds in the phase histogram.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from schemas.job import JobSpec
from schemas.jobs import JobAccepted, JobArrived
from schemas.subjects import JOB_ACCEPTED, JOB_ARRIVED
from services.placement.service import PlacementConfig, PlacementService
from services.runtime.broker import Broker
from services.runtime.bus import Bus
from services.runtime.service import RoundhouseService, run_service
from services.scheduler.config import SchedulerConfig
from services.scheduler.service import SchedulerService
from tests.fake_workers import FakeWorkers
from tests.helpers import eventually

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> tuple[Samples, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples, text


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


@asynccontextmanager
async def running(service: RoundhouseService) -> AsyncIterator[RoundhouseService]:
    stop = asyncio.Event()
    task = asyncio.create_task(run_service(service, stop=stop))
    try:
        await eventually(lambda: service.metrics_url is not None or task.done(), timeout_s=15)
        if task.done():
            task.result()
        yield service
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def test_scheduler_metrics_follow_a_job_from_queue_to_completion(
    broker: Broker, bus: Bus, namespace: str, tmp_path: Path
) -> None:
    workers = FakeWorkers(bus, {"n0": 1})
    await workers.start()
    scheduler = SchedulerService(
        SchedulerConfig(
            nats=broker.url, namespace=namespace, db=str(tmp_path / "db"), instance="sched-m", policy="fifo",
            round_s=0.3, leader_ttl_s=1.0, plan_timeout_s=2.0, request_timeout_s=0.5, log_format="text",
            metrics_port=0,
        )
    )  # fmt: skip
    placement = PlacementService(
        PlacementConfig(nats=broker.url, namespace=namespace, policy="consolidated", metrics_port=0)
    )
    try:
        async with running(placement), running(scheduler):
            assert scheduler.metrics_url is not None
            assert scheduler.metrics_url.startswith("http://127.0.0.1:")  # loopback by default
            url = scheduler.metrics_url
            await eventually(lambda: scheduler.is_leader and len(scheduler.inventory) == 1, timeout_s=10)

            def spec(name: str) -> JobSpec:
                return JobSpec(name=name, command=["python", "train.py"], gpus=1, user="alice")

            async def submit(job_id: str) -> None:
                await bus.publish(JOB_ARRIVED, JobArrived(job_id=job_id, spec=spec(job_id)))
                await bus.publish(JOB_ACCEPTED, JobAccepted(job_id=job_id))

            await submit("job-0")
            await eventually(lambda: workers.lease_of("job-0") is not None, timeout_s=10)
            await submit("job-1")  # the only GPU is taken: it waits
            await eventually(lambda: (e := scheduler.book.entry("job-1")) is not None and e.state.is_waiting)
            samples, text = await asyncio.to_thread(scrape, url)
            job_class = spec("x").job_class.value
            assert value(samples, "roundhouse_queue_depth", job_class=job_class, user="alice") == 1.0
            assert value(samples, "roundhouse_queue_gpus", job_class=job_class, user="alice") == 1.0
            assert value(samples, "roundhouse_running_jobs", job_class=job_class, user="alice") == 1.0
            assert value(samples, "roundhouse_grants_total") == 1.0
            assert value(samples, "roundhouse_scheduler_leader") == 1.0
            assert value(samples, "roundhouse_scheduler_epoch") == float(scheduler.epoch or -1)
            assert value(samples, "roundhouse_node_gpus", node="n0") == 1.0
            assert value(samples, "roundhouse_node_gpus_allocated", node="n0") == 1.0
            assert value(samples, "roundhouse_node_up", node="n0") == 1.0
            assert value(samples, "roundhouse_job_wait_seconds_count", job_class=job_class) == 1.0
            assert (value(samples, "roundhouse_round_phase_seconds_count", phase="placement") or 0) >= 1
            assert value(samples, "roundhouse_policy_info", kind="scheduler", policy="fifo", options="{}") == 1.0
            assert value(samples, "roundhouse_service_info", kind="scheduler", instance="sched-m",
                          namespace=namespace, version=_version(samples, "scheduler")) == 1.0  # fmt: skip
            assert "roundhouse_refusals_total" in text or "# TYPE roundhouse_refusals counter" in text

            node, lease_id = workers.lease_of("job-0") or ("", "")
            await workers.finish(node, lease_id, completed=True)
            await eventually(lambda: workers.lease_of("job-1") is not None, timeout_s=10)
            await eventually(lambda: (e := scheduler.book.entry("job-1")) is not None and e.state.is_running)
            samples, _ = await asyncio.to_thread(scrape, url)
            assert value(samples, "roundhouse_queue_depth", job_class=job_class, user="alice") is None  # none waits
            assert value(samples, "roundhouse_grants_total") == 2.0
            assert value(samples, "roundhouse_job_wait_seconds_count", job_class=job_class) == 2.0
            completed = value(samples, "roundhouse_job_completion_seconds_count", job_class=job_class,
                              status="completed")  # fmt: skip
            assert completed == 1.0
            assert (value(samples, "roundhouse_rounds_total", trigger="completion") or 0) + (
                value(samples, "roundhouse_rounds_total", trigger="timer") or 0
            ) >= 1

            assert placement.metrics_url is not None
            placed, _ = await asyncio.to_thread(scrape, placement.metrics_url)
            assert value(placed, "roundhouse_policy_info", kind="placement", policy="consolidated",
                         options="{}") == 1.0  # fmt: skip
            assert (value(placed, "roundhouse_placement_plans") or 0) >= 2
            with pytest.raises(urllib.error.HTTPError, match="404"):
                await asyncio.to_thread(urllib.request.urlopen, url.replace("/metrics", "/nothing"), None, 5)
    finally:
        await workers.stop()


def _version(samples: Samples, kind: str) -> str:
    for (name, labels), _ in samples.items():
        if name == "roundhouse_service_info" and ("kind", kind) in labels:
            return dict(labels)["version"]
    raise AssertionError("no roundhouse_service_info")
