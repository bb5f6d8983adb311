"""The scheduler's round timer: churn is debounced, and churn rounds keep a gap proportional to the
last round's cost so a submission burst does not re-rank a growing queue every few milliseconds."""

from __future__ import annotations

import time

from schemas.rounds import RoundTrigger
from services.core.protocols import Trigger
from services.scheduler.rounds import CHURN_GAP_FACTOR, RoundTimer


async def test_churn_rounds_wait_a_multiple_of_the_last_rounds_duration() -> None:
    timer = RoundTimer(3600.0, Trigger.CHURN, debounce_s=0.01)
    timer.ran(0.05)
    timer.churn(RoundTrigger.ARRIVAL)
    began = time.monotonic()
    assert await timer.next() is RoundTrigger.ARRIVAL
    assert time.monotonic() - began >= CHURN_GAP_FACTOR * 0.05 - 0.02


async def test_manual_and_node_rounds_do_not_wait_for_the_gap() -> None:
    timer = RoundTimer(3600.0, Trigger.CHURN, debounce_s=0.01)
    timer.ran(10.0)
    for trigger in (RoundTrigger.NODE_CHANGE, RoundTrigger.MANUAL):
        if trigger is RoundTrigger.MANUAL:
            timer.soon()
        else:
            timer.churn(trigger)
        began = time.monotonic()
        assert await timer.next() is trigger
        assert time.monotonic() - began < 1.0


async def test_a_policy_without_churn_triggers_ignores_arrivals() -> None:
    timer = RoundTimer(0.2, Trigger.TIMER, debounce_s=0.01)
    timer.churn(RoundTrigger.ARRIVAL)
    assert await timer.next() is RoundTrigger.TIMER  # the first tick (due at once), not the arrival
