"""The round timer on a fake clock: its cadence, the churn gap and the debounce are checked at their
exact edges, without sleeping (``tests/fake_clock.py``; the same timer the service runs)."""

from __future__ import annotations

import asyncio

from schemas.rounds import RoundTrigger
from services.core.protocols import Trigger
from services.scheduler.rounds import CHURN_GAP_FACTOR, RoundCue, RoundTimer
from tests.fake_clock import FakeClock, settle


async def cue_after(clock: FakeClock, timer: RoundTimer, before: float, edge: float) -> RoundCue:
    """The next cue, which must not come ``before`` seconds of the clock and must come ``edge`` later."""
    cue = asyncio.ensure_future(timer.next_cue())
    await settle()
    clock.advance(before)
    await settle()
    assert not cue.done(), f"a cue came {clock.elapsed} s in, before its time"
    clock.advance(edge)
    return await asyncio.wait_for(cue, 1.0)


async def test_ticks_keep_a_fixed_cadence_and_skip_those_missed() -> None:
    clock = FakeClock()
    timer = RoundTimer(300.0, Trigger.TIMER, debounce_s=0.5, clock=clock)
    assert await timer.next_cue() == RoundCue(RoundTrigger.TIMER)  # the first tick is due at once
    assert await cue_after(clock, timer, 299.5, 0.5) == RoundCue(RoundTrigger.TIMER)  # at 300
    clock.advance(700.0)  # a round ran long, to 1000: the ticks at 600 and 900 are missed
    assert await timer.next_cue() == RoundCue(RoundTrigger.TIMER)  # one tick now, not two
    assert await cue_after(clock, timer, 199.5, 0.5) == RoundCue(RoundTrigger.TIMER)  # at 1200: on the cadence
    assert clock.elapsed == 1200.0


async def test_churn_waits_the_gap_after_the_last_round_then_the_debounce_only() -> None:
    clock = FakeClock()
    timer = RoundTimer(3600.0, Trigger.CHURN, debounce_s=0.5, clock=clock)
    timer.ran(5.0)  # a 5 s round just ended: churn rounds wait CHURN_GAP_FACTOR times that
    gap = CHURN_GAP_FACTOR * 5.0
    timer.churn(RoundTrigger.ARRIVAL)
    assert await cue_after(clock, timer, gap - 0.5, 0.5) == RoundCue(RoundTrigger.ARRIVAL)
    timer.churn(RoundTrigger.COMPLETION)  # the gap has passed: the debounce alone
    assert await cue_after(clock, timer, 0.25, 0.25) == RoundCue(RoundTrigger.COMPLETION)


async def test_a_node_change_does_not_wait_for_the_gap() -> None:
    clock = FakeClock()
    timer = RoundTimer(3600.0, Trigger.CHURN, debounce_s=0.5, clock=clock)
    timer.ran(60.0)
    timer.churn(RoundTrigger.NODE_CHANGE)
    assert await cue_after(clock, timer, 0.25, 0.25) == RoundCue(RoundTrigger.NODE_CHANGE)


async def test_fill_churn_between_ticks_is_a_fill_round_and_the_tick_keeps_its_time() -> None:
    clock = FakeClock()
    timer = RoundTimer(300.0, Trigger.TIMER, debounce_s=0.5, fill=True, clock=clock)
    await timer.next_cue()
    clock.advance(100.0)
    timer.churn(RoundTrigger.ARRIVAL)  # LAS-like: the policy ignores arrivals, a fill round fills free GPUs
    assert await cue_after(clock, timer, 0.25, 0.25) == RoundCue(RoundTrigger.ARRIVAL, fill_only=True)
    assert await cue_after(clock, timer, 199.0, 0.5) == RoundCue(RoundTrigger.TIMER)  # still at 300
