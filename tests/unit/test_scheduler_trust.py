"""The scheduler's source checks (``services/scheduler/trust.py``), the query's per-requester view,
the ``operators`` setting and ``roundhouse cancel``'s reading of the scheduler's answer: tables of
cases, no NATS."""

from __future__ import annotations

import logging
import uuid

import pytest

from roundhouse.commands.cancel import judge
from schemas.control import JobsQuery, JobsReply, JobView
from schemas.job import JobClass, JobSpec
from schemas.nodes import HeldLease
from schemas.rounds import NodeGpus, PlacementPlan
from services.core.state import JobState
from services.runtime.store import LeaseRecord, LeaseState
from services.scheduler.book import JobBook
from services.scheduler.config import SchedulerConfig
from services.scheduler.entry import JobEntry
from services.scheduler.inventory import Inventory
from services.scheduler.leases import Lease, row_id
from services.scheduler.queries import answer
from services.scheduler.rounds import validate_plan
from services.scheduler.trust import (
    LeaseSource,
    Refusal,
    RefusalLog,
    check_fact,
    foreign_leases,
    may_operate,
    source_from_rows,
)

MULTI = LeaseSource("L1", "job", ("n0", "n1"), epoch=7)


@pytest.mark.parametrize(
    ("node", "job", "epoch", "coordinator_only", "expected"),
    [
        pytest.param("n0", "job", 7, True, None, id="coordinator-own-lease"),
        pytest.param("n1", "job", 7, False, None, id="other-rank-may-start-or-fail"),
        pytest.param("n1", "job", 7, True, Refusal.OTHER_NODE, id="other-rank-may-not-complete"),
        pytest.param("n9", "job", 7, False, Refusal.OTHER_NODE, id="node-outside-the-lease"),
        pytest.param("n0", "other", 7, False, Refusal.OTHER_JOB, id="lease-of-another-job"),
        pytest.param("n0", "job", 8, False, Refusal.WRONG_EPOCH, id="another-epoch"),
        pytest.param("n0", "job", None, False, None, id="failure-without-epoch"),
    ],
)
def test_a_fact_comes_from_the_node_that_holds_its_lease(
    node: str, job: str, epoch: int | None, coordinator_only: bool, expected: Refusal | None
) -> None:
    assert check_fact(node, job, epoch, MULTI, coordinator_only=coordinator_only) is expected


def test_a_fact_about_a_made_up_lease_is_refused() -> None:
    assert check_fact("n0", "job", 7, None, coordinator_only=False) is Refusal.UNKNOWN_LEASE


def row(lease_id: str, rank: int, node: str, *, job: str = "job", epoch: int = 7) -> LeaseRecord:
    return LeaseRecord(row_id(lease_id, rank), job, node, (0,), epoch, 1.0, LeaseState.RELEASED)


def test_a_released_lease_is_known_from_its_stored_rows_in_rank_order() -> None:
    rows = [row("L1", 1, "n1"), row("L2", 0, "n5"), row("L1", 0, "n0"), LeaseRecord("odd", "job", "n7", (), 7, 1.0)]
    assert source_from_rows("L1", rows) == LeaseSource("L1", "job", ("n0", "n1"), 7)
    assert source_from_rows("L3", rows) is None


def test_a_heartbeat_may_list_only_its_own_nodes_leases() -> None:
    held = {
        "mine": Lease("mine", "a", (("n0", (0,)),), 1, 0.0),
        "theirs": Lease("theirs", "b", (("n1", (0,)),), 1, 0.0),
        "shared": Lease("shared", "c", (("n1", (0,)), ("n0", (1,))), 1, 0.0),
    }

    def listed(lease_id: str, job_id: str) -> HeldLease:
        return HeldLease(lease_id=lease_id, job_id=job_id, epoch=1, gpus=[0])

    reported = [listed("mine", "a"), listed("shared", "c"), listed("stray", "z")]
    assert foreign_leases("n0", reported, held) == []  # a stray is the node's own business
    assert foreign_leases("n0", [listed("theirs", "b")], held) == ["theirs"]
    assert foreign_leases("n0", [listed("mine", "b")], held) == ["mine"]  # its lease, another job


@pytest.mark.parametrize(
    ("requester", "owner", "expected"),
    [("alice", "alice", True), ("bob", "alice", False), ("operator", "alice", True), ("ops", "alice", False)],
)
def test_the_owner_or_an_operator_may_operate_on_a_job(requester: str, owner: str, expected: bool) -> None:
    assert may_operate(requester, owner, ("operator",)) is expected


def test_refusals_are_counted_every_time_and_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    refusals = RefusalLog(lambda: now[0], every_s=10.0, logger=logging.getLogger("test.refusals"))
    with caplog.at_level(logging.WARNING, logger="test.refusals"):
        for _ in range(100):
            refusals.refuse("job.completed.*", Refusal.UNKNOWN_LEASE, "forged")
        now[0] = 11.0
        refusals.refuse("job.completed.*", Refusal.UNKNOWN_LEASE, "forged")
    assert refusals.as_dict() == {"job.completed:unknown_lease": 101}
    assert len(caplog.records) == 2
    assert "99 more refused" in caplog.records[1].getMessage()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('["ops", "root"]', ("ops", "root")),
        ("ops, root", ("ops", "root")),
        (["ops"], ("ops",)),
    ],
)
def test_operators_come_as_json_or_comma_separated_names(value: object, expected: tuple[str, ...]) -> None:
    assert SchedulerConfig.model_validate({"operators": value}).operators == expected
    assert SchedulerConfig().operators == ("operator",)


def book_of(*owners: tuple[str, str]) -> JobBook:
    book = JobBook()
    for seq, (job_id, user) in enumerate(owners, start=1):
        spec = JobSpec(name=job_id, user=user, command=["true"], gpus=1)
        state = JobState(job_id=job_id, spec=spec, submit_time=float(seq), seq=seq)
        book.jobs[job_id] = JobEntry(state, version=1)
    return book


def test_query_jobs_shows_a_user_their_own_jobs_and_refuses_others_named() -> None:
    book = book_of(("a-1", "alice"), ("b-1", "bob"))
    mine = answer(JobsQuery(requester="bob"), book, [], 10.0, 1, operators=("operator",))
    assert [view.job_id for view in mine.jobs] == ["b-1"]
    named = answer(JobsQuery(requester="bob", job_ids=["a-1"]), book, [], 10.0, 1, operators=("operator",))
    assert named.jobs == []
    assert named.refused == {"a-1": "permission denied: bob cannot read alice's job"}
    everyone = answer(JobsQuery(requester="operator"), book, [], 10.0, 1, operators=("operator",))
    assert [view.job_id for view in everyone.jobs] == ["a-1", "b-1"]


def test_a_reply_without_refusals_keeps_its_json_keys() -> None:
    assert set(JobsReply(epoch=1).model_dump(mode="json")) == {"jobs", "truncated", "epoch", "refused"}
    old = JobsReply.model_validate_json('{"jobs": [], "truncated": false, "epoch": 3}')
    assert old.refused == {}


def view(job_id: str, status: str) -> JobView:
    return JobView(job_id=job_id, name=job_id, user="bob", job_class=JobClass.BE, status=status, gpus=1,
                   submit_time=0.0)  # fmt: skip


def test_cancel_sends_only_what_the_scheduler_allows() -> None:
    reply = JobsReply(
        jobs=[view("b-1", "running"), view("b-2", "completed")],
        epoch=1,
        refused={"a-1": "permission denied: bob cannot read alice's job"},
    )
    allowed, outcome = judge(["a-1", "b-1", "b-2", "ghost", "b-1"], reply)
    assert allowed == ["b-1"]
    assert outcome.finished == {"b-2": "completed"}
    assert outcome.errors == ["permission denied: bob cannot cancel alice's job a-1", "no such job: ghost"]
    unchecked, outcome = judge([f"j-{uuid.uuid4().hex[:6]}"], None)
    assert len(unchecked) == 1
    assert outcome.unchecked


def test_a_plan_naming_unknown_jobs_is_dropped_part_by_part() -> None:
    book = book_of(("a-1", "alice"))
    inventory = Inventory(lease_ttl_s=30.0)
    plan = PlacementPlan(
        round=1, state_version=1, epoch=1, policy="consolidated",
        launch={"ghost": [NodeGpus(node_id="n0", gpus=[0])]}, suspend=["phantom"], terminate={"spectre": "done"},
    )  # fmt: skip
    valid = validate_plan(plan, book, inventory, {})
    assert valid.is_empty
    assert sorted(reason.split(":")[0] for reason in valid.dropped) == ["launch ghost", "suspend phantom",
                                                                        "terminate spectre"]  # fmt: skip
