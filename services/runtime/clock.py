"""The clock a service reads and waits on, passed in so that tests can drive time.

Two readings, as the standard library has them: wall time (:meth:`Clock.time`, seconds since the
Unix epoch: timestamps on the wire, revoke deadlines, the age of a fact) and monotonic time
(:meth:`Clock.monotonic`: liveness and timers, never goes back). :meth:`Clock.sleep` and
:meth:`Clock.wait_for` wait on the same clock. :data:`SYSTEM_CLOCK` is the real one, the default
everywhere; a test passes a fake that it advances by hand (``tests/fake_clock.py``, after the
``FakeClock`` of Kubernetes' ``k8s.io/utils/clock/testing``), so a TTL or a round cadence is
checked without sleeping through it.

What a clock does *not* time, on purpose: how long work took (``time.perf_counter`` and
``time.process_time``: a round's timings report what the process really spent), and pacing against
the outside world (request timeouts, retry back-offs, the leader key's renewals against the broker's
TTL), which runs on the broker's and the network's real time whatever a test pretends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Final, Protocol, TypeVar

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock"]

T = TypeVar("T")


class Clock(Protocol):
    """Where a service reads the time and waits for it to pass."""

    def time(self) -> float:
        """Wall-clock seconds since the Unix epoch (may jump; compare with other hosts' ``ts``)."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin that never go back (durations, liveness, timers)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` have passed on this clock (at once for ``seconds <= 0``)."""
        ...

    async def wait_for(self, aw: Awaitable[T], timeout_s: float | None) -> T:
        """``aw``'s result, or ``TimeoutError`` (``aw`` cancelled) once ``timeout_s`` seconds have
        passed on this clock; ``None`` waits as long as it takes (as ``asyncio.wait_for``)."""
        ...


class SystemClock:
    """The real clock: ``time.time``, ``time.monotonic`` and the event loop's timers."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait_for(self, aw: Awaitable[T], timeout_s: float | None) -> T:
        return await asyncio.wait_for(aw, timeout_s)


SYSTEM_CLOCK: Final[Clock] = SystemClock()
"""The clock every service uses unless it is given another."""
