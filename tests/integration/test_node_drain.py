"""Operator drains, ``query.nodes`` and ``query.status`` against a real scheduler, placement service and
broker, with fake worker agents (issue 15, item 3).

A drained node takes no new work (the same path as a node whose agent leaves: withheld from the
round's snapshot); ``now`` also revokes its jobs through the two-phase revoke, so they checkpoint,
queue again and resume elsewhere from that checkpoint; the drain is in the store, so a new leader
keeps it; only operators may drain, and an unknown node is an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from schemas.base import Event, WireModel
from schemas.leases import RevokeReason
from schemas.operations import (
    DrainReply,
    DrainRequest,
    NodesQuery,
    NodesReply,
    NodeState,
    NodeView,
    StatusQuery,
    StatusReply,
)
from schemas.subjects import OPERATOR_DRAIN, QUERY_NODES, QUERY_STATUS
from services.runtime.broker import Broker
from services.runtime.bus import Bus, NoResponderError, RemoteError
from services.runtime.service import _announce
from services.scheduler.service import SchedulerService
from services.scheduler.trust import Refusal
from tests.fake_workers import FakeWorkers
from tests.integration.test_scheduler import Cluster, cluster, held_by_worker, running_jobs, spec, wait_for

R = TypeVar("R", bound=WireModel)


async def ask(bus: Bus, subject: str, request: Event, reply: type[R]) -> R:
    """``request`` to the leader; asked again while none serves it (a loaded host can cost a term)."""
    deadline = time.monotonic() + 10.0
    while True:
        try:
            return await bus.request(subject, request, reply, timeout_s=5.0)
        except NoResponderError:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.1)


async def drain(bus: Bus, node_id: str, *, requester: str = "operator", undo: bool = False,
                now: bool = False, reason: str | None = None) -> DrainReply:  # fmt: skip
    request = DrainRequest(requester=requester, node_id=node_id, drain=not undo, now=now, reason=reason)
    return await ask(bus, OPERATOR_DRAIN, request, DrainReply)


async def nodes(bus: Bus, requester: str = "operator") -> dict[str, NodeView]:
    reply = await ask(bus, QUERY_NODES, NodesQuery(requester=requester), NodesReply)
    return {view.node_id: view for view in reply.nodes}


@contextlib.asynccontextmanager
async def beating(workers: FakeWorkers) -> AsyncIterator[None]:
    """Heartbeats for every node every 0.1 s (a live node's agent)."""

    async def beat() -> None:
        while True:
            for node in sorted(workers.nodes):
                await workers.heartbeat(node)
            await asyncio.sleep(0.1)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def leader(c: Cluster, **settings: Any) -> SchedulerService:
    # A longer leader key than the harness's 1 s: a loaded test host must not depose the leader midway.
    s = await c.start_scheduler(policy="fifo", **{"leader_ttl_s": 5.0, **settings})
    await wait_for(lambda: s.is_leader and len(s.inventory) == len(c.workers.nodes), what="a leader with every node")
    return s


def waiting(s: SchedulerService, job_id: str) -> bool:
    entry = s.book.entry(job_id)
    return entry is not None and entry.state.is_waiting


async def test_a_drained_node_takes_no_new_work_until_undrained(broker: Broker, namespace: str, tmp_path: Path) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 2, "n1": 2})
        async with beating(workers):
            s = await leader(c)
            reply = await drain(c.client, "n1", reason="replace a fan")
            assert reply.draining
            assert reply.changed
            assert reply.preempted == []
            again = await drain(c.client, "n1")  # idempotent: nothing written, the first record kept
            assert again.draining
            assert not again.changed

            shown = await nodes(c.client)
            n1 = shown["n1"]
            assert n1.draining
            assert n1.drained_by == "operator"
            assert n1.drain_reason == "replace a fan"
            assert n1.state is NodeState.DRAINED
            assert not n1.takes_work
            assert shown["n0"].state is NodeState.IDLE
            assert shown["n0"].takes_work

            await c.submit("a", spec("a", 2))
            assert (await held_by_worker(workers, "a"))[0] == "n0"
            await c.submit("b", spec("b", 2))
            await wait_for(lambda: waiting(s, "b"), what="b waiting")
            for _ in range(2):  # rounds run; n1's two GPUs hold nothing, and still b waits
                await s.run_round()
            assert "b" not in running_jobs(s)
            why = (await c.query(job_ids=["b"])).jobs[0].reason or ""
            assert why.startswith("needs 2 GPUs, 0 of 4 free"), why
            shown = await nodes(c.client)
            assert shown["n0"].jobs == ["a"]
            assert shown["n0"].gpus_used == 2
            assert shown["n0"].state is NodeState.ALLOCATED

            undone = await drain(c.client, "n1", undo=True)
            assert not undone.draining
            assert undone.changed
            assert (await held_by_worker(workers, "b"))[0] == "n1"
            assert not (await nodes(c.client))["n1"].draining


async def test_drain_now_checkpoints_the_running_job_and_it_resumes_elsewhere(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 2, "n1": 2})
        async with beating(workers):
            s = await leader(c)
            await c.submit("a", spec("a", 2))
            node, lease = await held_by_worker(workers, "a")
            other = "n1" if node == "n0" else "n0"

            reply = await drain(c.client, node, now=True)
            assert reply.preempted == ["a"]
            assert reply.draining
            assert workers.revoke_reasons[lease] is RevokeReason.DRAIN  # the two-phase revoke, not a kill
            await wait_for(lambda: (found := workers.lease_of("a")) is not None and found[0] == other,
                           what="a running again on the other node")  # fmt: skip
            grant = workers.nodes[other].leases[workers.lease_of("a")[1]].grant  # type: ignore[index]
            assert str(grant.resume_from) == "/ckpt/a/10"
            assert grant.resume_iteration == 10
            entry = s.book.entry("a")
            assert entry is not None
            assert entry.state.preemptions == 1
            assert (await nodes(c.client))[node].state is NodeState.DRAINED


async def test_a_drain_survives_a_new_leader(broker: Broker, namespace: str, tmp_path: Path) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 1, "n1": 1})
        async with beating(workers):
            first = await leader(c)
            await drain(c.client, "n0", reason="maintenance")
            await c.stop_scheduler(first)

            s = await leader(c)
            node = s.inventory.get("n0")
            assert node is not None
            assert node.drain is not None
            assert node.drain.reason == "maintenance"
            await workers.register("n0", new_incarnation=True)  # the agent restarts: still drained
            await wait_for(lambda: (n := s.inventory.get("n0")) is not None and n.incarnation == str(
                workers.nodes["n0"].incarnation), what="n0's new incarnation registered")  # fmt: skip
            assert (await nodes(c.client))["n0"].drained_by == "operator"
            await c.submit("a", spec("a", 1))
            assert (await held_by_worker(workers, "a"))[0] == "n1"
            await c.submit("b", spec("b", 1))
            await wait_for(lambda: waiting(s, "b"), what="b waiting")
            await s.run_round()
            assert "b" not in running_jobs(s)


@pytest.mark.parametrize("undo", [False, True], ids=["drain", "undrain"])
async def test_only_an_operator_drains_and_an_unknown_node_is_an_error(
    broker: Broker, namespace: str, tmp_path: Path, undo: bool
) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 1})
        async with beating(workers):
            s = await leader(c)
            verb = "undrain" if undo else "drain"
            with pytest.raises(RemoteError, match=f"permission denied: alice is not an operator; only operators may "
                                                  f"{verb} nodes"):  # fmt: skip
                await drain(c.client, "n0", requester="alice", undo=undo)
            node = s.inventory.get("n0")
            assert node is not None
            assert node.drain is None
            assert s.replica.refusals.counts[f"operator.drain:{Refusal.PERMISSION_DENIED.value}"] == 1
            with pytest.raises(RemoteError, match=r"no such node: n9 \(known nodes: n0\)"):
                await drain(c.client, "n9", undo=undo)


async def test_nodes_hide_other_users_jobs_and_status_names_leader_services_and_queue(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 2})
        async with beating(workers):
            s = await leader(c)
            await c.submit("mine", spec("mine", 1).model_copy(update={"user": "alice"}))
            await c.submit("theirs", spec("theirs", 1).model_copy(update={"user": "bob"}))
            await c.submit("queued", spec("queued", 2).model_copy(update={"user": "bob"}))
            await held_by_worker(workers, "mine")
            await held_by_worker(workers, "theirs")
            await wait_for(lambda: waiting(s, "queued"), what="a job waiting")

            as_alice = (await nodes(c.client, requester="alice"))["n0"]
            assert as_alice.jobs == ["mine"]
            assert as_alice.other_jobs == 1
            as_operator = (await nodes(c.client))["n0"]
            assert as_operator.jobs == ["mine", "theirs"]
            assert as_operator.other_jobs == 0

            # What run_service does for each service process: announce it on the services API.
            _, bus, placement = c.replicas[0]
            assert placement is not None
            announced = [await _announce(bus, s), await _announce(bus, placement)]
            try:
                status = await ask(c.client, QUERY_STATUS, StatusQuery(requester="alice"), StatusReply)
            finally:
                for micro in announced:
                    await micro.stop()
            assert status.leader == "sched-0"
            assert status.epoch == s.epoch
            kinds = {service.kind: service for service in status.services}
            assert {"scheduler", "placement"} <= set(kinds), kinds
            me = [i for i in kinds["scheduler"].instances if i.leader]
            assert [i.instance for i in me] == ["sched-0"]
            assert me[0].uptime_s is not None  # its own answer was heard, not only filled in
            assert me[0].policy == "fifo"
            assert kinds["placement"].instances[0].policy == "consolidated"
            assert status.queue.queued == 1
            assert status.queue.running == 2
            assert status.queue.queued_gpus == 2
            assert status.nodes == 1
            assert status.gpus_total == 2
            assert status.gpus_used == 2
            assert status.round.rounds_run >= 1
            assert status.round.policy == "fifo"
            assert "rank" in status.round.phases_s
