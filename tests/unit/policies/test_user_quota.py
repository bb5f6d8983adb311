"""User quotas at admission: caps on a user's admitted, unfinished jobs and their GPUs."""

from __future__ import annotations

from typing import Any

import pytest

from services.admission.policies.user_quota import UserQuotaAdmission
from services.core import ADMISSION
from services.core.state import JobState
from tests.unit.policies.builders import assert_unchanged, cluster, frozen, job, jobs_of

CASES: list[tuple[str, dict[str, Any], list[JobState], list[JobState], list[str], list[str], list[str]]] = [
    (
        "job quota: alice has 1 of 2, so one more enters; bob is unaffected",
        {"max_jobs": 2},
        [job("alice-0", user="alice", on=(0,))],
        [job("alice-1", user="alice"), job("alice-2", user="alice"), job("bob-1", user="bob")],
        ["alice-1", "bob-1"],
        ["alice-2"],
        [],
    ),
    (
        "GPU quota: 6 of 8 used, a 2-GPU job fits, the next 1-GPU job waits",
        {"max_gpus": 8},
        [job("alice-0", user="alice", gpus=6)],
        [job("alice-1", user="alice", gpus=2), job("alice-2", user="alice", gpus=1)],
        ["alice-1"],
        ["alice-2"],
        [],
    ),
    (
        "per-user FIFO: once alice's big job waits, her small one waits too",
        {"max_gpus": 8},
        [job("alice-0", user="alice", gpus=6)],
        [
            job("alice-big", user="alice", gpus=4),
            job("alice-small", user="alice", gpus=1),
            job("bob", user="bob"),
        ],
        ["bob"],
        ["alice-big", "alice-small"],
        [],
    ),
    (
        "a job larger than the GPU quota is rejected, the next one still considered",
        {"max_gpus": 4},
        [],
        [job("huge", user="alice", gpus=8), job("fine", user="alice", gpus=4)],
        ["fine"],
        [],
        ["huge"],
    ),
    (
        "per-user override raises alice's GPU quota; bob keeps the default",
        {"max_gpus": 4, "users": {"alice": {"max_gpus": 16}}},
        [],
        [job("alice-8", user="alice", gpus=8), job("bob-8", user="bob", gpus=8)],
        ["alice-8"],
        [],
        ["bob-8"],
    ),
    (
        "an override inherits the job quota it does not set",
        {"max_jobs": 1, "users": {"alice": {"max_gpus": 16}}},
        [job("alice-0", user="alice")],
        [job("alice-1", user="alice")],
        [],
        ["alice-1"],
        [],
    ),
    (
        "a zero job quota rejects",
        {"users": {"guest": {"max_jobs": 0}}},
        [],
        [job("guest-1", user="guest")],
        [],
        [],
        ["guest-1"],
    ),
    ("no quota: everything enters", {}, [job("a", gpus=8)], [job("b", gpus=8)], ["b"], [], []),
]


@pytest.mark.parametrize(
    ("options", "admitted", "offered", "verdict"),
    [(c[1], c[2], c[3], c[4:]) for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_admit(
    options: dict[str, Any],
    admitted: list[JobState],
    offered: list[JobState],
    verdict: tuple[list[str], list[str], list[str]],
) -> None:
    accepted, held, rejected = verdict
    policy = ADMISSION.create("user-quota", **options)
    jobs = jobs_of(*admitted)
    state = cluster(2, 4, running=[j for j in admitted if j.gpus])
    before = frozen(jobs, state)

    result = policy.admit(offered, jobs, state, 0.0)

    assert list(result.accepted) == accepted
    assert list(result.held) == held
    assert sorted(result.rejected) == rejected
    assert all("quota" in reason for reason in result.rejected.values())
    assert_unchanged(before, jobs, state)


def test_rejection_reason_says_what_to_change() -> None:
    huge = job("huge", user="alice", gpus=8)
    verdict = UserQuotaAdmission(max_gpus=4).admit([huge], {}, cluster(2, 4), 0.0)
    assert verdict.rejected["huge"] == (
        "job needs 8 GPUs but user 'alice' may hold at most 4; request fewer GPUs or ask an operator to "
        "raise the quota"
    )


@pytest.mark.parametrize(
    "options",
    [{"users": {"alice": {"max_cpus": 3}}}, {"max_jobs": -1}, {"users": {"alice": {"max_gpus": -2}}}],
    ids=["unknown key", "negative default", "negative override"],
)
def test_rejects_bad_options(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"unknown key|non-negative"):
        UserQuotaAdmission(**options)
