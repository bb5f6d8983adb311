"""A clock a test advances by hand (``services.runtime.clock.Clock``), after the ``FakeClock`` of
Kubernetes' ``k8s.io/utils/clock/testing``: time stands still until :meth:`FakeClock.advance`
moves it, and every ``sleep`` (or ``wait_for`` timeout) due by then wakes, in deadline order.

So a TTL, a debounce or a round cadence is checked at its exact edge without sleeping through it:
``advance(29.9)`` and nothing happened, ``advance(0.1)`` and it did.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class FakeClock:
    """Wall and monotonic time that move only when told to; one ``advance`` moves both."""

    def __init__(self, *, wall: float = 1_800_000_000.0, monotonic: float = 1_000.0) -> None:
        self._wall0 = wall
        self._mono0 = monotonic
        self.elapsed = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def time(self) -> float:
        return self._wall0 + self.elapsed

    def monotonic(self) -> float:
        return self._mono0 + self.elapsed

    @property
    def sleepers(self) -> int:
        """How many sleeps are waiting for the clock to move."""
        return sum(1 for _, _, f in self._sleepers if not f.done())

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.elapsed + seconds, next(self._seq), wake))
        await wake

    async def wait_for(self, aw: Awaitable[T], timeout_s: float | None) -> T:
        if timeout_s is None:
            return await aw
        work = asyncio.ensure_future(aw)
        timer = asyncio.ensure_future(self.sleep(timeout_s))
        try:
            await asyncio.wait({work, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
        if work.done():
            return work.result()
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        raise TimeoutError

    def advance(self, seconds: float) -> None:
        """Move time on by ``seconds`` and wake every sleep due by then (they run at the next await)."""
        self.elapsed += seconds
        while self._sleepers and self._sleepers[0][0] <= self.elapsed:
            _, _, wake = heapq.heappop(self._sleepers)
            if not wake.done():
                wake.set_result(None)


async def settle(rounds: int = 20) -> None:
    """Let every task that can run without time passing run (a few passes of the event loop)."""
    for _ in range(rounds):
        await asyncio.sleep(0)
