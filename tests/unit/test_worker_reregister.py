"""The agent's answer to the leader's ask to register again (issue 18): its ``node.register``, for
an ask of an epoch not older than it has accepted, at most once per few seconds."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from schemas.base import Event
from schemas.nodes import NodeRegister, NodeReregister, ReregisterReason
from schemas.subjects import NODE_REGISTER
from services.runtime.bus import Bus
from services.worker import service as worker_service
from services.worker.config import WorkerConfig
from services.worker.service import WorkerService


class RecordingBus:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Event]] = []

    async def publish(self, subject: str, event: Event) -> None:
        self.sent.append((subject, event))


def agent(tmp_path: Path) -> tuple[WorkerService, RecordingBus]:
    """An agent not started: its handler publishes on a :class:`RecordingBus`."""
    service = WorkerService(WorkerConfig(node_id="node-a", fake_gpus=1, work_dir=str(tmp_path / "w")))
    bus = RecordingBus()
    service._bus = cast(Bus, bus)
    return service, bus


def registers(bus: RecordingBus) -> list[NodeRegister]:
    return [event for subject, event in bus.sent if subject == NODE_REGISTER and isinstance(event, NodeRegister)]


def ask(epoch: int, node_id: str = "node-a") -> NodeReregister:
    return NodeReregister(epoch=epoch, node_id=node_id, reason=ReregisterReason.UNKNOWN_NODE)


async def test_registers_its_current_incarnation_at_most_once_per_interval(tmp_path: Path) -> None:
    service, bus = agent(tmp_path)
    await service._on_reregister(ask(3))
    await service._on_reregister(ask(3))  # a duplicate, or the next heartbeat's ask: bounded
    sent = registers(bus)
    assert [(r.node_id, r.incarnation) for r in sent] == [("node-a", service.incarnation)]
    service._reregistered_at -= worker_service._REREGISTER_MIN_INTERVAL_S  # as if that much time passed
    await service._on_reregister(ask(3))
    assert len(registers(bus)) == 2
    assert service.counters["reregistered"] == 2


async def test_an_ask_of_an_older_epoch_is_ignored_and_moves_no_fence(tmp_path: Path) -> None:
    service, bus = agent(tmp_path)
    service.table.fence.advance(5)
    await service._on_reregister(ask(4))  # a deposed leader's
    assert registers(bus) == []
    assert service.counters["stale_epoch"] == 1
    await service._on_reregister(ask(2**40))  # forged: answered (harmless), but the fence stays
    assert len(registers(bus)) == 1
    assert service.table.fence.seen == 5
