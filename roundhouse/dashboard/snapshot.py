"""What one page shows, gathered for one visitor: their jobs, the nodes, the policies in force.

Jobs come from the scheduler's query API over the visitor's own bus connection (``query.jobs``, the
call ``roundhouse jobs`` makes), so the broker and the scheduler decide what the visitor may read: a
user gets their own jobs, an operator everyone's. Nodes and policies are not anyone's jobs: they come
from the services' Prometheus ``/metrics`` that ``up.json`` lists (``metrics_urls``; the scheduler's
``roundhouse_node_*`` series and every service's ``roundhouse_policy_info``), and, where none is
known, nodes are read off the visible jobs' placements.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import nats.errors
from prometheus_client.parser import text_string_to_metric_families

from roundhouse.commands.jobs import queue_order
from roundhouse.commands.statuses import FINAL
from roundhouse.endpoint import UP_FILE
from schemas.control import JobsQuery, JobView
from services.runtime.bus import BusError, NoResponderError

if TYPE_CHECKING:
    from roundhouse.client import Client

__all__ = ["NodeView", "Snapshot", "SnapshotSource", "nodes_from_placements"]

_SCRAPE_TIMEOUT_S = 2.0
_JOBS_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class NodeView:
    node_id: str
    gpus: int | None
    """GPUs the node has (None: not known from here)."""
    allocated: int
    up: bool | None = None
    draining: bool | None = None
    jobs: tuple[str, ...] = ()
    """The visible jobs placed on it."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    taken_at: float
    visitor: str
    jobs: list[JobView] = field(default_factory=list)
    truncated: bool = False
    nodes: list[NodeView] = field(default_factory=list)
    policies: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Service kind -> (policy, its options as JSON)."""
    errors: list[str] = field(default_factory=list)
    """What could not be read (the page still shows the rest)."""

    @property
    def waiting(self) -> list[JobView]:
        return [job for job in self.jobs if job.status in ("queued", "held")]

    @property
    def running(self) -> list[JobView]:
        return [job for job in self.jobs if job.status not in FINAL and job.status not in ("queued", "held")]

    @property
    def finished(self) -> list[JobView]:
        return [job for job in self.jobs if job.status in FINAL]

    @property
    def gpu_totals(self) -> tuple[int, int | None]:
        """(GPUs allocated, GPUs in all; None when a node's size is unknown)."""
        allocated = sum(node.allocated for node in self.nodes)
        sizes = [node.gpus for node in self.nodes]
        if not sizes or any(size is None for size in sizes):
            return allocated, None
        return allocated, sum(size for size in sizes if size is not None)


def nodes_from_placements(jobs: Iterable[JobView], known: Iterable[NodeView] = ()) -> list[NodeView]:
    """``known`` nodes with the visible jobs placed on them added; nodes only a placement names get an
    unknown size and the GPUs those jobs hold."""
    by_node: dict[str, list[JobView]] = {}
    for job in jobs:
        if job.status in FINAL:
            continue
        for node_id in job.placement:
            by_node.setdefault(node_id, []).append(job)
    nodes: dict[str, NodeView] = {}
    for node in known:
        placed = by_node.get(node.node_id, [])
        nodes[node.node_id] = NodeView(node.node_id, node.gpus, node.allocated, node.up, node.draining,
                                       tuple(job.job_id for job in placed))  # fmt: skip
    for node_id, placed in by_node.items():
        if node_id not in nodes:
            held = sum(len(job.placement[node_id]) for job in placed)
            nodes[node_id] = NodeView(node_id, None, held, jobs=tuple(job.job_id for job in placed))
    return [nodes[node_id] for node_id in sorted(nodes)]


Samples = dict[str, list[tuple[dict[str, str], float]]]


def _parse_metrics(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def _nodes_from_metrics(samples: Samples) -> list[NodeView]:
    def by_node(name: str) -> dict[str, float]:
        return {labels["node"]: value for labels, value in samples.get(name, []) if "node" in labels}

    total, allocated = by_node("roundhouse_node_gpus"), by_node("roundhouse_node_gpus_allocated")
    up, draining = by_node("roundhouse_node_up"), by_node("roundhouse_node_draining")
    return [
        NodeView(node_id, int(gpus), int(allocated.get(node_id, 0)),
                 up=bool(up[node_id]) if node_id in up else None,
                 draining=bool(draining[node_id]) if node_id in draining else None)
        for node_id, gpus in sorted(total.items())
    ]  # fmt: skip


def _policy_from_metrics(samples: Samples) -> tuple[str, str] | None:
    for labels, value in samples.get("roundhouse_policy_info", []):
        if value and "policy" in labels:
            return labels["policy"], labels.get("options", "{}")
    return None


class SnapshotSource:
    """Gathers a :class:`Snapshot` for one visitor's client; knows where the ``/metrics`` are.

    ``metrics_urls`` are given, or read from ``up.json`` in ``state_dir`` on every snapshot (``up``
    writes them once its services answer, after the dashboard started)."""

    def __init__(self, *, state_dir: Path | None = None, metrics_urls: dict[str, str] | None = None) -> None:
        self.state_dir = state_dir
        self._metrics_urls = metrics_urls
        self._http: aiohttp.ClientSession | None = None

    def metrics_urls(self) -> dict[str, str]:
        if self._metrics_urls is not None:
            return self._metrics_urls
        if self.state_dir is None:
            return {}
        try:
            found = json.loads((self.state_dir / UP_FILE).read_text()).get("metrics_urls", {})
        except (OSError, ValueError, AttributeError):
            return {}
        return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _scrape(self, url: str) -> Samples:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_SCRAPE_TIMEOUT_S))
        async with self._http.get(url) as response:
            response.raise_for_status()
            return _parse_metrics(await response.text())

    async def _services(self, errors: list[str]) -> tuple[list[NodeView], dict[str, tuple[str, str]]]:
        nodes: list[NodeView] = []
        policies: dict[str, tuple[str, str]] = {}
        for name, url in sorted(self.metrics_urls().items()):
            if name.startswith("node-") or not url.startswith(("http://", "https://")):
                continue  # workers' series are their GPUs; the scheduler's node series cover every node
            try:
                samples = await self._scrape(url)
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                errors.append(f"{name} /metrics: {type(exc).__name__}")
                continue
            policy = _policy_from_metrics(samples)
            if policy is not None:
                policies[name] = policy
            if name == "scheduler":
                nodes = _nodes_from_metrics(samples)
        return nodes, policies

    async def gather(self, client: Client, fetch_jobs: Callable[[Client], Awaitable[tuple[list[JobView], bool]]]
                     | None = None) -> Snapshot:  # fmt: skip
        """Everything the page shows, as ``client``'s identity may see it; what fails is named in ``errors``."""
        errors: list[str] = []
        jobs: list[JobView] = []
        truncated = False
        try:
            jobs, truncated = await (fetch_jobs or fetch_visible_jobs)(client)
        except NoResponderError:
            errors.append("no scheduler is leading (nothing answers query.jobs)")
        except TimeoutError:
            errors.append("the scheduler did not answer the jobs query in time")
        except BusError as exc:
            errors.append(f"the scheduler failed to answer: {exc}")
        except nats.errors.Error as exc:  # the connection closed under us; the next request opens another
            errors.append(f"the bus connection failed: {type(exc).__name__}")
        known, policies = await self._services(errors)
        nodes = nodes_from_placements(jobs, known)
        return Snapshot(time.time(), client.identity, queue_order(jobs), truncated, nodes, policies, errors)


async def fetch_visible_jobs(client: Client) -> tuple[list[JobView], bool]:
    """Every job the client may read, finished ones included (the JCT distribution needs them)."""
    reply = await client.jobs(JobsQuery(requester=client.identity, include_finished=True, limit=_JOBS_LIMIT))
    return reply.jobs, reply.truncated
