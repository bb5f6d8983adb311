"""Prometheus ``/metrics`` for every service, served over HTTP from the service's own event loop.

Each :class:`~services.runtime.service.RoundhouseService` owns a ``CollectorRegistry``
(``service.metrics_registry``: one per service, so several services in one process never mix their
series). ``run_service`` serves it when ``metrics_port`` is set (``None``, the default: off; ``0``:
any free port, logged and announced in the service's ``$SRV.INFO`` metadata as ``metrics_url``).

Why a small asyncio server and not prometheus-client's ``start_http_server``: that one answers from
a thread, and the collectors read the service's own dicts (the scheduler's book, the inventory),
which the event loop mutates between awaits. Served here, a scrape runs on the loop, between two
messages, so every collector reads a consistent state without a lock; a scrape of a 20,000-job
book costs a few milliseconds of that loop, once per scrape interval.

The server binds ``metrics_host``, ``127.0.0.1`` by default: the series name users and the size of
their queues, which not every host user should read (docs/operations.md; the deploy files bind a
container's address on a network only Prometheus shares, or a pod's IP behind a NetworkPolicy).
It answers ``GET``/``HEAD /metrics`` (and ``/`` with a pointer to it), one request per connection,
with a size and time limit on the request.

Every service exposes (:class:`ServiceCollector`): ``roundhouse_service_info`` (kind, instance,
namespace, version), ``roundhouse_service_uptime_seconds``, ``roundhouse_policy_info`` (the policy
in force and its options, for services that run one), the bus counters
(``roundhouse_bus_<counter>_total``) and each plain number of the service's ``stats()`` as
``roundhouse_<kind>_<name>`` (untyped: the same numbers ``$SRV.STATS`` reports).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric, UnknownMetricFamily
from prometheus_client.registry import Collector

from schemas.metrics import NodeMetrics

log = logging.getLogger("roundhouse.metrics.http")

__all__ = ["GpuCollector", "MetricsBindError", "MetricsServer", "ServiceCollector", "metric_name", "new_registry"]

_MAX_REQUEST = 8192
_REQUEST_TIMEOUT_S = 5.0
_NAME = re.compile(r"[^a-zA-Z0-9_]")


def new_registry() -> CollectorRegistry:
    """An empty registry (no process or platform collectors: those belong to the process, and
    several services may share one in tests)."""
    return CollectorRegistry(auto_describe=False)


def metric_name(*parts: str) -> str:
    """``roundhouse`` plus ``parts``, as a valid metric name (anything else becomes ``_``)."""
    return "_".join(_NAME.sub("_", p) for p in ("roundhouse", *parts) if p)


class ServiceCollector(Collector):
    """What every service exposes (module doc), read at scrape time."""

    def __init__(
        self,
        *,
        kind: str,
        instance: str,
        namespace: str,
        version: str,
        started_at: float,
        stats: Callable[[], Mapping[str, Any]],
        bus_stats: Callable[[], Mapping[str, Any]] | None = None,
        policy: Callable[[], tuple[str, Mapping[str, Any]] | None] | None = None,
    ) -> None:
        self.kind = kind
        self.labels = {"kind": kind, "instance": instance, "namespace": namespace}
        self.version = version
        self.started_at = started_at
        self._stats = stats
        self._bus_stats = bus_stats
        self._policy = policy

    def collect(self) -> Iterable[Metric]:
        info = InfoMetricFamily("roundhouse_service", "This Roundhouse service instance.")
        info.add_metric([], {**self.labels, "version": self.version})
        yield info
        uptime = GaugeMetricFamily("roundhouse_service_uptime_seconds", "Seconds since the service started.")
        uptime.add_metric([], max(0.0, time.time() - self.started_at))
        yield uptime
        chosen = self._policy() if self._policy is not None else None
        if chosen is not None:
            name, options = chosen
            policy = InfoMetricFamily(
                "roundhouse_policy", "The policy this service runs and its options (JSON, keys sorted).",
                labels=["kind"],
            )  # fmt: skip
            policy.add_metric([self.kind], {"policy": name, "options": json.dumps(dict(options), sort_keys=True)})
            yield policy
        if self._bus_stats is not None:
            for key, value in self._bus_stats().items():
                if _is_number(value):
                    counter = CounterMetricFamily(metric_name("bus", key), f"Bus counter {key} ($SRV.STATS bus).")
                    counter.add_metric([], float(value))
                    yield counter
        for key, value in self._stats().items():
            if _is_number(value):
                family = UnknownMetricFamily(
                    metric_name(self.kind, key), f"{self.kind} stats() value {key!r} (as in $SRV.STATS)."
                )
                family.add_metric([], float(value))
                yield family


class GpuCollector(Collector):
    """GPU readings by ``node`` and ``gpu`` (NVML's, or a fake inventory's), from the latest
    ``NodeMetrics`` of each node ``readings`` returns: ``roundhouse_gpu_utilization_ratio`` (0-1),
    ``roundhouse_gpu_memory_used_bytes``, ``roundhouse_gpu_memory_total_bytes``,
    ``roundhouse_gpu_temperature_celsius``, ``roundhouse_gpu_power_watts`` (those a board reports)
    and ``roundhouse_node_gpu_utilization_ratio`` (the node's mean)."""

    def __init__(self, readings: Callable[[], Iterable[NodeMetrics]]) -> None:
        self._readings = readings

    def collect(self) -> Iterable[Metric]:
        labels = ["node", "gpu"]
        util = GaugeMetricFamily("roundhouse_gpu_utilization_ratio", "GPU utilization (0-1).", labels=labels)
        used = GaugeMetricFamily("roundhouse_gpu_memory_used_bytes", "GPU memory in use.", labels=labels)
        total = GaugeMetricFamily("roundhouse_gpu_memory_total_bytes", "GPU memory.", labels=labels)
        temp = GaugeMetricFamily("roundhouse_gpu_temperature_celsius", "GPU temperature.", labels=labels)
        power = GaugeMetricFamily("roundhouse_gpu_power_watts", "GPU power draw.", labels=labels)
        node_util = GaugeMetricFamily(
            "roundhouse_node_gpu_utilization_ratio", "Mean utilization of the node's GPUs (0-1).", labels=["node"]
        )
        for reading in sorted(self._readings(), key=lambda r: r.node_id):
            for gpu in reading.gpus:
                key = [reading.node_id, str(gpu.index)]
                util.add_metric(key, gpu.utilization_pct / 100.0)
                used.add_metric(key, float(gpu.memory_used_mib * _MIB))
                if gpu.memory_total_mib is not None:
                    total.add_metric(key, float(gpu.memory_total_mib * _MIB))
                if gpu.temperature_c is not None:
                    temp.add_metric(key, gpu.temperature_c)
                if gpu.power_w is not None:
                    power.add_metric(key, gpu.power_w)
            if reading.gpus:
                mean = sum(g.utilization_pct for g in reading.gpus) / len(reading.gpus) / 100.0
                node_util.add_metric([reading.node_id], mean)
        yield from (util, used, total, temp, power, node_util)


_MIB = 1024 * 1024


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not (isinstance(value, float) and math.isnan(value))


class MetricsBindError(OSError):
    """``/metrics`` cannot listen where ``metrics_host``/``metrics_port`` say (port taken, address not
    this host's, name not resolvable); the message names both settings."""


class MetricsServer:
    """``/metrics`` of one registry over HTTP/1.1 on the running event loop (module doc)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._server: asyncio.Server | None = None
        self.host = ""
        self.port = 0

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on ``host:port`` (0: a free port); returns the URL of ``/metrics``. Raises
        :class:`MetricsBindError` when it cannot."""
        try:
            self._server = await asyncio.start_server(self._serve, host, port, limit=_MAX_REQUEST)
        except OSError as exc:
            raise MetricsBindError(
                exc.errno, f"cannot serve /metrics on {host}:{port} (metrics_host, metrics_port): {exc.strerror or exc}"
            ) from exc
        sockname = self._server.sockets[0].getsockname()
        self.host, self.port = str(sockname[0]), int(sockname[1])
        return self.url

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _REQUEST_TIMEOUT_S)
            status, content_type, body, method = self._answer(head)
            headers = (
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(headers.encode("latin-1") + (b"" if method == "HEAD" else body))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # a slow, oversized or vanished client gets nothing
        except Exception:
            log.exception("metrics request failed")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _answer(self, head: bytes) -> tuple[str, str, bytes, str]:
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split(" ")
        if len(parts) != 3:
            return "400 Bad Request", "text/plain", b"bad request\n", "GET"
        method, target, _ = parts
        path = target.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain", b"only GET and HEAD\n", method
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(self.registry), method
        if path == "/":
            return "200 OK", "text/plain; charset=utf-8", b"Roundhouse: see /metrics\n", method
        return "404 Not Found", "text/plain", b"not found: try /metrics\n", method
