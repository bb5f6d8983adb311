"""The metrics service: job metrics folded into per-job aggregates in KV, and node GPU readings.

* ``metrics.job.*`` (queue group ``metrics``): samples are buffered per job and, every
  ``flush_interval_s``, folded into the job's :class:`~services.metrics.aggregates.JobAggregate`
  in the KV bucket ``job-metrics`` (key = job id, JSON), which the scheduler watches. A flush writes
  each changed job once, however many samples arrived, with compare-and-set: on a conflict (another
  replica of this service wrote the key) it reads the stored value and folds its samples into that.
* ``metrics.node.*`` (queue group ``metrics``): the latest ``NodeMetrics`` per node, written to the
  KV bucket ``node-metrics`` (key = node id) at the same cadence.
* With ``nvml_node_id`` set, the service also samples this host's GPUs through NVML every
  ``nvml_interval_s`` and publishes them as that node's ``NodeMetrics``; without NVML (no driver)
  it logs why once and carries on (``nvml.py``).
* ``/metrics`` (with ``metrics_port``): every node's latest GPU readings, by node and GPU
  (``services.runtime.prometheus.GpuCollector``): the cluster's utilization in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, ClassVar

import nats.errors
from nats.aio.subscription import Subscription
from pydantic import Field, ValidationError

from schemas.ids import TOKEN_PATTERN
from schemas.metrics import JobMetrics, NodeMetrics
from schemas.subjects import node_metrics
from services.metrics.aggregates import JOB_BUCKET, JOB_BUCKET_TTL_S, FoldOptions, JobAggregate, fold
from services.metrics.nvml import NvmlSampler
from services.runtime.bus import Bus
from services.runtime.config import ServiceConfig
from services.runtime.kv import KVBucket, KVConflictError
from services.runtime.prometheus import GpuCollector
from services.runtime.service import RoundhouseService

log = logging.getLogger("roundhouse.metrics")

NODE_BUCKET = "node-metrics"
QUEUE_GROUP = "metrics"
_CAS_ATTEMPTS = 5
_PARALLEL_WRITES = 256


class MetricsConfig(ServiceConfig):
    """Settings of the metrics service (``roundhouse service metrics --flush-interval-s 0.5``)."""

    flush_interval_s: float = Field(default=0.5, gt=0, le=3600, description="How often aggregates are written.")
    ewma_alpha: float = Field(default=0.3, gt=0, le=1, description="EWMA weight of a new sample.")
    quantum_s: float = Field(default=10.0, gt=0, le=86_400, description="Longest loss quantum (Hermes: 10 s).")
    loss_history: int = Field(default=256, ge=1, le=10_000, description="Loss samples kept per job.")
    max_quanta: int = Field(default=16, ge=2, le=10_000, description="Loss quanta kept per job.")
    max_buffered: int = Field(default=1000, ge=1, le=1_000_000, description="Samples buffered per job per flush.")
    max_ahead_s: float = Field(
        default=300.0, gt=0, le=86_400,
        description="A job sample dated further ahead of this service's clock is dropped: the aggregate keeps "
        "the newest by timestamp, so one far-future sample would be the job's loss and noise scale for good.",
    )  # fmt: skip
    kv_ttl_s: float = Field(
        default=JOB_BUCKET_TTL_S, gt=0, le=10**9, description="An entry expires this long after its last write."
    )
    nvml_node_id: str | None = Field(
        default=None, pattern=TOKEN_PATTERN, max_length=64, description="Sample this host's GPUs via NVML as this node."
    )
    nvml_interval_s: float = Field(default=5.0, gt=0, le=3600, description="NVML sampling period.")


class MetricsService(RoundhouseService):
    """Aggregates job metrics into KV; keeps the latest node readings."""

    kind: ClassVar[str] = "metrics"
    description: ClassVar[str] = "Roundhouse metrics: per-job aggregates in KV, node GPU readings"
    config_model: ClassVar[type[ServiceConfig]] = MetricsConfig

    def __init__(self, config: ServiceConfig) -> None:
        super().__init__(config)
        if not isinstance(config, MetricsConfig):
            raise TypeError(f"MetricsService needs a MetricsConfig, not {type(config).__name__}")
        self.settings = config
        self.fold_options = FoldOptions(
            alpha=config.ewma_alpha, quantum_s=config.quantum_s,
            max_history=config.loss_history, max_quanta=config.max_quanta,
        )  # fmt: skip
        self.nodes: dict[str, NodeMetrics] = {}
        """Latest readings per node."""
        self.counts: dict[str, int] = {
            "job_samples": 0, "node_samples": 0, "dropped": 0, "writes": 0, "conflicts": 0, "write_errors": 0,
            "nvml_samples": 0, "future_dated": 0,
        }  # fmt: skip
        self._buffer: dict[str, list[JobMetrics]] = {}
        self._dirty_nodes: set[str] = set()
        self._cache: dict[str, tuple[JobAggregate | None, int]] = {}
        self._jobs_kv: KVBucket | None = None
        self._nodes_kv: KVBucket | None = None
        self._bus: Bus | None = None
        self._subs: list[Subscription] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = False
        # /metrics: each node's latest GPU readings (the workers' NVML samples, or this host's).
        self.metrics_registry.register(GpuCollector(self.nodes.values))

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        self._jobs_kv = await bus.kv(JOB_BUCKET, ttl_s=self.settings.kv_ttl_s)
        self._nodes_kv = await bus.kv(NODE_BUCKET, ttl_s=self.settings.kv_ttl_s)
        self._subs.append(await bus.subscribe("metrics.job.*", JobMetrics, self._on_job, queue=QUEUE_GROUP))
        self._subs.append(await bus.subscribe("metrics.node.*", NodeMetrics, self._on_node, queue=QUEUE_GROUP))
        self._tasks.append(asyncio.create_task(self._flush_loop(), name="metrics-flush"))
        if self.settings.nvml_node_id is not None:
            self._tasks.append(asyncio.create_task(self._nvml_loop(self.settings.nvml_node_id), name="metrics-nvml"))

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for sub in self._subs:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.flush()  # what arrived before the unsubscribe is not lost

    # --- intake ---------------------------------------------------------------------------------
    async def _on_job(self, sample: JobMetrics) -> None:
        self.counts["job_samples"] += 1
        if sample.ts > time.time() + self.settings.max_ahead_s:
            # Any worker may publish metrics.job.* (docs/security.md): a forged far-future sample
            # would otherwise stay the job's latest (fold keeps the newest by ts) and pin what
            # pollux and the loss-aware policies read.
            self.counts["future_dated"] += 1
            return
        buffered = self._buffer.setdefault(sample.job_id, [])
        if len(buffered) >= self.settings.max_buffered:
            self.counts["dropped"] += 1  # metrics are lossy by design; the next flush catches up
            return
        buffered.append(sample)

    async def _on_node(self, sample: NodeMetrics) -> None:
        self.counts["node_samples"] += 1
        self.nodes[sample.node_id] = sample
        self._dirty_nodes.add(sample.node_id)

    # --- flush ----------------------------------------------------------------------------------
    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.flush_interval_s)
            try:
                await self.flush()
            except Exception:
                log.exception("metrics flush failed; retrying at the next one")

    async def flush(self) -> None:
        """Write every job with new samples, and every node with a new reading, to KV."""
        buffered, self._buffer = self._buffer, {}
        dirty_nodes, self._dirty_nodes = self._dirty_nodes, set()
        items = list(buffered.items())
        for start in range(0, len(items), _PARALLEL_WRITES):
            chunk = items[start : start + _PARALLEL_WRITES]
            await asyncio.gather(*(self._write_job(job_id, samples) for job_id, samples in chunk))
        if self._nodes_kv is not None:
            for node_id in dirty_nodes:
                await self._nodes_kv.put(node_id, self.nodes[node_id].model_dump_json().encode())

    async def _write_job(self, job_id: str, samples: list[JobMetrics]) -> None:
        kv = self._jobs_kv
        assert kv is not None
        base, revision = self._cache.get(job_id, (None, 0))
        for _ in range(_CAS_ATTEMPTS):
            try:
                value = fold(base, samples, self.fold_options)
            except ValueError:
                return  # only other ranks' samples: nothing to write
            data = value.model_dump_json().encode()
            try:
                if revision:
                    revision = await kv.update(job_id, data, last=revision)
                else:
                    revision = await kv.create(job_id, data)
            except KVConflictError:
                self.counts["conflicts"] += 1
                base, revision = await self._read(kv, job_id)
                continue
            self._cache[job_id] = (value, revision)
            self.counts["writes"] += 1
            return
        self.counts["write_errors"] += 1
        log.warning("job %s: gave up writing its aggregate after %d conflicts", job_id, _CAS_ATTEMPTS)

    async def _read(self, kv: KVBucket, job_id: str) -> tuple[JobAggregate | None, int]:
        """The stored aggregate and its revision; (None, 0) if there is none."""
        entry = await kv.get(job_id)
        if entry is None:
            return None, 0
        try:
            return JobAggregate.model_validate_json(entry.value), entry.revision
        except ValidationError as exc:
            log.warning("job %s: stored aggregate is unreadable, starting afresh: %s", job_id, exc)
            return None, entry.revision

    # --- NVML -------------------------------------------------------------------------------------
    async def _nvml_loop(self, node_id: str) -> None:
        sampler = NvmlSampler.open()
        if sampler is None:
            log.warning("no NVML on this host (%s): node %s gets no GPU readings from here",
                        NvmlSampler.last_error, node_id)  # fmt: skip
            return
        assert self._bus is not None
        subject = node_metrics(node_id)
        try:
            while True:
                gpus = await asyncio.to_thread(sampler.sample)
                reading = NodeMetrics(node_id=node_id, gpus=gpus, interval_s=self.settings.nvml_interval_s)
                await self._bus.publish(subject, reading)
                self.counts["nvml_samples"] += 1
                await asyncio.sleep(self.settings.nvml_interval_s)
        finally:
            sampler.close()

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "jobs": len(self._cache), "nodes": len(self.nodes)}
