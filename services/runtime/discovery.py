"""Who runs: every service instance's answer to the NATS services API's ``$SRV.STATS``.

Every Roundhouse service and worker agent announces itself with the micro API
(``services/runtime/service.py``: name ``roundhouse-<kind>``, metadata ``instance`` and
``namespace``, and its own numbers as the stats endpoint's ``data``). One request on ``$SRV.STATS``
is answered by every instance on the broker, each on its own, so the answers are gathered until
none came for ``idle_s`` (or ``max_s`` passed): a scatter-gather, as ``nats micro stats`` does. An
instance that answers later than that is missed this time; nothing here waits on a count it cannot know.

Only this namespace's instances are kept (``metadata.namespace``): one broker may carry several
clusters, whose services all answer ``$SRV`` (its subjects carry no namespace).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from nats.aio.msg import Msg

from services.runtime.bus import Bus

__all__ = ["SERVICE_PREFIX", "Instance", "gather_instances"]

SERVICE_PREFIX = "roundhouse-"
"""The services-API name of each kind: ``roundhouse-<kind>``."""
_STATS = "$SRV.STATS"


@dataclass(frozen=True, slots=True)
class Instance:
    """One instance's answer, the parts ``roundhouse status`` shows."""

    kind: str
    """``scheduler``, ``admission``, ``placement``, ``metrics``, ``worker``."""
    service_id: str
    instance: str
    version: str
    metadata: dict[str, str] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    """The stats endpoint's data: ``{"service": service.stats(), "bus": ..., "uptime_s": ...}``."""

    @property
    def service_stats(self) -> dict[str, Any]:
        stats = self.data.get("service")
        return stats if isinstance(stats, dict) else {}

    @property
    def uptime_s(self) -> float | None:
        value = self.data.get("uptime_s")
        return float(value) if isinstance(value, int | float) and value >= 0 else None


def parse_stats(payload: bytes, namespace: str) -> Instance | None:
    """One ``$SRV.STATS`` answer as an :class:`Instance`; None for another namespace's, another
    program's service, or an answer that is not a stats response (it is not trusted to be)."""
    try:
        body = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(body, dict):
        return None
    name = body.get("name")
    metadata = body.get("metadata") or {}
    if not isinstance(name, str) or not name.startswith(SERVICE_PREFIX) or not isinstance(metadata, dict):
        return None
    if str(metadata.get("namespace", "")) != namespace:
        return None
    data: dict[str, Any] = {}
    endpoints = body.get("endpoints")
    for endpoint in endpoints if isinstance(endpoints, list) else []:
        if isinstance(endpoint, dict) and isinstance(endpoint.get("data"), dict):
            data = endpoint["data"]
            break
    service_id = str(body.get("id", ""))
    return Instance(
        kind=name.removeprefix(SERVICE_PREFIX),
        service_id=service_id,
        instance=str(metadata.get("instance") or service_id),
        version=str(body.get("version", "")),
        metadata={str(k): str(v) for k, v in metadata.items()},
        data=data,
    )


async def gather_instances(bus: Bus, *, idle_s: float = 0.25, max_s: float = 1.5) -> list[Instance]:
    """Every instance of this bus's namespace that answered ``$SRV.STATS``, sorted by kind and instance."""
    namespace = bus.options.namespace
    answers: asyncio.Queue[Msg] = asyncio.Queue()

    async def on_answer(msg: Msg) -> None:
        answers.put_nowait(msg)

    inbox = bus.nc.new_inbox()
    sub = await bus.nc.subscribe(inbox, cb=on_answer)
    found: dict[str, Instance] = {}
    try:
        await bus.nc.publish(_STATS, b"", reply=inbox)
        deadline = time.monotonic() + max_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = await asyncio.wait_for(answers.get(), min(idle_s, left))
            except TimeoutError:
                break
            instance = parse_stats(msg.data, namespace)
            if instance is not None:
                found[instance.service_id] = instance
    finally:
        await sub.unsubscribe()
    return sorted(found.values(), key=lambda i: (i.kind, i.instance))
