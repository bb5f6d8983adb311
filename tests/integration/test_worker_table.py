"""The worker's pure parts: lease table and epoch fence, rank plan and job environment (no NATS)."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.job import JobSpec
from schemas.leases import LeaseAckError, LeaseGrant, WorldInfo
from schemas.nodes import LeaseState
from services.worker.launcher import RankPlan, job_environment, plan_ranks
from services.worker.leases import RECENT_LEASES, EpochFence, LeaseTable


def grant(lease_id: str = "l1", gpus: tuple[int, ...] = (0,), *, epoch: int = 3, world: WorldInfo | None = None,
          env: dict[str, str] | None = None, resume: str | None = None) -> LeaseGrant:
    return LeaseGrant(epoch=epoch, lease_id=lease_id, job_id=f"job-{lease_id}", node_id="n1", gpus=list(gpus),
                      spec=JobSpec(name="j", command=["python", "t.py"], env=env or {}), world=world,
                      resume_from=resume, resume_iteration=12 if resume else None)  # fmt: skip


def test_the_fence_admits_equal_and_newer_epochs_and_moves_only_with_an_accepted_command() -> None:
    """A newer epoch passes the check, but only a command the agent then accepts moves the fence: a
    newer epoch on a command refused for another reason (here 2**53, refused) leaves the leader's
    epoch admitted (the epoch-poisoning livelock, issue 18)."""
    fence = EpochFence()
    admitted = []
    for e, accepted in ((3, True), (3, True), (5, True), (4, True), (2**53, False), (5, True), (9, True), (0, True)):
        admitted.append(fence.allows(e))
        if admitted[-1] and accepted:
            fence.advance(e)
    assert admitted == [True, True, True, False, True, True, True, False]
    assert fence.seen == 9


def test_checking_an_epoch_does_not_move_the_fence() -> None:
    """Only an accepted command moves it (issue 13, attack 9): a check alone, however large, does not."""
    fence = EpochFence(5)
    assert fence.allows(2**53)
    assert fence.seen == 5
    assert fence.allows(5)
    assert not fence.advance(4)
    assert fence.advance(6)
    assert fence.seen == 6


def test_gpus_held_by_a_running_lease_are_busy_and_by_a_stopping_one_are_waited_for() -> None:
    table = LeaseTable([0, 1, 2])
    first = table.add(grant("a", (0, 1)))
    assert table.check_grant(grant("b", (1, 2))) == (LeaseAckError.GPU_BUSY, [])
    assert table.check_grant(grant("c", (3,))) == (LeaseAckError.NO_SUCH_GPU, [])
    assert table.check_grant(grant("d", (2,))) == (None, [])
    first.state = LeaseState.STOPPING
    error, waits = table.check_grant(grant("b", (1, 2)))
    assert error is None
    assert waits == [first]
    second = table.add(grant("b", (1, 2)))
    table.remove(first)  # the old processes exited: GPU 1 stays with the new lease, GPU 0 is free
    assert first.ended.is_set()
    assert table.check_grant(grant("e", (0,))) == (None, [])
    assert table.check_grant(grant("f", (1,))) == (LeaseAckError.GPU_BUSY, [])
    assert table.ended_recently("a")
    assert [h.lease_id for h in table.held()] == ["b"]
    assert table.get("b") is second


def test_ended_leases_are_remembered_up_to_a_bound() -> None:
    table = LeaseTable([0])
    for i in range(RECENT_LEASES + 5):
        table.remove(table.add(grant(f"l{i}")))
    assert not table.ended_recently("l0")
    assert table.ended_recently(f"l{RECENT_LEASES + 4}")
    assert len(table) == 0


def world(node_rank: int, offset: int, gpus: int = 2) -> WorldInfo:
    return WorldInfo(num_nodes=2, node_rank=node_rank, world_size=2 * gpus, rank_offset=offset,
                     coordinator_node="n1" if node_rank == 0 else "n0", coordinator_host="10.0.0.1",
                     coordinator_port=29500)  # fmt: skip


@pytest.mark.parametrize(
    ("g", "expected"),
    [
        pytest.param(grant(gpus=(2, 3)), [RankPlan(0, 0, 1, (2, 3))], id="single-node-one-process"),
        pytest.param(grant(gpus=(4, 5), world=world(1, 2)).model_copy(update={"node_id": "n2"}),
                     [RankPlan(2, 0, 4, (4,)), RankPlan(3, 1, 4, (5,))], id="second-node-one-per-gpu"),
    ],
)
def test_rank_plans(g: LeaseGrant, expected: list[RankPlan]) -> None:
    assert plan_ranks(g) == expected


def test_the_job_environment_sets_roundhouse_and_torch_variables_over_the_spec_and_agent() -> None:
    g = grant(gpus=(4, 5), world=world(0, 0), env={"LR": "0.1", "RANK": "99"}, resume="/ck/checkpoint.pt")
    plan = plan_ranks(g)[1]
    env = job_environment(g, plan, channel=Path("/w/rank-1.chan"), checkpoint_dir=Path("/ck"), nats="nats://x:4222",
                          namespace="ns", base={"PATH": "/bin", "ROUNDHOUSE_RESUME_FROM": "/stale"})
    assert env["PATH"] == "/bin"
    assert env["LR"] == "0.1"
    assert env["CUDA_VISIBLE_DEVICES"] == "5"
    assert (env["ROUNDHOUSE_RANK"], env["ROUNDHOUSE_LOCAL_RANK"], env["ROUNDHOUSE_WORLD_SIZE"]) == ("1", "1", "4")
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"], env["MASTER_PORT"]) == ("1", "4", "10.0.0.1", "29500")
    assert env["ROUNDHOUSE_RESUME_FROM"] == "/ck/checkpoint.pt"
    assert env["ROUNDHOUSE_RESUME_ITERATION"] == "12"
    assert env["ROUNDHOUSE_CHANNEL"] == "/w/rank-1.chan"
    fresh = job_environment(grant(), plan_ranks(grant())[0], channel=Path("/c"), checkpoint_dir=Path("/ck"),
                            nats="n", namespace="", base={"ROUNDHOUSE_RESUME_FROM": "/stale", "MASTER_PORT": "1"})
    assert "ROUNDHOUSE_RESUME_FROM" not in fresh
    assert (fresh["RANK"], fresh["WORLD_SIZE"], fresh["CUDA_VISIBLE_DEVICES"]) == ("0", "1", "0")


def test_a_job_does_not_inherit_the_agents_credentials() -> None:
    """Issue 13: the node's creds file is its identity on the bus; a job's code must not learn where it is."""
    env = job_environment(grant(), plan_ranks(grant())[0], channel=Path("/c"), checkpoint_dir=Path("/ck"), nats="n",
                          namespace="", base={"ROUNDHOUSE_CREDS": "/etc/roundhouse/auth/worker/n1.creds", "HOME": "/h"})
    assert "ROUNDHOUSE_CREDS" not in env
    assert env["HOME"] == "/h"
