"""Fill rounds' pure parts (``services.core.fill``): the ranking they place and the plan they keep."""

from __future__ import annotations

from schemas.job import JobSpec
from services.core.decisions import Plan, Ranking
from services.core.fill import fill_only_plan, fill_only_ranking
from services.core.state import ClusterState, JobState, JobStatus


def job(job_id: str, *, running_on: tuple[int, ...] = ()) -> JobState:
    state = JobState(job_id=job_id, spec=JobSpec(name=job_id, command=["x"], gpus=1, max_gpus=4), submit_time=0.0)
    if running_on:
        state.status = JobStatus.RUNNING
        state.gpus = running_on
    return state


def test_fill_only_ranking_forbids_preemption_and_keeps_running_jobs_size() -> None:
    jobs = {"run": job("run", running_on=(0,)), "wait": job("wait")}
    ranking = Ranking(order=("wait", "run"), preempt=True, gpu_targets={"run": 3, "wait": 2}, terminate={"x": "done"})
    filled = fill_only_ranking(ranking, jobs)
    assert filled.preempt is False
    assert dict(filled.gpu_targets) == {"wait": 2}
    assert filled.order == ranking.order
    assert filled.terminate == ranking.terminate


def test_fill_only_plan_keeps_only_launches_of_waiting_jobs_onto_free_gpus() -> None:
    cluster = ClusterState.uniform(1, 4)
    cluster.assign("run", (0,))
    jobs = {"run": job("run", running_on=(0,)), "a": job("a"), "b": job("b"), "c": job("c"), "d": job("d")}
    plan = Plan(
        launch={"a": (1,), "b": (0,), "c": (1,), "run": (2,), "d": (3,)},
        suspend=("run",),
        terminate={"d": "converged"},
    )
    kept = fill_only_plan(plan, jobs, cluster)
    # b needs the GPU "run" holds (its suspension is dropped), c a GPU a already claimed, "run" would
    # move, d is terminated: only a's launch stays, with the termination.
    assert dict(kept.launch) == {"a": (1,)}
    assert kept.suspend == ()
    assert dict(kept.terminate) == {"d": "converged"}


def test_fill_only_plan_returns_a_plan_that_already_fills_unchanged() -> None:
    cluster = ClusterState.uniform(1, 2)
    plan = Plan(launch={"a": (0,), "b": (1,)})
    assert fill_only_plan(plan, {"a": job("a"), "b": job("b")}, cluster) is plan
