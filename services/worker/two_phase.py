"""Two-phase preemption at iteration boundaries (DESIGN, Leases and preemption; Blox §7).

Phase one: the coordinator agent asks rank 0 to pause at its next boundary and reads the iteration
``i`` it paused after; ``stop_at = i + 1``. Phase two: ``stop_at`` reaches every other rank (other
nodes through ``lease.stop.<node>``, acked) *before* rank 0 is released into iteration ``i + 1``, so
no rank can have started ``i + 2``: a rank ahead of rank 0 blocks in iteration ``i + 1``'s collective
until rank 0 joins it. Every rank then finishes ``stop_at`` and stops, and rank 0's checkpoint is
consistent with every rank's state.

These functions only touch the local channels and processes; the service passes ``propagate`` (the
network part) in, so the protocol is testable without NATS.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from services.worker.channel import ClientStatus
from services.worker.leases import Lease

__all__ = ["Propagate", "coordinate_stop", "poll_until", "release_at", "wait_stopped"]

Propagate = Callable[[int], Awaitable[None]]
"""Sends ``stop_at`` to the lease's other nodes and returns once they all acked."""

_FIRST_POLL_S = 0.0005
_MAX_POLL_S = 0.02


async def poll_until(predicate: Callable[[], bool], deadline: float) -> bool:
    """Poll ``predicate`` (fast at first, backing off to 20 ms) until true or ``deadline`` (monotonic)."""
    delay = _FIRST_POLL_S
    while True:
        if predicate():
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        await asyncio.sleep(min(delay, remaining))
        delay = min(delay * 1.25, _MAX_POLL_S)


def _exited(lease: Lease) -> bool:
    return any(r.returncode is not None for r in lease.ranks)


async def coordinate_stop(lease: Lease, deadline: float, propagate: Propagate | None) -> int | None:
    """Run both phases for ``lease``'s local ranks; return ``stop_at``, or None when the leader did not
    pause before ``deadline`` or a process exited first (the caller then kills or just waits)."""
    leader = lease.ranks[0]
    leader.channel.request_stop()
    paused = await poll_until(lambda: leader.channel.paused_at is not None or _exited(lease), deadline)
    pause_iteration = leader.channel.paused_at
    if not paused or pause_iteration is None:
        return None
    stop_at = pause_iteration + 1
    if propagate is not None:
        await propagate(stop_at)
    release_at(lease, stop_at)
    return stop_at


def release_at(lease: Lease, stop_at: int) -> None:
    """Phase two on this node: every local rank finishes ``stop_at`` and stops (the leader last)."""
    lease.stop_at = stop_at
    for rank in reversed(lease.ranks):
        rank.channel.set_stop_at(stop_at)


def _done(lease: Lease) -> bool:
    return all(r.returncode is not None or r.channel.status is not ClientStatus.RUNNING for r in lease.ranks)


async def wait_stopped(lease: Lease, deadline: float) -> bool:
    """Wait until every local rank reported stopped/finished or exited; False if ``deadline`` came first."""
    return await poll_until(lambda: _done(lease), deadline)
