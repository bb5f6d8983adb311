"""The scheduler's pure parts, without NATS: the book's transitions, plan validation, GPU naming.

(Kept beside the scheduler's integration tests; nothing here touches a broker or a database.)
"""

from __future__ import annotations

import uuid

import pytest

from schemas.job import JobSpec
from schemas.leases import RevokeReason
from schemas.nodes import GpuInventory, NodeRegister
from schemas.rounds import NodeGpus, PlacementPlan
from services.core.state import JobStatus
from services.runtime.store import LeaseState, UpdateJob, UpsertLeases
from services.scheduler.book import Change, JobBook, JobNotArrivedError
from services.scheduler.inventory import Inventory
from services.scheduler.leases import Lease, leases_from_records, row_id, split_row_id
from services.scheduler.rounds import validate_plan
from services.scheduler.topology import Topology, UnknownGpuError


def spec(gpus: int = 1, max_gpus: int | None = None) -> JobSpec:
    return JobSpec(name="j", command=["x"], gpus=gpus, max_gpus=max_gpus, grace_period_s=10)


def commit(change: Change | None) -> Change:
    assert change is not None
    change.commit()
    return change


def status_of(book: JobBook, job_id: str) -> JobStatus:
    return book.jobs[job_id].state.status


def queued(book: JobBook, job_id: str, gpus: int = 1, now: float = 100.0) -> None:
    commit(book.arrived(job_id, spec(gpus), submit_time=now - 10))
    commit(book.accepted(job_id, now))


def running(book: JobBook, job_id: str, parts: tuple[tuple[str, tuple[int, ...]], ...], now: float = 200.0) -> Lease:
    queued(book, job_id, sum(len(g) for _, g in parts))
    lease = Lease(f"L{job_id}", job_id, parts, epoch=7, granted_at=now)
    commit(book.grant(job_id, lease, now))
    return lease


def inventory(*nodes: tuple[str, int]) -> Inventory:
    inv = Inventory(lease_ttl_s=30)
    for node_id, gpus in nodes:
        inv.register(NodeRegister(
            node_id=node_id, incarnation=uuid.uuid4(), hostname="h", cpus=8, memory_gb=64,
            gpus=[GpuInventory(index=i, uuid=f"G-{node_id}-{i}", name="G", memory_mib=1024) for i in range(gpus)],
        ), now=0.0)  # fmt: skip
    return inv


def test_attained_service_grows_with_gpus_times_running_time_and_is_folded_on_release() -> None:
    book = JobBook()
    lease = running(book, "a", (("n0", (0, 1)),), now=200.0)
    topo = Topology(inventory(("n0", 4)).live())
    book.refresh(260.0, topo)
    state = book.jobs["a"].state
    assert state.attained_service == pytest.approx(2 * 60.0)
    assert state.gpus == (0, 1)
    change = commit(book.release(lease.lease_id, 300.0, checkpoint="/c/a", iterations=5))
    assert change.released == [lease.lease_id]
    assert state.status is JobStatus.QUEUED
    assert state.attained_service == pytest.approx(2 * 100.0)
    assert state.executed_time == pytest.approx(100.0)
    assert (state.preemptions, state.queued_since, book.jobs["a"].checkpoint_path) == (1, 300.0, "/c/a")
    assert "a" in book.active
    assert not book.leases
    assert not book.by_node


def test_changes_touch_memory_only_when_committed_and_name_the_versions_they_read() -> None:
    book = JobBook()
    queued(book, "a")
    version = book.jobs["a"].version
    lease = Lease("La", "a", (("n0", (0,)),), epoch=1, granted_at=1.0)
    change = book.grant("a", lease, 150.0)
    assert change is not None
    assert status_of(book, "a") is JobStatus.QUEUED  # not yet committed
    updates = [op for op in change.ops if isinstance(op, UpdateJob)]
    assert [u.expected_version for u in updates] == [version]
    assert [type(op) for op in change.ops] == [UpsertLeases, UpdateJob]
    change.commit()
    assert status_of(book, "a") is JobStatus.RUNNING
    assert book.jobs["a"].version == version + 1


def test_merged_grants_write_all_lease_rows_in_one_statement() -> None:
    book = JobBook()
    for j in ("a", "b", "c"):
        queued(book, j)
    changes = [book.grant(j, Lease(f"L{j}", j, (("n0", (i,)),), 1, 1.0), 150.0) for i, j in enumerate("abc")]
    merged = book.merge(changes)
    assert [type(op) for op in merged.ops] == [UpsertLeases, UpdateJob, UpdateJob, UpdateJob]


def test_cancel_ends_a_waiting_job_now_and_revokes_a_running_one() -> None:
    book = JobBook()
    queued(book, "w")
    lease = running(book, "r", (("n0", (0,)),))
    commit(book.end("w", JobStatus.CANCELLED, RevokeReason.CANCEL, now=300.0, grace_deadline=315.0))
    assert "w" not in book.jobs
    change = commit(book.end("r", JobStatus.CANCELLED, RevokeReason.CANCEL, now=300.0, grace_deadline=315.0))
    assert [(lz.lease_id, reason) for lz, reason in change.revokes] == [(lease.lease_id, RevokeReason.CANCEL)]
    assert lease.state is LeaseState.REVOKING
    assert lease.revoke_deadline == 315.0
    assert "r" not in book.active  # GPUs still held, but no longer the policy's to place
    commit(book.release(lease.lease_id, 305.0))
    assert "r" not in book.jobs  # CANCELLED, finished once the lease is gone


def test_an_acceptance_before_the_arrival_is_retried() -> None:
    with pytest.raises(JobNotArrivedError):
        JobBook().accepted("ghost", 1.0)


def test_lease_rows_round_trip_through_their_ids() -> None:
    lease = Lease("Labc", "j", (("n1", (2, 3)), ("n0", (0,))), epoch=3, granted_at=5.0)
    rows = lease.records()
    assert [r.lease_id for r in rows] == [row_id("Labc", 0), row_id("Labc", 1)]
    assert split_row_id(rows[1].lease_id) == ("Labc", 1)
    (back,) = leases_from_records(reversed(rows))
    assert back.parts == lease.parts
    assert back.coordinator == "n1"


def test_topology_maps_local_and_global_ids_both_ways() -> None:
    topo = Topology(inventory(("b", 2), ("a", 3)).live())
    assert topo.total_gpus == 5
    assert topo.to_global("a", (2,)) == (2,)  # nodes in id order: a's GPUs first
    assert topo.to_global("b", (0, 1)) == (3, 4)
    assert topo.to_local((4, 0, 3)) == [("b", (1, 0)), ("a", (0,))]
    with pytest.raises(UnknownGpuError, match="no GPU 7"):
        topo.to_global("a", (7,))
    with pytest.raises(UnknownGpuError, match="not live"):
        topo.to_global("zz", (0,))


def plan(**fields: object) -> PlacementPlan:
    return PlacementPlan(round=1, state_version=1, epoch=7, **fields)


@pytest.mark.parametrize(
    ("launch", "suspend", "kept", "why"),
    [
        pytest.param({"w": [NodeGpus(node_id="n0", gpus=[1])]}, [], ["w"], "", id="free-gpu"),
        pytest.param({"w": [NodeGpus(node_id="n0", gpus=[0])]}, [], [], "not free", id="busy-gpu"),
        pytest.param({"w": [NodeGpus(node_id="n0", gpus=[0])]}, ["r"], ["w"], "", id="freed-by-suspension"),
        pytest.param({"w": [NodeGpus(node_id="n0", gpus=[9])]}, [], [], "no GPU 9", id="no-such-gpu"),
        pytest.param({"w": [NodeGpus(node_id="n9", gpus=[0])]}, [], [], "not live", id="unknown-node"),
        pytest.param({"w": [NodeGpus(node_id="n0", gpus=[1, 2])]}, [], [], "2 GPUs", id="wrong-count"),
        pytest.param({"r": [NodeGpus(node_id="n0", gpus=[1])]}, [], [], "not waiting", id="already-running"),
        pytest.param({"r": [NodeGpus(node_id="n0", gpus=[1])]}, ["r"], ["r"], "", id="migration"),
        pytest.param({"w": [NodeGpus(node_id="n0", gpus=[1])], "w2": [NodeGpus(node_id="n0", gpus=[1])]}, [], ["w"],
                     "not free", id="claimed-twice"),
    ],
)  # fmt: skip
def test_only_the_valid_parts_of_a_plan_are_kept(
    launch: dict[str, list[NodeGpus]], suspend: list[str], kept: list[str], why: str
) -> None:
    book = JobBook()
    running(book, "r", (("n0", (0,)),))
    queued(book, "w")
    queued(book, "w2")
    valid = validate_plan(plan(launch=launch, suspend=suspend), book, inventory(("n0", 4)), {})
    assert list(valid.launch) == kept
    assert valid.suspend == suspend
    assert all(why in d for d in valid.dropped)
    assert bool(valid.dropped) == bool(why)


@pytest.mark.parametrize(
    ("launch", "kept_launch", "kept_suspend", "why"),
    [
        # r was suspended to make room for w on its GPU; w then started elsewhere (a fill round):
        # w's launch is dropped, and so is r's suspension, instead of preempting r for nothing.
        pytest.param({"w": [NodeGpus(node_id="n0", gpus=[0])]}, [], [], "made room for w", id="room-for-nobody"),
        pytest.param({"x": [NodeGpus(node_id="n0", gpus=[0])]}, [], [], "made room for x", id="launch-unknown"),
        pytest.param({"w2": [NodeGpus(node_id="n0", gpus=[0])]}, ["w2"], ["r"], "", id="room-for-a-valid-launch"),
        pytest.param({"w2": [NodeGpus(node_id="n0", gpus=[1])]}, ["w2"], ["r"], "", id="serves-no-launch"),
        pytest.param({}, [], ["r"], "", id="policy-suspends-alone"),
    ],
)  # fmt: skip
def test_a_suspension_made_for_a_launch_is_executed_only_with_it(
    launch: dict[str, list[NodeGpus]], kept_launch: list[str], kept_suspend: list[str], why: str
) -> None:
    book = JobBook()
    running(book, "r", (("n0", (0,)),))
    running(book, "w", (("n0", (3,)),))
    queued(book, "w2")
    valid = validate_plan(plan(launch=launch, suspend=["r"]), book, inventory(("n0", 4)), {})
    assert list(valid.launch) == kept_launch
    assert valid.suspend == kept_suspend
    assert any(why in d for d in valid.dropped) if why else not any("suspend" in d for d in valid.dropped)


def test_a_dead_node_is_not_live_until_it_speaks_again() -> None:
    inv = inventory(("n0", 1))
    node = inv.get("n0")
    assert node is not None
    assert inv.sweep(29.0) == []
    assert inv.sweep(30.0) == ["n0"]
    assert not inv.is_live("n0")
    assert inv.heartbeat("n0", uuid.UUID(node.incarnation), False, 31.0)
    assert inv.is_live("n0")
    assert not inv.heartbeat("n0", uuid.uuid4(), False, 32.0)  # another incarnation: re-register first
    restored = Inventory(30)
    restored.loads(inv.dumps(), now=100.0)
    assert [n.node_id for n in restored.live()] == ["n0"]
    assert restored.sweep(129.0) == []  # a fresh TTL from the load
