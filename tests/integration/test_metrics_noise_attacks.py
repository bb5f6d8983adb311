"""Hostile gradient noise scales on ``metrics.job.<job>`` never reach the job-metrics aggregate (issue 17
Pollux, review).

Real parts: a nats-server and the metrics service. An attacker on the bus (a raw NATS client,
``tests.attacker``, so no Roundhouse codec stops it before it leaves) reports noise scales the
schema must refuse (NaN, infinity, negative, past 1e12, not a number) and, last, one it accepts.
The refused samples must be dropped as malformed by the service's bus and nothing they carry may be
folded into the ``job-metrics`` KV bucket, the only way a noise scale reaches the scheduler's
``JobState`` and Pollux (``services.scheduler.metrics.apply_metrics``). That an accepted, forged
value does get there is the known limit of docs/security.md (any worker may publish
``metrics.job.*``); what it can do to Pollux is bounded in ``tests/unit/pollux/test_forged_noise_scale.py``.
"""

from __future__ import annotations

import json

from schemas.metrics import JobMetrics
from schemas.subjects import job_metrics
from services.metrics.aggregates import JobAggregate
from services.metrics.service import JOB_BUCKET, MetricsConfig, MetricsService
from services.runtime.broker import Broker
from services.runtime.bus import Bus
from services.runtime.kv import KVEntry
from tests.attacker import Attacker
from tests.helpers import eventually

JOB = "victim-job"


def sample(iteration: int, noise: object) -> bytes:
    """A JobMetrics for ``JOB`` whose ``grad_noise_scale`` is ``noise`` as raw JSON text."""
    body = JobMetrics(job_id=JOB, rank=0, iteration=iteration, ts=1_000.0 + iteration).model_dump(mode="json")
    body["grad_noise_scale"] = "__NOISE__"
    return json.dumps(body).replace('"__NOISE__"', str(noise)).encode()


HOSTILE = ["NaN", "Infinity", "-Infinity", "-1", "1e13", '"huge"']


async def test_refused_noise_scales_are_dropped_and_never_folded(broker: Broker, bus: Bus, namespace: str) -> None:
    service = MetricsService(MetricsConfig(nats=broker.url, namespace=namespace, flush_interval_s=0.05))
    service_bus = await Bus.connect(broker.url, name="metrics-under-attack", options=bus.options)
    await service.start(service_bus)
    seen: list[JobAggregate] = []

    async def watch(entry: KVEntry) -> None:
        if not entry.deleted and entry.key == JOB:
            seen.append(JobAggregate.model_validate_json(entry.value))

    await (await bus.kv(JOB_BUCKET)).watch(">", watch)
    attacker = await Attacker.connect(broker.url, namespace=namespace)
    try:
        for i, noise in enumerate(HOSTILE, start=1):
            await attacker.publish(job_metrics(JOB), sample(i, noise))
        await attacker.publish(job_metrics(JOB), sample(100, "250.0"))  # accepted: the control
        await eventually(lambda: any(a.grad_noise_scale is not None for a in seen), 15, "the control folded")
        malformed = service_bus.stats.by_subject_malformed.get(job_metrics(JOB), 0)
    finally:
        await attacker.close()
        await service.stop()
        await service_bus.close()
    assert malformed == len(HOSTILE)
    assert service.counts["job_samples"] == 1  # only the control reached the service's handler
    assert {a.grad_noise_scale for a in seen} <= {None, 250.0}
    assert seen[-1].grad_noise_scale == 250.0
    assert seen[-1].samples == 1


async def test_a_far_future_sample_cannot_pin_the_noise_scale(broker: Broker, bus: Bus, namespace: str) -> None:
    """The aggregate keeps the newest sample by its own timestamp: a forged one dated 2099 (within the
    schema's bound) would have stayed the job's noise scale whatever the job reported after it."""
    service = MetricsService(MetricsConfig(nats=broker.url, namespace=namespace, flush_interval_s=0.05))
    service_bus = await Bus.connect(broker.url, name="metrics-future", options=bus.options)
    await service.start(service_bus)
    seen: list[JobAggregate] = []

    async def watch(entry: KVEntry) -> None:
        if not entry.deleted and entry.key == JOB:
            seen.append(JobAggregate.model_validate_json(entry.value))

    await (await bus.kv(JOB_BUCKET)).watch(">", watch)
    attacker = await Attacker.connect(broker.url, namespace=namespace)
    try:
        forged = JobMetrics(job_id=JOB, rank=0, iteration=10**9, ts=4_070_908_800.0, grad_noise_scale=1e12)
        await attacker.publish(job_metrics(JOB), forged)
        await eventually(lambda: service.counts["future_dated"] == 1, 15, "the forged sample judged")
        honest = JobMetrics(job_id=JOB, rank=0, iteration=5, grad_noise_scale=250.0)  # dated now
        await bus.publish(job_metrics(JOB), honest)
        await eventually(lambda: any(a.grad_noise_scale is not None for a in seen), 15, "the honest sample folded")
    finally:
        await attacker.close()
        await service.stop()
        await service_bus.close()
    assert {a.grad_noise_scale for a in seen} == {250.0}
    assert seen[-1].iteration == 5
