"""The scheduler's TTL sweep on a fake clock: a silent node's lease is released exactly when
``lease_ttl_s`` has passed since the node last spoke, not a tick before. The real parts (the
sweeper's loop, the book, the inventory, the SQLite store); no broker, no sleeping through the TTL.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import cast

from schemas.job import JobSpec
from schemas.nodes import HeldLease, NodeHeartbeat
from services.core.protocols import Trigger
from services.core.state import JobStatus
from services.runtime.bus import Bus
from services.runtime.store import Store
from services.scheduler.config import SchedulerConfig
from services.scheduler.execution import Execution
from services.scheduler.executor import LeaseExecutor
from services.scheduler.leases import Lease
from services.scheduler.nodes import NodeFacts
from services.scheduler.replica import Replica
from services.scheduler.rounds import RoundTimer
from services.scheduler.term import Term
from tests.fake_clock import FakeClock, settle
from tests.helpers import eventually, fake_node

TTL = 30.0


async def test_a_silent_nodes_lease_is_released_when_the_lease_ttl_has_passed(tmp_path: Path) -> None:
    clock = FakeClock()
    config = SchedulerConfig(db=str(tmp_path / "db"), lease_ttl_s=TTL)
    replica = Replica(config, clock)
    replica.store = store = await Store.open(config.db)
    nodes = NodeFacts(replica, Execution(replica))
    incarnation = uuid.uuid4()
    term: Term | None = None
    try:
        await nodes.on_register(fake_node("n0", 1, incarnation=incarnation))
        book = replica.book
        async with replica.lock:
            await replica.commit(book.arrived("j", JobSpec(name="j", command=["x"]), clock.time()))
            await replica.commit(book.accepted("j", clock.time()))
            await replica.commit(book.grant("j", Lease("L1", "j", (("n0", (0,)),), 1, clock.time()), clock.time()))
        executor = LeaseExecutor(  # sends nothing here: no revoke is due
            cast(Bus, None), epoch=1, is_current=lambda _: True, request_timeout_s=1.0, grant_attempts=1,
            max_parallel=1, hostname=str, clock=clock,
        )  # fmt: skip
        term = replica.term = Term(1, executor, RoundTimer(3600.0, Trigger.TIMER, 0.1, clock=clock))
        term.spawn(nodes.sweep_loop(term), "sweep")

        async def tick(seconds: int) -> None:
            for _ in range(seconds):  # the sweeper runs every second of the clock
                clock.advance(1.0)
                await settle()

        await tick(20)
        await nodes.on_heartbeat(
            NodeHeartbeat(
                node_id="n0", incarnation=incarnation, seq=1, epoch_seen=1,
                leases=[HeldLease(lease_id="L1", job_id="j", epoch=1, gpus=[0])],
            )
        )  # fmt: skip
        await tick(int(TTL) - 1)  # 29 s since the heartbeat
        assert "L1" in book.leases
        assert replica.inventory.is_live("n0")
        await tick(1)  # 30 s: the node is dead, its worker has suspended the job by now
        assert not replica.inventory.is_live("n0")
        await eventually(lambda: "L1" not in book.leases, what="the dead node's lease released")
        entry = book.entry("j")
        assert entry is not None
        assert entry.state.status is JobStatus.QUEUED
        record = await store.get_job("j")
        assert record is not None
        assert record.status is JobStatus.QUEUED
    finally:
        if term is not None:
            replica.term = None
            for task in list(term.tasks):
                task.cancel()
            await settle()
        await store.close()
