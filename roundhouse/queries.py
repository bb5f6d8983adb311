"""Ask the scheduler leader for the operator's view: nodes, the control plane's status, drains.

    bus = (await Client.connect(url, creds=creds)).bus
    nodes = await fetch_nodes(bus)          # NodesReply: GPUs, jobs, liveness, drains per node
    status = await fetch_status(bus)        # StatusReply: leader, epoch, services, round, queue
    await request_drain(bus, "node-01", now=True)   # operators only

Each asks as the bus's identity (the credentials' name; without credentials ``$ROUNDHOUSE_USER`` or
the login name, which nothing vouches for), on the subject ending in that name
(``query.nodes.<identity>``), as ``roundhouse jobs`` does. Only the leader serves these subjects, so
during an election (a scheduler starting or taking over) nothing does for a moment: each request is
asked again until ``timeout_s`` has passed, then :class:`~services.runtime.bus.NoResponderError`
says that no scheduler leads. A refusal (an unknown node, a user who asked to drain) comes back as
:class:`~services.runtime.bus.RemoteError` with the scheduler's reason.

A user's drain never reaches the scheduler on a secured broker (it lets no user publish on
``operator.drain.*``, and the request would only time out): :func:`request_drain` refuses it at once
with :class:`DrainPermissionError`, naming the role the credentials hold.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TypeVar

from schemas.base import Event, WireModel
from schemas.operations import DrainReply, DrainRequest, NodesQuery, NodesReply, StatusQuery, StatusReply
from schemas.roles import Role
from schemas.subjects import OPERATOR_DRAIN, QUERY_NODES, QUERY_STATUS
from services.runtime.bus import Bus, NoResponderError

__all__ = ["DrainPermissionError", "fetch_nodes", "fetch_status", "request_drain", "requester_of"]

_LEADER_POLL_S = 0.2
"""How often a request is asked again while no scheduler leads."""

R = TypeVar("R", bound=WireModel)


class DrainPermissionError(PermissionError):
    """The credentials are not an operator's: only operators drain and undrain nodes."""


def requester_of(bus: Bus) -> str:
    """Who ``bus`` asks as: its credentials' identity, else the local user (``Client``'s default)."""
    from roundhouse.client import default_identity

    return bus.identity or default_identity()


async def _ask_leader(bus: Bus, subject: str, query: Event, reply: type[R], timeout_s: float) -> R:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        left = deadline - loop.time()
        try:
            return await bus.request(subject, query, reply, timeout_s=max(left, 0.1))
        except NoResponderError:
            if loop.time() + _LEADER_POLL_S >= deadline:
                raise
        await asyncio.sleep(_LEADER_POLL_S)


async def fetch_nodes(bus: Bus, *, node_ids: Iterable[str] = (), timeout_s: float = 5.0) -> NodesReply:
    """The leader's nodes (only ``node_ids`` if given; those it does not know are in ``unknown``)."""
    query = NodesQuery(requester=requester_of(bus), node_ids=list(node_ids))
    return await _ask_leader(bus, QUERY_NODES, query, NodesReply, timeout_s)


async def fetch_status(bus: Bus, *, timeout_s: float = 5.0) -> StatusReply:
    """The leader, its epoch, each service's instances and policy, the last round and the queue."""
    query = StatusQuery(requester=requester_of(bus))
    return await _ask_leader(bus, QUERY_STATUS, query, StatusReply, timeout_s)


async def request_drain(
    bus: Bus, node_id: str, *, drain: bool = True, now: bool = False, reason: str | None = None,
    timeout_s: float = 10.0,
) -> DrainReply:  # fmt: skip
    """Drain ``node_id`` (``now``: also preempt its jobs, which checkpoint and queue again) or, with
    ``drain=False``, undrain it. Raises :class:`DrainPermissionError` for credentials of another role
    than operator, ``RemoteError`` when the scheduler refuses (unknown node, not an operator)."""
    credentials = bus.credentials
    if credentials is not None and credentials.role is not Role.OPERATOR:
        verb = "drain" if drain else "undrain"
        raise DrainPermissionError(
            f"permission denied: {credentials.identity} is a {credentials.role.value}; only operators may {verb} "
            "nodes (where roundhouse up runs: --creds .roundhouse/auth/operator/operator.creds)"
        )
    request = DrainRequest(requester=requester_of(bus), node_id=node_id, drain=drain, now=now, reason=reason)
    return await _ask_leader(bus, OPERATOR_DRAIN, request, DrainReply, timeout_s)
