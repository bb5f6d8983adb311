"""``gavel`` placement: each job on GPUs of the type Gavel's round mechanism granted it (OSDI '20, §5).

The mechanism (``services.core.gavel_rounds``, the same one the ``gavel`` scheduling policy ranks
with, built from the same options) grants each job at most one GPU type per round. This policy
turns the grants into GPUs:

1. a running job granted the type it runs on keeps its GPUs (no needless migration: Gavel's own
   placement also prefers a job's previous workers);
2. then, in grant order, every other granted job takes free GPUs of its type: the node of that type
   with the fewest free GPUs that still holds the job (best fit, as ``consolidated``), else the
   fewest nodes of the type, most free first. A job that does not fit for fragmentation waits;
3. running jobs not granted, or granted another type, are suspended (moved when they got GPUs).

A job wider than every type (granted ``ANY_TYPE``) takes free GPUs of any type, fewest nodes first.

With ``Ranking.preempt`` False (a fill round) running jobs keep their GPUs and granted waiting jobs
take only GPUs free now. GPUs a draining node withholds (``UNAVAILABLE``) or held by jobs outside the
snapshot are never used. The scheduler's ranking fixes who is considered (its jobs), not the order:
the grants do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from services.core.decisions import Placement, Ranking
from services.core.gavel_rounds import ANY_TYPE, GavelPolicyBase
from services.core.registry import PLACEMENT
from services.core.state import ClusterState, JobState


def fit_on_type(
    need: int, gpu_type: str, free: Mapping[int, list[int]], cluster: ClusterState
) -> tuple[int, ...] | None:
    """``need`` GPUs of ``gpu_type`` (any type for ``ANY_TYPE``) from ``free`` (free GPU ids by node
    position, ascending), on one node if any holds them (the one with the fewest free), else on the
    fewest nodes."""
    nodes = [pos for pos, gpus in free.items() if gpus and gpu_type in (ANY_TYPE, cluster.gpus[gpus[0]].gpu_type)]
    fitting = [pos for pos in nodes if len(free[pos]) >= need]
    if fitting:
        best = min(fitting, key=lambda pos: (len(free[pos]), pos))
        return tuple(free[best][:need])
    chosen: list[int] = []
    for pos in sorted(nodes, key=lambda pos: (-len(free[pos]), pos)):
        chosen.extend(free[pos][: need - len(chosen)])
        if len(chosen) == need:
            return tuple(chosen)
    return None


@PLACEMENT.register("gavel")
class GavelPlacement(GavelPolicyBase):
    """Place Gavel's per-round type grants on GPUs of those types."""

    name: ClassVar[str] = "gavel"

    def place(self, ranking: Ranking, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Placement:
        considered = {job_id: jobs[job_id] for job_id in ranking.order if job_id in jobs}
        decision = self.mechanism.decide(considered, cluster, now)
        allocation: dict[str, tuple[int, ...]] = {}
        movable: set[int] = set()  # GPUs of running jobs this round may take back
        for job in considered.values():
            if not job.is_running:
                continue
            types = {cluster.gpus[g].gpu_type for g in job.gpus}
            granted = decision.assignment.get(job.job_id)
            if not ranking.preempt or types == {granted} or (granted == ANY_TYPE and len(types) > 1):
                allocation[job.job_id] = tuple(job.gpus)
            else:
                movable.update(job.gpus)
        free: dict[int, list[int]] = {}
        for gpu, holders in zip(cluster.gpus, cluster.gpu_jobs, strict=True):
            if not holders or (gpu.gpu_id in movable and all(h in considered for h in holders)):
                free.setdefault(cluster.node_position_of_gpu(gpu.gpu_id), []).append(gpu.gpu_id)
        for job_id in decision.order:
            gpu_type = decision.assignment.get(job_id)
            if gpu_type is None or job_id in allocation:
                continue
            job = considered[job_id]
            if job.is_running and not ranking.preempt:
                continue
            gpus = fit_on_type(job.gpus_requested, gpu_type, free, cluster)
            if gpus is None:
                continue
            taken = set(gpus)
            for pos in {cluster.node_position_of_gpu(g) for g in gpus}:
                free[pos] = [g for g in free[pos] if g not in taken]
            allocation[job_id] = gpus
        return Placement(allocation=allocation)
