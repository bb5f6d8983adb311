"""What one page shows, gathered for one visitor: their jobs, the nodes, the policies in force.

Everything comes from the scheduler's query API over the visitor's own bus connection, so the broker
and the scheduler decide what the visitor may read: jobs from ``query.jobs`` (the call ``roundhouse
jobs`` makes: a user gets their own jobs, an operator everyone's), nodes from ``query.nodes`` and
each service's instances and policy from ``query.status`` (``roundhouse nodes`` / ``status``,
:mod:`roundhouse.queries`). A scheduler too old to serve those two leaves the page to the services'
Prometheus ``/metrics`` that ``up.json`` lists (the scheduler's ``roundhouse_node_*`` series, every
service's ``roundhouse_policy_info``) and, failing those, to the nodes the visible jobs are placed on.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
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
from roundhouse.queries import fetch_nodes, fetch_status
from schemas.control import JobsQuery, JobView
from schemas.operations import NodesReply, StatusReply
from services.runtime.bus import BusError, NoResponderError

if TYPE_CHECKING:
    from roundhouse.client import Client

__all__ = ["NodeView", "PolicyView", "Snapshot", "SnapshotSource", "nodes_from_placements"]

_SCRAPE_TIMEOUT_S = 2.0
_QUERY_TIMEOUT_S = 3.0
_STATUS_TTL_S = 15.0
"""Policies change only when a service restarts or a standby takes over: ``query.status`` (the
scheduler asks every instance for its stats) is asked at most this often per identity."""
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
    other_jobs: int = 0
    """Jobs on it the visitor may not see (another user's), counted only."""
    state: str | None = None
    """The scheduler's one word for it (``idle``, ``mixed``, ``silent``, ``draining``, … as ``sinfo``)."""


@dataclass(frozen=True, slots=True)
class PolicyView:
    service: str
    policy: str
    options: str
    """JSON, keys sorted."""
    instance: str = ""
    leader: bool = False


@dataclass(frozen=True, slots=True)
class Snapshot:
    taken_at: float
    visitor: str
    jobs: list[JobView] = field(default_factory=list)
    truncated: bool = False
    nodes: list[NodeView] = field(default_factory=list)
    policies: list[PolicyView] = field(default_factory=list)
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
        visible = tuple(dict.fromkeys((*node.jobs, *(job.job_id for job in placed))))
        nodes[node.node_id] = NodeView(node.node_id, node.gpus, node.allocated, node.up, node.draining, visible,
                                       node.other_jobs, node.state)  # fmt: skip
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


def _policy_from_metrics(service: str, samples: Samples) -> PolicyView | None:
    for labels, value in samples.get("roundhouse_policy_info", []):
        if value and "policy" in labels:
            return PolicyView(service, labels["policy"], labels.get("options", "{}"))
    return None


def _nodes_from_reply(reply: NodesReply) -> list[NodeView]:
    return [
        NodeView(node.node_id, node.gpus_total, node.gpus_used, up=node.live and not node.silent,
                 draining=node.draining, jobs=tuple(node.jobs), other_jobs=node.other_jobs, state=node.state.value)
        for node in reply.nodes
    ]  # fmt: skip


def _policies_from_reply(reply: StatusReply) -> list[PolicyView]:
    return [
        PolicyView(service.kind, instance.policy, json.dumps(instance.policy_options, sort_keys=True),
                   instance.instance, instance.leader)
        for service in sorted(reply.services, key=lambda service: service.kind)
        for instance in service.instances
        if instance.policy is not None
    ]


_QUERY_ERRORS = (NoResponderError, BusError, TimeoutError, nats.errors.Error)
"""What a scheduler without ``query.nodes`` / ``query.status`` (or a slow one) answers with."""


class SnapshotSource:
    """Gathers a :class:`Snapshot` for one visitor's client; knows where the ``/metrics`` are.

    ``metrics_urls`` are given, or read from ``up.json`` in ``state_dir`` on every snapshot (``up``
    writes them once its services answer, after the dashboard started)."""

    def __init__(self, *, state_dir: Path | None = None, metrics_urls: dict[str, str] | None = None) -> None:
        self.state_dir = state_dir
        self._metrics_urls = metrics_urls
        self._http: aiohttp.ClientSession | None = None
        self._status: OrderedDict[str, tuple[float, list[PolicyView]]] = OrderedDict()
        self._queries_unserved_until = 0.0
        """While the leader answers jobs but not ``query.nodes`` (an older scheduler), do not wait on it."""

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

    async def _from_metrics(self, errors: list[str]) -> tuple[list[NodeView], list[PolicyView]]:
        nodes: list[NodeView] = []
        policies: list[PolicyView] = []
        for name, url in sorted(self.metrics_urls().items()):
            if name.startswith("node-") or not url.startswith(("http://", "https://")):
                continue  # workers' series are their GPUs; the scheduler's node series cover every node
            try:
                samples = await self._scrape(url)
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                errors.append(f"{name} /metrics: {type(exc).__name__}")
                continue
            policy = _policy_from_metrics(name, samples)
            if policy is not None:
                policies.append(policy)
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
        known, policies = await self._from_queries(client, leading=not errors)
        if known is None or policies is None:
            scraped_nodes, scraped_policies = await self._from_metrics(errors)
            known = known if known is not None else scraped_nodes
            policies = policies if policies is not None else scraped_policies
        nodes = nodes_from_placements(jobs, known)
        return Snapshot(time.time(), client.identity, queue_order(jobs), truncated, nodes, policies, errors)


    async def _from_queries(
        self, client: Client, *, leading: bool
    ) -> tuple[list[NodeView] | None, list[PolicyView] | None]:
        """Nodes and policies from ``query.nodes`` / ``query.status`` as the client; None for what the
        scheduler did not answer (an older one has neither). ``leading``: a leader answered jobs."""
        now = time.monotonic()
        if not leading or now < self._queries_unserved_until:
            return None, None
        nodes: list[NodeView] | None = None
        try:
            nodes = _nodes_from_reply(await fetch_nodes(client.bus, timeout_s=_QUERY_TIMEOUT_S))
        except NoResponderError:  # a leader that answers jobs but not nodes: older than query.nodes
            self._queries_unserved_until = now + 60.0
            return None, None
        except _QUERY_ERRORS:
            pass
        cached = self._status.get(client.identity)
        if cached is not None and now - cached[0] < _STATUS_TTL_S:
            return nodes, cached[1]
        try:
            policies = _policies_from_reply(await fetch_status(client.bus, timeout_s=_QUERY_TIMEOUT_S))
        except _QUERY_ERRORS:
            return nodes, None
        self._status[client.identity] = (now, policies)
        self._status.move_to_end(client.identity)
        while len(self._status) > 256:  # identities come and go; keep the recent ones
            self._status.popitem(last=False)
        return nodes, policies


async def fetch_visible_jobs(client: Client) -> tuple[list[JobView], bool]:
    """Every job the client may read, finished ones included (the JCT distribution needs them)."""
    reply = await client.jobs(JobsQuery(requester=client.identity, include_finished=True, limit=_JOBS_LIMIT))
    return reply.jobs, reply.truncated
