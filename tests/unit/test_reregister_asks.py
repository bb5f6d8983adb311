"""The leader's asks to register again (issue 18): at most one per node per ``reconcile_grace_s``,
whatever the heartbeats, including the late ones of an old incarnation."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

from schemas.base import Event
from schemas.nodes import NodeHeartbeat, NodeReregister, ReregisterReason
from services.core.protocols import Trigger
from services.runtime.bus import Bus
from services.runtime.store import Store
from services.scheduler.config import SchedulerConfig
from services.scheduler.execution import Execution
from services.scheduler.executor import LeaseExecutor
from services.scheduler.nodes import NodeFacts
from services.scheduler.replica import Replica
from services.scheduler.reregister import MAX_REMEMBERED, MIN_INTERVAL_S, ReregisterLimiter
from services.scheduler.rounds import RoundTimer
from services.scheduler.term import Term
from tests.fake_clock import FakeClock
from tests.helpers import fake_node

GRACE = 5.0
EPOCH = 4


def test_one_ask_per_node_per_interval() -> None:
    limiter = ReregisterLimiter(GRACE)
    assert limiter.allow("a", 100.0)
    assert not limiter.allow("a", 100.2)
    assert not limiter.allow("a", 104.9)
    assert limiter.allow("b", 100.2)  # per node
    assert limiter.allow("a", 105.0)
    assert not limiter.allow("a", 105.1)


def test_an_interval_of_zero_still_limits() -> None:
    limiter = ReregisterLimiter(0.0)
    assert limiter.interval_s == MIN_INTERVAL_S
    assert limiter.allow("a", 0.0)
    assert not limiter.allow("a", MIN_INTERVAL_S / 2)


def test_memory_is_bounded_by_forgetting_expired_asks() -> None:
    limiter = ReregisterLimiter(GRACE)
    for i in range(MAX_REMEMBERED):
        assert limiter.allow(f"n{i}", 0.0)
    assert len(limiter) == MAX_REMEMBERED
    assert limiter.allow("late", GRACE + 1)  # the old asks expired: forgotten
    assert len(limiter) == 1
    assert not limiter.allow("late", GRACE + 2)


class RecordingBus:
    """Stands in for the bus: records what the leader publishes."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Event]] = []

    def name(self, consumer: str) -> str:
        return consumer

    async def publish(self, subject: str, event: Event) -> None:
        self.sent.append((subject, event))


def beat(node_id: str, incarnation: uuid.UUID, seq: int) -> NodeHeartbeat:
    return NodeHeartbeat(node_id=node_id, incarnation=incarnation, seq=seq, epoch_seen=EPOCH)


@asynccontextmanager
async def leader(tmp_path: Path, clock: FakeClock) -> AsyncIterator[tuple[NodeFacts, RecordingBus, Replica]]:
    """A leading replica of epoch ``EPOCH`` on a fresh store, publishing on a :class:`RecordingBus`."""
    config = SchedulerConfig(db=str(tmp_path / "db"), reconcile_grace_s=GRACE)
    replica = Replica(config, clock)
    replica.store = store = await Store.open(config.db)
    bus = RecordingBus()
    replica.bus = cast(Bus, bus)
    executor = LeaseExecutor(
        cast(Bus, None), epoch=EPOCH, is_current=lambda _: True, request_timeout_s=1.0, grant_attempts=1,
        max_parallel=1, hostname=str, clock=clock,
    )  # fmt: skip
    replica.term = Term(EPOCH, executor, RoundTimer(3600.0, Trigger.TIMER, 0.1, clock=clock))
    try:
        yield NodeFacts(replica, Execution(replica)), bus, replica
    finally:
        replica.term = None
        await store.close()


def asks(bus: RecordingBus) -> list[Any]:
    return [(subject, event.reason) for subject, event in bus.sent if isinstance(event, NodeReregister)]


async def test_heartbeats_of_an_unknown_node_ask_it_once_per_grace(tmp_path: Path) -> None:
    clock = FakeClock()
    async with leader(tmp_path, clock) as (nodes, bus, _):
        incarnation = uuid.uuid4()
        for seq in range(20):  # four seconds of heartbeats every 0.2 s
            await nodes.on_heartbeat(beat("n0", incarnation, seq))
            clock.advance(0.2)
        assert asks(bus) == [("node.reregister.n0", ReregisterReason.UNKNOWN_NODE)]
        sent = bus.sent[0][1]
        assert isinstance(sent, NodeReregister)
        assert sent.epoch == EPOCH
        clock.advance(GRACE)
        await nodes.on_heartbeat(beat("n0", incarnation, 21))
        assert len(asks(bus)) == 2  # the first ask was lost: asked again after the grace

        # It registers: its heartbeats are applied and ask nothing.
        await nodes.on_register(fake_node("n0", 1, incarnation=incarnation))
        clock.advance(GRACE)
        for seq in range(22, 40):
            await nodes.on_heartbeat(beat("n0", incarnation, seq))
        assert len(asks(bus)) == 2
        assert nodes.reregisters_sent == 2


async def test_late_heartbeats_of_an_old_incarnation_do_not_start_a_storm(tmp_path: Path) -> None:
    clock = FakeClock()
    async with leader(tmp_path, clock) as (nodes, bus, _):
        await nodes.on_register(fake_node("n0", 1, incarnation=uuid.uuid4()))
        old = uuid.uuid4()
        for seq in range(50):
            await nodes.on_heartbeat(beat("n0", old, seq))
        assert asks(bus) == [("node.reregister.n0", ReregisterReason.OTHER_INCARNATION)]


async def test_a_follower_asks_nothing(tmp_path: Path) -> None:
    clock = FakeClock()
    async with leader(tmp_path, clock) as (nodes, bus, replica):
        replica.term = None
        await nodes.on_heartbeat(beat("n0", uuid.uuid4(), 1))
        assert bus.sent == []
