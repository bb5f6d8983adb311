"""Small builders for policy tests: ``job(gpus=4, kind="TE")``, ``cluster(nodes=2, per_node=4)``.

Everything a policy reads can be set by keyword; everything else has a neutral default. Running
jobs hold the GPUs given in ``on``; ``cluster(..., running=[...])`` assigns them, so the cluster and
the job states agree. ``frozen(jobs, cluster)`` / ``assert_unchanged`` check that a policy mutated
nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from schemas.job import JobClass, JobSpec
from services.core.state import ClusterState, Gpu, JobState, JobStatus, Node


def job(
    job_id: str = "j",
    *,
    gpus: int = 1,
    max_gpus: int | None = None,
    kind: str = "BE",
    user: str = "default",
    model: str | None = None,
    submit: float = 0.0,
    seq: int = 0,
    on: Iterable[int] = (),
    status: JobStatus | None = None,
    service: float = 0.0,
    executed: float = 0.0,
    duration: float | None = None,
    iterations: int | None = None,
    iterations_done: int = 0,
    iteration_time: float | None = None,
    started: float | None = None,
    preempted: float | None = None,
    queued_since: float | None = None,
) -> JobState:
    """A job; running when ``on`` names GPUs (or ``status`` says so), else queued."""
    held = tuple(on)
    if status is None:
        status = JobStatus.RUNNING if held else JobStatus.QUEUED
    spec = JobSpec(
        name=job_id,
        user=user,
        command=["python", "train.py"],
        gpus=gpus,
        max_gpus=max_gpus,
        job_class=JobClass(kind),
        model=model,
        expected_duration_s=duration,
        expected_iterations=iterations,
    )
    return JobState(
        job_id=job_id,
        spec=spec,
        submit_time=submit,
        status=status,
        attained_service=service,
        executed_time=executed,
        iterations_done=iterations_done,
        iteration_time_s=iteration_time,
        gpus=held,
        last_start_time=started,
        last_preempt_time=preempted,
        queued_since=queued_since,
        seq=seq,
    )


def jobs_of(*items: JobState) -> dict[str, JobState]:
    """``{job_id: job}`` in the given order."""
    return {j.job_id: j for j in items}


def cluster(
    nodes: int = 2,
    per_node: int = 4,
    *,
    running: Iterable[JobState] = (),
    links: Mapping[tuple[int, int], float] | None = None,
) -> ClusterState:
    """A uniform cluster; every node gets ``links`` as its intra-node bandwidth map."""
    node_list: list[Node] = []
    gpu_list: list[Gpu] = []
    for n in range(nodes):
        node_id = f"node-{n}"
        ids = tuple(range(n * per_node, (n + 1) * per_node))
        node_list.append(Node(node_id, ids, link_bandwidth_gbps=dict(links or {})))
        gpu_list.extend(Gpu(g, node_id, i) for i, g in enumerate(ids))
    state = ClusterState(node_list, gpu_list)
    for j in running:
        state.assign(j.job_id, j.gpus)
    return state


@dataclass(frozen=True)
class Frozen:
    """A deep copy of what a policy may read, to compare after the call."""

    jobs: dict[str, JobState]
    gpu_jobs: list[tuple[str, ...]]
    free: dict[int, set[int]]


def frozen(jobs: Mapping[str, JobState], state: ClusterState) -> Frozen:
    return Frozen(copy.deepcopy(dict(jobs)), list(state.gpu_jobs), state.free_by_node())


def assert_unchanged(before: Frozen, jobs: Mapping[str, JobState], state: ClusterState) -> None:
    assert dict(jobs) == before.jobs, "policy mutated a JobState"
    assert list(state.gpu_jobs) == before.gpu_jobs, "policy mutated ClusterState.gpu_jobs"
    assert state.free_by_node() == before.free, "policy mutated the cluster's free-GPU index"


def allocation(placement: Any) -> dict[str, tuple[int, ...]]:
    """A placement's allocation as a plain dict with sorted GPU tuples."""
    return {k: tuple(sorted(v)) for k, v in placement.allocation.items()}
