"""accept-all admits every offered job, in order."""

from __future__ import annotations

from services.core import ADMISSION
from tests.unit.policies.builders import assert_unchanged, cluster, frozen, job, jobs_of


def test_admits_everything_in_order() -> None:
    policy = ADMISSION.create("accept-all")
    offered = [job("held", submit=1.0), job("new1", submit=2.0), job("new2", gpus=64, submit=3.0)]
    admitted = jobs_of(job("running", on=(0,)))
    state = cluster(1, 4, running=admitted.values())
    before = frozen(admitted, state)
    verdict = policy.admit(offered, admitted, state, now=5.0)
    assert verdict.accepted == ("held", "new1", "new2")
    assert verdict.held == ()
    assert dict(verdict.rejected) == {}
    assert_unchanged(before, admitted, state)


def test_nothing_offered() -> None:
    verdict = ADMISSION.create("accept-all").admit([], {}, cluster(), now=0.0)
    assert verdict.accepted == ()
