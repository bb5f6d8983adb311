"""What a forged gradient noise scale can do to Pollux's GPU counts.

``metrics.job.<job>`` may be published by any worker (docs/security.md, Known limits): the
metrics service cannot tell which node sent a sample, so a compromised node can report any noise
scale the schema allows (finite, 0 .. 1e12) for any job, its own or another user's. These tests
bound the damage on the policy itself: the forged value moves a job's GPU count only within the
range its own spec allows, and the fairness of the power mean (p = -1) still gives every other
job its GPU first. What the schema refuses (NaN, inf, negative, above 1e12) never gets this far
(``tests/unit/pollux/test_noise_scale.py``).
"""

from __future__ import annotations

import pytest

from services.core.goodput import PROFILES
from services.core.state import JobState
from services.scheduler.policies.pollux import PolluxPolicy
from tests.unit.conformance.scenarios import make_cluster, make_job

NOW = 10_000.0
HUGE = 1e12
"""The largest noise scale ``JobMetrics`` accepts: every batch size is then fully efficient."""


def three_jobs(forged: float | None, victim_noise: float | None = None) -> dict[str, JobState]:
    """An attacker's elastic job (its noise scale forged) beside two honest elastic jobs."""
    honest = PROFILES["cifar10"].noise_scale_at(0.5)
    jobs = [
        make_job("attacker", seq=0, gpus=1, max_gpus=6, model="cifar10", submit=0.0),
        make_job("victim", seq=1, gpus=1, max_gpus=8, model="cifar10", submit=0.0),
        make_job("bystander", seq=2, gpus=1, max_gpus=8, model="cifar10", submit=0.0),
    ]
    jobs[0].grad_noise_scale = forged if forged is not None else honest
    jobs[1].grad_noise_scale = victim_noise if victim_noise is not None else honest
    jobs[2].grad_noise_scale = honest
    return {job.job_id: job for job in jobs}


@pytest.mark.parametrize("fairness_p", [-1.0, 0.0, 1.0], ids=["p=-1", "p=0", "p=1"])
def test_a_huge_forged_noise_scale_stays_within_the_jobs_own_range(fairness_p: float) -> None:
    cluster = make_cluster([4, 4])
    targets = PolluxPolicy(fairness_p=fairness_p).rank(three_jobs(HUGE), cluster, NOW).gpu_targets
    assert targets["attacker"] <= 6  # its own max_gpus, however good it claims more GPUs are
    assert sum(targets.values()) <= cluster.total_gpus


def test_with_fairness_every_honest_job_keeps_a_gpu_beside_a_forged_one() -> None:
    cluster = make_cluster([4, 4])
    forged = PolluxPolicy().rank(three_jobs(HUGE), cluster, NOW).gpu_targets
    assert min(forged["victim"], forged["bystander"]) >= 1  # p = -1: no job is starved for it
    assert forged["attacker"] < cluster.total_gpus


def test_the_forgery_pays_where_fairness_is_off() -> None:
    """The limit docs/security.md names: with p = 1 (plain sum of speed-ups) a claimed perfect
    efficiency takes a GPU from an honest job."""
    cluster = make_cluster([4, 4])
    honest = PolluxPolicy(fairness_p=1.0).rank(three_jobs(None), cluster, NOW).gpu_targets
    forged = PolluxPolicy(fairness_p=1.0).rank(three_jobs(HUGE), cluster, NOW).gpu_targets
    assert forged["attacker"] > honest["attacker"]
    assert min(forged["victim"], forged["bystander"]) >= 1


def test_a_forged_zero_for_another_job_shrinks_it_but_never_to_nothing() -> None:
    cluster = make_cluster([4, 4])
    honest = PolluxPolicy().rank(three_jobs(None), cluster, NOW).gpu_targets
    targets = PolluxPolicy().rank(three_jobs(None, victim_noise=0.0), cluster, NOW).gpu_targets
    assert 1 <= targets["victim"] < honest["victim"]


def test_the_extremes_the_schema_allows_give_finite_deterministic_decisions() -> None:
    cluster = make_cluster([4, 4])
    for forged in (0.0, 1e-300, HUGE):
        first = PolluxPolicy().rank(three_jobs(forged), cluster, NOW)
        again = PolluxPolicy().rank(three_jobs(forged), cluster, NOW)
        assert first == again
        assert all(1 <= n <= 8 for n in first.gpu_targets.values())
