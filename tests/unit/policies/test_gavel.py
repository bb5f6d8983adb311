"""Gavel's round mechanism and the ``gavel`` policy pair on small typed clusters, checked by hand."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from services.core import PLACEMENT, SCHEDULING
from services.core.decisions import Ranking
from services.core.state import ClusterState, Gpu, JobState, JobStatus, Node
from tests.unit.conformance.scenarios import make_job

ROUND = 360.0


def typed(*types: str) -> ClusterState:
    """One 1-GPU node per type, in the order given."""
    nodes = [Node(f"node-{i}", (i,), gpu_type=t) for i, t in enumerate(types)]
    return ClusterState(nodes, [Gpu(i, f"node-{i}", 0, t) for i, t in enumerate(types)])


def place(policy: object, jobs: Mapping[str, JobState], cluster: ClusterState, now: float,
          *, preempt: bool = True) -> dict[str, tuple[int, ...]]:  # fmt: skip
    ranking = Ranking(order=tuple(jobs), preempt=preempt)
    return dict(policy.place(ranking, jobs, cluster, now).allocation)  # type: ignore[attr-defined]


def apply(allocation: Mapping[str, tuple[int, ...]], jobs: dict[str, JobState], cluster: ClusterState,
          now: float) -> None:  # fmt: skip
    """What the owner does with a placement: suspend, then launch (simplified)."""
    for job in jobs.values():
        if job.is_running and allocation.get(job.job_id) != job.gpus:
            cluster.release(job.job_id, job.gpus)
            job.status, job.gpus, job.last_preempt_time = JobStatus.QUEUED, (), now
    for job_id, gpus in allocation.items():
        job = jobs[job_id]
        if not job.is_running:
            cluster.assign(job_id, gpus)
            job.status, job.gpus, job.last_start_time, job.resumed_at = JobStatus.RUNNING, gpus, now, now


def test_a_lone_job_goes_to_its_fastest_type_whichever_that_is() -> None:
    cluster = typed("k80", "v100")
    for model, fastest in (("cyclegan", 1), ("recoder", 0)):  # Gavel measured Recommendation faster on a K80
        jobs = {"j": make_job("j", seq=0, model=model, submit=0.0)}
        assert place(PLACEMENT.create("gavel"), jobs, cluster, 10.0) == {"j": (fastest,)}
        assert SCHEDULING.create("gavel").rank(jobs, cluster, 10.0).order == ("j",)


def test_priorities_rotate_two_jobs_over_the_types_toward_the_allocation() -> None:
    # Two jobs, one K80 and one V100: max-min fairness gives each (about) half its time on each type
    # (the proportional split is optimal here: see test_gavel_lp). Round 1: nobody was served, every
    # priority is infinite, so the larger share (by a hair) decides which job takes which type.
    # Round 2: each job has had time on one type only (priority ~0.5 / 1 there, infinite on the
    # other), so the two swap. Over many rounds each job's time on each type converges to the
    # allocation: half and half.
    cluster = typed("k80", "v100")
    jobs = {
        "a": make_job("a", seq=0, model="cyclegan", submit=0.0),
        "b": make_job("b", seq=1, model="transformer", submit=0.0),
    }
    policy = PLACEMENT.create("gavel")
    seen = []
    for r in range(20):
        allocation = place(policy, jobs, cluster, r * ROUND)
        apply(allocation, jobs, cluster, r * ROUND)
        seen.append((allocation["a"], allocation["b"]))
    assert {seen[0][0], seen[0][1]} == {(0,), (1,)}
    assert seen[1] == (seen[0][1], seen[0][0])
    received = policy.mechanism.received("a")  # type: ignore[attr-defined]
    assert received["k80"] == pytest.approx(received["v100"], rel=0.15)


def test_a_fill_round_keeps_running_jobs_and_fills_only_free_gpus_of_the_granted_type() -> None:
    cluster = typed("k80", "v100", "v100")
    jobs = {
        "on-k80": make_job("on-k80", seq=0, model="cyclegan", submit=0.0, on=(0,), started=0.0),
        "new": make_job("new", seq=1, model="cyclegan", submit=100.0),
    }
    cluster.assign("on-k80", (0,))
    allocation = place(PLACEMENT.create("gavel"), jobs, cluster, 200.0, preempt=False)
    assert allocation["on-k80"] == (0,)  # would move to a V100 in a full round; not in a fill round
    assert allocation["new"] in {(1,), (2,)}


def test_a_running_job_granted_another_type_moves() -> None:
    cluster = typed("k80", "v100")
    jobs = {"j": make_job("j", seq=0, model="cyclegan", submit=0.0, on=(0,), started=0.0)}
    cluster.assign("j", (0,))
    assert place(PLACEMENT.create("gavel"), jobs, cluster, 400.0) == {"j": (1,)}


def test_the_agnostic_twin_allocates_alike_whatever_the_model() -> None:
    # Heterogeneity-agnostic: every type counts as equally fast, so a job that is 9x faster on the
    # V100 and one that is faster on the K80 get the same split; the aware LP sends them apart.
    cluster = typed("k80", "v100")

    def split(model: str, aware: bool) -> dict[str, float]:
        jobs = {"j": make_job("j", seq=0, model=model, submit=0.0)}
        policy = PLACEMENT.create("gavel", heterogeneity_aware=aware)
        return dict(policy.mechanism.decide(jobs, cluster, 10.0).allocation["j"])  # type: ignore[attr-defined]

    assert split("cyclegan", False) == split("recoder", False)
    assert split("cyclegan", True) == {"k80": 0.0, "v100": 1.0}
    assert split("recoder", True) == {"k80": 1.0, "v100": 0.0}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"objective": "fastest"}, "objective must be one of max-min-fairness, finish-time-fairness, makespan"),
        ({"heterogeneity_aware": "yes"}, "heterogeneity_aware must be true or false"),
        ({"fill": 1}, "fill must be true or false"),
        ({"default_duration_s": 0}, "default_duration_s must be > 0"),
        ({"default_duration_s": "1h"}, "default_duration_s must be a number"),
        ({"rounds": 3}, "unexpected keyword"),
    ],
)
def test_options_are_checked(options: dict[str, object], message: str) -> None:
    for registry in (SCHEDULING, PLACEMENT):
        with pytest.raises(ValueError, match=message):
            registry.check("gavel", options)


@pytest.mark.parametrize("objective", ["max-min-fairness", "finish-time-fairness", "makespan"])
def test_every_objective_places_every_job_that_fits(objective: str) -> None:
    cluster = typed("k80", "p100", "v100", "v100")
    jobs = {
        f"j{i}": make_job(f"j{i}", seq=i, model=m, submit=float(i), duration=3_600.0 * (i + 1))
        for i, m in enumerate(("cyclegan", "recoder", "resnet50", "lstm"))
    }
    allocation = place(PLACEMENT.create("gavel", objective=objective), jobs, cluster, 100.0)
    assert sorted(allocation) == sorted(jobs)
    assert sorted(g for gpus in allocation.values() for g in gpus) == [0, 1, 2, 3]


def test_a_job_wider_than_every_type_runs_across_types() -> None:
    # Gavel's LP cannot give a 2-GPU job anything on 1-GPU types; it runs across them rather than never.
    cluster = typed("k80", "v100")
    jobs = {"wide": make_job("wide", seq=0, gpus=2, model="resnet50", submit=0.0)}
    policy = PLACEMENT.create("gavel")
    allocation = place(policy, jobs, cluster, 10.0)
    assert allocation == {"wide": (0, 1)}
    apply(allocation, jobs, cluster, 10.0)
    assert place(policy, jobs, cluster, 10.0 + ROUND) == {"wide": (0, 1)}  # and keeps its GPUs
