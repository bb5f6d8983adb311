"""The pollux scheduling policy: GPU counts from goodput speed-ups, fairness, restart penalty, order."""

from __future__ import annotations

import pytest

from services.core import SCHEDULING
from services.core.goodput import PROFILES
from services.core.state import UNAVAILABLE, ClusterState, JobState
from services.scheduler.policies.pollux import PolluxPolicy
from tests.unit.conformance.scenarios import make_cluster, make_job

NOW = 10_000.0


def jobs_by_id(*jobs: JobState) -> dict[str, JobState]:
    return {job.job_id: job for job in jobs}


def late(model: str) -> float:
    """The noise scale of ``model`` late in its training (where more GPUs pay off most)."""
    return PROFILES[model].noise_scale_at(1.0)


def test_registered_and_options_checked() -> None:
    assert isinstance(SCHEDULING.create("pollux"), PolluxPolicy)
    for bad in ({"fairness_p": 2.0}, {"restart_delay_s": -1.0}, {"fallback_exponent": 0.0}):
        (name,) = bad
        with pytest.raises(ValueError, match=name):
            PolluxPolicy(**bad)  # type: ignore[arg-type]


def test_a_lone_elastic_job_grows_with_its_speedup_up_to_its_cap() -> None:
    cluster = make_cluster([4, 4])
    job = make_job("c", seq=0, gpus=1, max_gpus=8, model="cifar10", submit=0.0)
    job.grad_noise_scale = late("cifar10")
    ranking = PolluxPolicy().rank(jobs_by_id(job), cluster, NOW)
    assert ranking.gpu_targets == {"c": 8}  # cifar10 late in training still speeds up on 8 GPUs
    capped = make_job("c", seq=0, gpus=1, max_gpus=3, model="cifar10", submit=0.0)
    capped.grad_noise_scale = late("cifar10")
    assert PolluxPolicy().rank(jobs_by_id(capped), cluster, NOW).gpu_targets == {"c": 3}


def test_the_noise_scale_it_reports_decides_how_far_it_grows() -> None:
    """Early in training (small noise scale) big batches are wasted, so fewer GPUs are worth taking
    once each extra GPU must also beat another job's first one."""
    cluster = make_cluster([4, 4])

    def targets(noise: float) -> dict[str, int]:
        grower = make_job("grower", seq=0, gpus=1, max_gpus=8, model="cifar10", submit=0.0)
        grower.grad_noise_scale = noise
        other = make_job("other", seq=1, gpus=1, max_gpus=1, model="cifar10", submit=0.0)
        return dict(PolluxPolicy(fairness_p=1.0).rank(jobs_by_id(grower, other), cluster, NOW).gpu_targets)

    early, later = targets(PROFILES["cifar10"].noise_scale_at(0.0)), targets(late("cifar10"))
    assert early["other"] == later["other"] == 1
    assert early["grower"] < later["grower"]


def test_fairness_first_gives_every_job_a_gpu() -> None:
    cluster = make_cluster([2])
    a = make_job("a", seq=0, gpus=1, max_gpus=2, model="cifar10", submit=0.0)
    b = make_job("b", seq=1, gpus=1, max_gpus=2, model="cifar10", submit=5.0)
    for job in (a, b):
        job.grad_noise_scale = late("cifar10")
    ranking = PolluxPolicy().rank(jobs_by_id(a, b), cluster, NOW)
    assert ranking.gpu_targets == {"a": 1, "b": 1}  # p = -1: a second GPU for one starves the other


def test_rigid_jobs_get_all_they_ask_or_nothing() -> None:
    cluster = make_cluster([4])
    wide = make_job("wide", seq=0, gpus=3, submit=0.0)
    small = make_job("small", seq=1, gpus=2, submit=1.0)
    ranking = PolluxPolicy().rank(jobs_by_id(wide, small), cluster, NOW)
    assert set(ranking.gpu_targets.values()) <= {3, 2}
    assert sum(ranking.gpu_targets.values()) <= 4
    assert len(ranking.gpu_targets) == 1


def test_restart_penalty() -> None:
    policy = PolluxPolicy()
    job = make_job("j", seq=0, submit=NOW - 90.0, preemptions=1, started=NOW - 80.0, on=(0,))
    # (age - restarts * delay) / (age + delay) = (90 - 30) / (90 + 30)
    assert policy.penalty(job, NOW) == pytest.approx(0.5)
    assert PolluxPolicy(restart_delay_s=0.0).penalty(job, NOW) == 1.0
    # a young running job keeps its count: growing would cost it more than it gains
    cluster = make_cluster([4])
    young = make_job(
        "young", seq=0, gpus=1, max_gpus=4, model="cifar10", submit=NOW - 40.0, started=NOW - 30.0, on=(0, 1)
    )
    young.grad_noise_scale = late("cifar10")
    assert policy.rank(jobs_by_id(young), cluster, NOW).gpu_targets == {"young": 2}
    old = make_job("old", seq=0, gpus=1, max_gpus=4, model="cifar10", submit=0.0, started=100.0, on=(0, 1))
    old.grad_noise_scale = late("cifar10")
    assert policy.rank(jobs_by_id(old), cluster, NOW).gpu_targets == {"old": 4}


def test_order_puts_kept_allocations_first_and_unallocated_running_jobs_last() -> None:
    cluster = make_cluster([2])
    kept = make_job("kept", seq=0, gpus=1, submit=0.0, started=10.0, on=(0,))
    loser = make_job("loser", seq=1, gpus=1, submit=1.0, started=20.0, on=(1,))
    newcomer = make_job("new", seq=2, gpus=1, submit=2.0)
    waiting = make_job("waits", seq=3, gpus=2, submit=3.0)
    ranking = PolluxPolicy().rank(jobs_by_id(kept, loser, newcomer, waiting), cluster, NOW)
    assert sum(ranking.gpu_targets.values()) <= 2
    order = list(ranking.order)
    assert sorted(order) == ["kept", "loser", "new", "waits"]
    allocated = [j for j in order if j in ranking.gpu_targets]
    assert order[: len(allocated)] == allocated
    if "loser" not in ranking.gpu_targets:
        assert order[-1] == "loser"


def test_decisions_are_deterministic() -> None:
    def build() -> tuple[dict[str, JobState], ClusterState]:
        cluster = make_cluster([4, 4])
        jobs = [
            make_job(f"j{i}", seq=i, gpus=1, max_gpus=8, model=m, submit=float(i))
            for i, m in enumerate(("cifar10", "bert", "ncf", "yolov3", "cifar10"))
        ]
        return jobs_by_id(*jobs), cluster

    first, second = PolluxPolicy().rank(*build(), NOW), PolluxPolicy().rank(*build(), NOW)
    assert first == second
    assert sum(first.gpu_targets.values()) == 8  # all GPUs handed out


def test_gpus_a_draining_node_holds_are_not_handed_out() -> None:
    cluster = make_cluster([4])
    cluster.assign(UNAVAILABLE, (2, 3))  # a draining node's free GPUs, as the scheduler marks them
    job = make_job("c", seq=0, gpus=1, max_gpus=4, model="cifar10", submit=0.0)
    job.grad_noise_scale = late("cifar10")
    assert PolluxPolicy().rank(jobs_by_id(job), cluster, NOW).gpu_targets == {"c": 2}
