"""The metrics service against a real nats-server: job metrics aggregated into the ``job-metrics``
KV bucket (also by two replicas at once), node readings in ``node-metrics``, NVML's absence
handled, and the service as a child process (``python -m services.metrics``)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from schemas.metrics import GpuSample, JobMetrics, NodeMetrics
from schemas.subjects import job_metrics, node_metrics
from services.metrics.aggregates import JobAggregate
from services.metrics.nvml import NvmlSampler, unavailable_reason
from services.metrics.service import JOB_BUCKET, NODE_BUCKET, MetricsConfig, MetricsService
from services.runtime.broker import Broker
from services.runtime.bus import Bus
from services.runtime.kv import KVEntry
from tests.helpers import eventually

REPO = Path(__file__).resolve().parents[2]


def config(broker: Broker, namespace: str, **extra: object) -> MetricsConfig:
    return MetricsConfig(nats=broker.url, namespace=namespace, flush_interval_s=0.05, **extra)


def metric(job_id: str, ts: float, iteration: int, loss: float, it_s: float) -> JobMetrics:
    return JobMetrics(job_id=job_id, lease_id="l1", rank=0, iteration=iteration, loss=loss,
                      iteration_time_s=it_s, throughput=100.0, ts=ts)  # fmt: skip


class Watched:
    """The latest aggregate per job, as the scheduler would see it through a KV watch."""

    def __init__(self) -> None:
        self.latest: dict[str, JobAggregate] = {}

    async def __call__(self, entry: KVEntry) -> None:
        if not entry.deleted:
            self.latest[entry.key] = JobAggregate.model_validate_json(entry.value)


async def test_job_metrics_are_aggregated_into_kv_and_a_watcher_sees_them(
    broker: Broker, bus: Bus, namespace: str
) -> None:
    service = MetricsService(config(broker, namespace, ewma_alpha=0.5, quantum_s=10))
    await service.start(bus)
    watched = Watched()
    await (await bus.kv(JOB_BUCKET)).watch(">", watched)
    try:
        for event in (metric("j1", 100, 10, 2.0, 1.0), metric("j1", 104, 20, 1.0, 2.0),
                      metric("j1", 111, 30, 0.8, 4.0), metric("j2", 100, 5, 9.0, 0.5)):  # fmt: skip
            await bus.publish(job_metrics(event.job_id), event)
        await eventually(lambda: watched.latest.get("j1") is not None and watched.latest["j1"].samples == 3)
    finally:
        await service.stop()
    j1 = watched.latest["j1"]
    assert (j1.iteration, j1.loss, j1.lease_id) == (30, 0.8, "l1")
    assert j1.iteration_time_s == pytest.approx(2.75)  # 1.0 -> 1.5 -> 2.75 with alpha 0.5
    assert [(q.min_loss, q.max_loss, q.count) for q in j1.quanta] == [(1.0, 2.0, 2), (0.8, 0.8, 1)]
    assert j1.loss_history == [(100, 2.0), (104, 1.0), (111, 0.8)]
    assert watched.latest["j2"].iteration == 5
    stored = await (await bus.kv(JOB_BUCKET)).get("j1")
    assert stored is not None
    assert JobAggregate.model_validate_json(stored.value) == j1


async def test_two_replicas_merge_their_samples_with_compare_and_set(broker: Broker, bus: Bus, namespace: str) -> None:
    replicas = [MetricsService(config(broker, namespace)) for _ in range(2)]
    for replica in replicas:
        await replica.start(bus)
    try:
        for i in range(200):
            await bus.publish(job_metrics("shared"), metric("shared", 1000 + i, i + 1, 1.0 / (i + 1), 0.1))
        kv = await bus.kv(JOB_BUCKET)

        async def samples() -> int:
            entry = await kv.get("shared")
            return JobAggregate.model_validate_json(entry.value).samples if entry else 0

        for _ in range(200):
            if await samples() >= 200:
                break
            await asyncio.sleep(0.05)
        assert await samples() == 200  # no sample lost to a concurrent write
        assert all(r.counts["job_samples"] > 0 for r in replicas)  # the queue group shared them
        entry = await kv.get("shared")
        assert entry is not None
        assert JobAggregate.model_validate_json(entry.value).iteration == 200
    finally:
        for replica in replicas:
            await replica.stop()


async def test_node_readings_are_kept_per_node(broker: Broker, bus: Bus, namespace: str) -> None:
    service = MetricsService(config(broker, namespace))
    await service.start(bus)
    try:
        reading = NodeMetrics(node_id="node-a", gpus=[GpuSample(index=0, utilization_pct=87.5, memory_used_mib=900)])
        await bus.publish(node_metrics("node-a"), reading)
        kv = await bus.kv(NODE_BUCKET)
        for _ in range(500):
            if await kv.get("node-a") is not None:
                break
            await asyncio.sleep(0.02)
        entry = await kv.get("node-a")
        assert entry is not None
        assert NodeMetrics.model_validate_json(entry.value).gpus[0].utilization_pct == 87.5
        assert service.nodes["node-a"] == reading
    finally:
        await service.stop()


@pytest.mark.skipif(unavailable_reason() is None, reason="NVML works on this host; this checks its absence")
async def test_without_nvml_the_sampler_says_why_and_the_service_keeps_aggregating(
    broker: Broker, bus: Bus, namespace: str
) -> None:
    assert NvmlSampler.open() is None
    assert "NVML" in NvmlSampler.last_error or "pynvml" in NvmlSampler.last_error
    service = MetricsService(config(broker, namespace, nvml_node_id="this-host", nvml_interval_s=0.05))
    await service.start(bus)
    try:
        await bus.publish(job_metrics("j"), metric("j", 1, 1, 1.0, 0.1))
        await eventually(lambda: service.counts["writes"] == 1)
        assert service.counts["nvml_samples"] == 0
    finally:
        await service.stop()


@pytest.mark.skipif(unavailable_reason() is not None, reason="no NVML on this host (no NVIDIA driver)")
def test_nvml_samples_every_gpu_where_present() -> None:
    sampler = NvmlSampler.open()
    assert sampler is not None
    try:
        samples = sampler.sample()
        assert [s.index for s in samples] == list(range(sampler.gpu_count))
        assert all(s.memory_total_mib and s.memory_used_mib <= s.memory_total_mib for s in samples)
    finally:
        sampler.close()


async def test_runs_as_a_child_process_and_flushes_on_sigterm(broker: Broker, bus: Bus, namespace: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.metrics", "--nats", broker.url, "--namespace", namespace,
        "--flush-interval-s", "30", "--log-format", "text",
        cwd=REPO, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        kv = await bus.kv(JOB_BUCKET)
        # The child has started once its queue subscription answers; publish until one is counted.
        stats_subject = bus.wire("rh.metrics.stats")
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            await bus.publish(job_metrics("child"), metric("child", 1, 7, 0.5, 0.2))
            try:
                reply = await bus.nc.request(stats_subject, b"", timeout=0.5)
                if b'"job_samples": 0' not in reply.data:
                    break
            except Exception:
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError("the metrics child did not start")
            await asyncio.sleep(0.1)
        assert await kv.get("child") is None  # the 30 s flush has not come yet
        child.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(child.communicate(), 15)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    assert child.returncode == 0, stderr.decode()
    entry = await kv.get("child")
    assert entry is not None  # written by the flush on the way out
    assert JobAggregate.model_validate_json(entry.value).iteration == 7
