"""Which nodes take new work (issue 15, item 4): a live node heard from within ``silent_s`` that
does not drain. Silence withholds a node long before the lease TTL declares it dead."""

from __future__ import annotations

import pytest

from services.scheduler.config import SchedulerConfig
from services.scheduler.inventory import Inventory
from tests.helpers import fake_node

TTL = 30.0
SILENT = 6.0


@pytest.mark.parametrize(
    ("spoke_at", "draining", "now", "takes"),
    [
        pytest.param(0.0, False, 5.9, True, id="heard-from-recently"),
        pytest.param(0.0, False, SILENT, False, id="silent-past-silent-s-while-live"),
        pytest.param(10.0, False, 10.0 + SILENT - 0.1, True, id="a-heartbeat-restarts-the-silence"),
        pytest.param(0.0, True, 1.0, False, id="draining-or-departing"),
        pytest.param(0.0, False, TTL, False, id="dead"),
    ],
)
def test_a_node_takes_work_only_while_it_speaks_and_does_not_drain(
    spoke_at: float, draining: bool, now: float, takes: bool
) -> None:
    inventory = Inventory(lease_ttl_s=TTL, silent_s=SILENT)
    register = fake_node("n0", 2)
    inventory.register(register, 0.0)
    if spoke_at or draining:
        assert inventory.heartbeat("n0", register.incarnation, draining, spoke_at)
    inventory.sweep(now)
    node = inventory.get("n0")
    assert node is not None
    assert inventory.takes_work(node, now) is takes
    assert inventory.is_live("n0") is (now - spoke_at < TTL)  # silence alone releases nothing


@pytest.mark.parametrize(
    ("settings", "silent_after"),
    [
        pytest.param({}, 15.0, id="default-half-the-ttl"),
        pytest.param({"lease_ttl_s": 8.0}, 4.0, id="follows-the-ttl"),
        pytest.param({"node_silent_s": 3.0}, 3.0, id="set"),
    ],
)
def test_silence_threshold(settings: dict[str, float], silent_after: float) -> None:
    assert SchedulerConfig(**settings).silent_after_s == silent_after  # type: ignore[arg-type]
