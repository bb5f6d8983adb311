"""Reconciliation rules as tables (``services/scheduler/reconcile.py``): what a heartbeat's lease
list, a ``job.started``, the sweep and a job's end imply, as pure functions of the state and ``now``;
and when a silent node counts as dead (``Inventory.sweep``, on the ``now`` passed in).

Times: a heartbeat at ``TS = 100`` with ``GRACE = 10`` s (so the cutoff is 90); the term's epoch is
``EPOCH = 5``; the lease TTL is 30 s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from schemas.nodes import HeldLease
from services.core.state import JobStatus
from services.scheduler.inventory import Inventory
from services.scheduler.leases import Lease
from services.scheduler.reconcile import (
    Finished,
    Started,
    fact_time,
    judge_finished,
    judge_started,
    reconcile_heartbeat,
    stray_lease,
    sweep_releases,
)
from tests.helpers import fake_node

TS = 100.0
GRACE = 10.0
EPOCH = 5
NOW = 1_000.0
TTL = 30.0


def lease(
    lease_id: str,
    job_id: str | None = None,
    *parts: tuple[str, tuple[int, ...]],
    granted_at: float = 0.0,
    deadline: float | None = None,
) -> Lease:
    """A held lease (``parts`` default: GPU 0 of ``n0``)."""
    return Lease(
        lease_id, job_id or f"job-{lease_id}", parts or (("n0", (0,)),), EPOCH, granted_at, revoke_deadline=deadline
    )


def listed(lease_id: str, epoch: int = EPOCH) -> HeldLease:
    """A lease as a node's heartbeat lists it."""
    return HeldLease(lease_id=lease_id, job_id=f"job-{lease_id}", epoch=epoch, gpus=[0])


def index(leases: list[Lease]) -> dict[str, set[str]]:
    by_node: dict[str, set[str]] = {}
    for held in leases:
        for node in held.nodes:
            by_node.setdefault(node, set()).add(held.lease_id)
    return by_node


# --- heartbeats ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Heartbeat:
    held: list[Lease]
    reported: list[HeldLease]
    missing: dict[str, float] = field(default_factory=dict)
    lost: tuple[str, ...] = ()
    strays: tuple[str, ...] = ()
    missing_after: dict[str, float] = field(default_factory=dict)


HEARTBEATS = [
    pytest.param(Heartbeat([lease("L1")], [listed("L1")]), id="listed-lease-nothing-to-do"),
    pytest.param(Heartbeat([lease("L1", granted_at=95.0)], []), id="granted-within-the-grace-not-yet-missing"),
    pytest.param(Heartbeat([lease("L1")], [], missing_after={"L1": TS}), id="first-omission-recorded-not-lost"),
    pytest.param(
        Heartbeat([lease("L1")], [], missing={"L1": 95.0}, missing_after={"L1": 95.0}),
        id="missing-for-less-than-the-grace-kept",
    ),
    pytest.param(
        Heartbeat([lease("L1")], [], missing={"L1": 90.0}, lost=("L1",), missing_after={"L1": 90.0}),
        id="missing-for-the-grace-lost",
    ),
    pytest.param(Heartbeat([lease("L1")], [listed("L1")], missing={"L1": 50.0}), id="listed-again-omission-forgotten"),
    pytest.param(Heartbeat([], [], missing={"gone": 50.0}), id="released-meanwhile-omission-forgotten"),
    pytest.param(
        Heartbeat([lease("L2", None, ("n1", (0,)))], [], missing={"L2": 95.0}, missing_after={"L2": 95.0}),
        id="another-nodes-omission-kept",
    ),
    pytest.param(Heartbeat([], [listed("X")], strays=("X",)), id="unknown-lease-of-this-epoch-revoked"),
    pytest.param(Heartbeat([], [listed("X", epoch=3)], strays=("X",)), id="unknown-lease-of-an-older-epoch-revoked"),
    pytest.param(Heartbeat([], [listed("X", epoch=6)]), id="newer-epoch-is-another-leaders-left-alone"),
    pytest.param(
        Heartbeat([lease("L2", None, ("n1", (0,)))], [listed("L2")], strays=("L2",)),
        id="a-lease-held-on-another-node-is-a-stray-here",
    ),
    pytest.param(
        Heartbeat(
            [lease("L1"), lease("L2", None, ("n0", (1,))), lease("L3", None, ("n0", (2,)), granted_at=99.0)],
            [listed("L2"), listed("X")],
            missing={"L1": 80.0},
            lost=("L1",),
            strays=("X",),
            missing_after={"L1": 80.0},
        ),
        id="mixed",
    ),
]


@pytest.mark.parametrize("case", HEARTBEATS)
def test_what_a_heartbeat_implies(case: Heartbeat) -> None:
    held = {h.lease_id: h for h in case.held}
    before = dict(case.missing)
    verdict = reconcile_heartbeat(
        "n0", case.reported, held, index(case.held).get("n0", set()), case.missing,
        ts=TS, grace_s=GRACE, epoch=EPOCH, now=NOW,
    )  # fmt: skip
    assert sorted(verdict.lost) == sorted(case.lost)
    assert [s.lease_id for s in verdict.strays] == list(case.strays)
    assert verdict.missing_since == case.missing_after
    assert case.missing == before  # a pure function: its inputs are left as they were


def test_a_stray_is_revoked_as_the_node_reports_it() -> None:
    verdict = reconcile_heartbeat(
        "n3", [HeldLease(lease_id="X", job_id="j", epoch=2, gpus=[1, 3])], {}, set(), {},
        ts=TS, grace_s=GRACE, epoch=EPOCH, now=NOW,
    )  # fmt: skip
    assert verdict.strays == (stray_lease("n3", lease_id="X", job_id="j", gpus=(1, 3), epoch=2, now=NOW),)
    (stray,) = verdict.strays
    assert (stray.coordinator, stray.parts, stray.epoch, stray.granted_at) == ("n3", (("n3", (1, 3)),), 2, NOW)


# --- job.started -----------------------------------------------------------------------------


@dataclass(frozen=True)
class StartedCase:
    held: Lease | None
    job_lease: Lease | None
    age: float
    expected: Started


STARTED = [
    pytest.param(StartedCase(lease("L1", "j"), lease("L1", "j"), 0.0, Started.OURS), id="our-lease-is-up"),
    pytest.param(StartedCase(lease("L1", "j"), lease("L1", "j"), 999.0, Started.OURS), id="our-lease-however-old"),
    pytest.param(StartedCase(None, None, 1.0, Started.STRAY), id="recent-lease-we-do-not-hold-revoked"),
    pytest.param(StartedCase(None, None, TTL, Started.STRAY), id="exactly-the-ttl-old-still-revoked"),
    pytest.param(StartedCase(None, None, TTL + 0.5, Started.IGNORED), id="older-than-the-ttl-is-history"),
    pytest.param(
        StartedCase(None, lease("L2", "j"), 1.0, Started.STRAY), id="job-runs-under-another-lease-stray-revoked"
    ),
    pytest.param(StartedCase(lease("L1", "k"), None, 1.0, Started.STRAY), id="lease-id-of-another-job-revoked"),
    pytest.param(StartedCase(None, lease("L1", "j"), 1.0, Started.IGNORED), id="the-jobs-own-lease-id-ignored"),
]


@pytest.mark.parametrize("case", STARTED)
def test_what_a_job_started_is(case: StartedCase) -> None:
    verdict = judge_started(
        "L1", "j", NOW - case.age, held=case.held, job_lease=case.job_lease, now=NOW, lease_ttl_s=TTL
    )
    assert verdict is case.expected


# --- the sweep -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepCase:
    held: list[Lease]
    dead_nodes: list[str]
    awaited: frozenset[str] = frozenset()
    dead: tuple[str, ...] = ()
    overdue: tuple[str, ...] = ()


SWEEPS = [
    pytest.param(SweepCase([lease("L1")], []), id="nothing-due"),
    pytest.param(
        SweepCase(
            [lease("L2"), lease("L1", None, ("n0", (1,))), lease("L3", None, ("n1", (0,)))], ["n0"], dead=("L1", "L2")
        ),
        id="a-dead-nodes-leases-released-in-id-order",
    ),
    pytest.param(
        SweepCase([lease("M", None, ("n0", (0,)), ("n1", (0,)))], ["n0", "n1"], dead=("M",)),
        id="a-multi-node-lease-on-two-dead-nodes-released-once",
    ),
    pytest.param(SweepCase([lease("L1", deadline=NOW - 1)], [], overdue=("L1",)), id="revoke-past-its-deadline"),
    pytest.param(SweepCase([lease("L1", deadline=NOW)], [], overdue=("L1",)), id="revoke-at-its-deadline"),
    pytest.param(SweepCase([lease("L1", deadline=NOW + 0.5)], []), id="revoke-before-its-deadline-kept"),
    pytest.param(
        SweepCase([lease("L1", deadline=NOW - 1)], [], awaited=frozenset({"L1"})),
        id="a-round-waits-for-it-and-releases-it-itself",
    ),
    pytest.param(
        SweepCase([lease("L1", deadline=NOW - 1)], ["n0"], dead=("L1",)), id="overdue-on-a-dead-node-released-once"
    ),
]


@pytest.mark.parametrize("case", SWEEPS)
def test_what_the_sweep_releases(case: SweepCase) -> None:
    held = {h.lease_id: h for h in case.held}
    verdict = sweep_releases(case.dead_nodes, held, index(case.held), now=NOW, awaited=case.awaited.__contains__)
    assert (verdict.dead, verdict.overdue) == (case.dead, case.overdue)
    assert verdict.released == case.dead + case.overdue


# --- a job's end -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "fact_lease", "job_lease", "expected"),
    [
        pytest.param(JobStatus.COMPLETED, "L1", "L1", Finished.RELEASE, id="completed-under-its-lease"),
        pytest.param(JobStatus.FAILED, "L1", "L1", Finished.RELEASE, id="failed-under-its-lease"),
        pytest.param(JobStatus.FAILED, None, "L1", Finished.RELEASE, id="naming-no-lease-ends-the-current-one"),
        pytest.param(JobStatus.COMPLETED, "L1", None, Finished.WITHOUT_LEASE, id="completed-after-its-lease-was-lost"),
        pytest.param(JobStatus.FAILED, None, None, Finished.WITHOUT_LEASE, id="failed-while-waiting"),
        pytest.param(JobStatus.COMPLETED, "L1", "L2", Finished.COMPLETED_EARLIER, id="completed-while-a-re-run-holds"),
        pytest.param(JobStatus.FAILED, "L1", "L2", Finished.IGNORED, id="an-earlier-runs-failure-ignored"),
    ],
)
def test_what_a_jobs_end_is(
    status: JobStatus, fact_lease: str | None, job_lease: str | None, expected: Finished
) -> None:
    assert judge_finished(status, fact_lease, job_lease) is expected


@pytest.mark.parametrize(
    ("ts", "start", "expected"),
    [
        pytest.param(50.0, 10.0, 50.0, id="within-the-run"),
        pytest.param(5.0, 10.0, 10.0, id="before-the-run-began-is-its-start"),
        pytest.param(150.0, 10.0, 100.0, id="in-the-future-is-now"),
        pytest.param(5.0, None, 5.0, id="no-start-known"),
        pytest.param(150.0, None, 100.0, id="no-start-known-future"),
    ],
)
def test_when_a_fact_happened(ts: float, start: float | None, expected: float) -> None:
    assert fact_time(ts, start, now=100.0) == expected


# --- silent nodes ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spoke_at", "now", "dead"),
    [
        pytest.param((0.0,), 29.5, False, id="silent-for-less-than-the-ttl-live"),
        pytest.param((0.0,), TTL, True, id="silent-for-the-ttl-dead"),
        pytest.param((0.0, 20.0), 49.5, False, id="a-heartbeat-restarts-the-ttl"),
        pytest.param((0.0, 20.0), 50.0, True, id="dead-a-ttl-after-the-last-heartbeat"),
    ],
)
def test_a_node_is_dead_once_silent_for_the_lease_ttl(spoke_at: tuple[float, ...], now: float, dead: bool) -> None:
    """``Inventory.sweep(now)`` (monotonic seconds, passed in) decides which nodes are dead; the
    sweep then releases their leases (``sweep_releases``)."""
    inventory = Inventory(lease_ttl_s=TTL)
    register = fake_node("n0", 1)
    inventory.register(register, spoke_at[0])
    for at in spoke_at[1:]:
        assert inventory.heartbeat("n0", register.incarnation, False, at)
    assert inventory.sweep(now) == (["n0"] if dead else [])
    assert inventory.is_live("n0") is not dead


def test_a_dead_node_that_speaks_again_is_live() -> None:
    inventory = Inventory(lease_ttl_s=TTL)
    register = fake_node("n0", 1)
    inventory.register(register, 0.0)
    assert inventory.sweep(TTL) == ["n0"]
    assert inventory.sweep(TTL + 1) == []  # reported dead once
    assert inventory.heartbeat("n0", register.incarnation, False, TTL + 2)
    assert inventory.is_live("n0")
