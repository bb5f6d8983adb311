"""Fill rounds: churn a timer-only policy ignores still starts a round, but one that may only fill
free GPUs; churn the policy reacts to, a node change or a manual request makes it a full round."""

from __future__ import annotations

import asyncio

import pytest

from schemas.rounds import RoundTrigger
from services.core.protocols import Trigger
from services.scheduler.rounds import RoundCue, RoundTimer


async def first_tick_taken(timer: RoundTimer) -> None:
    """A timer's first tick is due at once; take it so the next cue is the churn under test."""
    assert await timer.next() is RoundTrigger.TIMER


@pytest.mark.parametrize("reason", [RoundTrigger.ARRIVAL, RoundTrigger.COMPLETION])
async def test_churn_the_policy_ignores_starts_a_fill_round(reason: RoundTrigger) -> None:
    timer = RoundTimer(3600.0, Trigger.TIMER, debounce_s=0.01, fill=True)
    await first_tick_taken(timer)
    timer.churn(reason)
    cue = await asyncio.wait_for(timer.next_cue(), 1.0)
    assert cue == RoundCue(reason, fill_only=True)


async def test_without_fill_the_churn_waits_for_the_tick() -> None:
    timer = RoundTimer(3600.0, Trigger.TIMER, debounce_s=0.01, fill=False)
    await first_tick_taken(timer)
    timer.churn(RoundTrigger.ARRIVAL)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(timer.next_cue(), 0.3)


async def test_churn_the_policy_reacts_to_is_a_full_round_even_with_fill() -> None:
    timer = RoundTimer(3600.0, Trigger.TIMER | Trigger.ARRIVAL, debounce_s=0.01, fill=True)
    await first_tick_taken(timer)
    timer.churn(RoundTrigger.ARRIVAL)
    assert await asyncio.wait_for(timer.next_cue(), 1.0) == RoundCue(RoundTrigger.ARRIVAL)


@pytest.mark.parametrize("upgrade", ["node_change", "manual", "wanted_churn"])
async def test_a_pending_fill_round_becomes_full_when_a_full_cue_follows(upgrade: str) -> None:
    timer = RoundTimer(3600.0, Trigger.TIMER | Trigger.ARRIVAL, debounce_s=0.05, fill=True)
    await first_tick_taken(timer)
    timer.churn(RoundTrigger.COMPLETION)  # the policy ignores completions: a fill round is pending
    if upgrade == "node_change":
        timer.churn(RoundTrigger.NODE_CHANGE)
        expected = RoundTrigger.NODE_CHANGE
    elif upgrade == "manual":
        timer.soon()
        expected = RoundTrigger.MANUAL
    else:
        timer.churn(RoundTrigger.ARRIVAL)
        expected = RoundTrigger.ARRIVAL
    assert await asyncio.wait_for(timer.next_cue(), 1.0) == RoundCue(expected, fill_only=False)


async def test_fill_churn_does_not_downgrade_a_pending_full_round() -> None:
    timer = RoundTimer(3600.0, Trigger.TIMER | Trigger.ARRIVAL, debounce_s=0.05, fill=True)
    await first_tick_taken(timer)
    timer.churn(RoundTrigger.ARRIVAL)
    timer.churn(RoundTrigger.COMPLETION)
    assert await asyncio.wait_for(timer.next_cue(), 1.0) == RoundCue(RoundTrigger.ARRIVAL, fill_only=False)


async def test_the_tick_is_always_a_full_round() -> None:
    timer = RoundTimer(0.2, Trigger.TIMER, debounce_s=0.01, fill=True)
    assert await timer.next_cue() == RoundCue(RoundTrigger.TIMER, fill_only=False)
