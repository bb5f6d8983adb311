"""One scheduling round as pure functions: admit -> rank -> place -> plan diff.

The round is written once and split at the one place the live control plane splits it: the scheduler
runs :func:`rank_step` on its snapshot and sends the ranking with that snapshot to the placement
service, which runs :func:`place_step` on it; the simulator runs both in one process (and
:func:`run_round` adds admission for tests and composition checks). Because both halves are these
functions, a round on the live path and a simulated round on the same snapshot give the same plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.core.decisions import Admission, Placement, Plan, Ranking
from services.core.fill import fill_only_plan, fill_only_ranking
from services.core.protocols import AdmissionPolicy, PlacementPolicy, SchedulingPolicy
from services.core.state import TIERS, ClusterState, JobState


@dataclass(frozen=True, slots=True)
class RoundResult:
    admission: Admission
    ranking: Ranking
    placement: Placement
    plan: Plan


def diff_plan(placement: Placement, ranking: Ranking, jobs: Mapping[str, JobState]) -> Plan:
    """Turn a target allocation into the changes to make.

    A running job absent from the target, or present with other GPUs, is suspended; a job in the
    target that does not already hold exactly those GPUs is launched. Jobs to terminate are never
    launched. If the placement policy attached its own diff (``Placement.plan``), that is used
    instead (with ``ranking.terminate``), which avoids a walk over every job.
    """
    if placement.plan is not None:
        hint = placement.plan
        if not hint.terminate and not ranking.terminate:  # the usual case, without copying either
            return hint
        if dict(hint.terminate) == dict(ranking.terminate):
            return hint
        return Plan(launch=hint.launch, suspend=hint.suspend, terminate=dict(ranking.terminate))
    terminate = dict(ranking.terminate)
    suspend: list[str] = []
    launch: dict[str, tuple[int, ...]] = {}
    for job_id, job in jobs.items():
        if job.is_running and job_id not in terminate:
            target = placement.allocation.get(job_id)
            if target is None or tuple(sorted(target)) != tuple(sorted(job.gpus)):
                suspend.append(job_id)
    for job_id, gpus in placement.allocation.items():
        if job_id in terminate:
            continue
        job = jobs[job_id]
        if not job.is_running or tuple(sorted(gpus)) != tuple(sorted(job.gpus)):
            launch[job_id] = tuple(gpus)
    return Plan(launch=launch, suspend=tuple(suspend), terminate=terminate)


def by_priority(ranking: Ranking, jobs: Mapping[str, JobState]) -> Ranking:
    """Priority tiers ranked before the policy's order (issue 14, item 5).

    Jobs rank by ``spec.priority`` (``JobState.priority``, which the simulator answers without
    building a trace job's spec) first, higher first, and within one priority in the policy's
    order (a stable sort). So who may preempt whom follows: under a preemptive policy placement
    suspends a running job only for one ranked above it, which is now any job of a higher tier, or
    one of the same tier the policy puts first; a job never preempts one of a higher tier, and
    under a non-preemptive policy (``preempt=False``: fifo, fitgpp) tiers only say who gets free
    GPUs first. A sustained stream of higher-tier work can starve a lower tier, as Slurm's partition
    priority tiers do; the policy's own starvation guard acts within a tier.

    With every job at one priority (the default, 0) the policy's ranking is returned as it is: at no
    cost while this process never made a job of another priority (``state.TIERS``: trace-driven
    simulations, clusters that do not use priorities), else after one pass over the jobs. Otherwise the order is
    materialised and the placement hints (``running``, ``waiting``, ``key``) are dropped, so
    placement walks the whole order; ``terminate``, ``gpu_targets`` and ``preempt`` are kept.
    """
    if not TIERS.seen or len({job.priority for job in jobs.values()}) <= 1:
        return ranking
    priorities = {job_id: job.priority for job_id, job in jobs.items()}
    order = sorted(ranking.order, key=lambda job_id: -priorities.get(job_id, 0))
    return Ranking(
        order=tuple(order), terminate=ranking.terminate, gpu_targets=ranking.gpu_targets, preempt=ranking.preempt
    )


def rank_step(
    scheduling: SchedulingPolicy,
    jobs: Mapping[str, JobState],
    cluster: ClusterState,
    now: float,
    *,
    fill_only: bool = False,
    ranking: Ranking | None = None,
) -> Ranking:
    """The scheduling half of a round: the policy's ranking (or ``ranking``, when the caller already
    has it from an incremental fast path that equals ``rank()``), priority tiers first
    (:func:`by_priority`), restricted for a fill round (``services.core.fill``)."""
    if ranking is None:
        ranking = scheduling.rank(jobs, cluster, now)
    ranking = by_priority(ranking, jobs)
    return fill_only_ranking(ranking, jobs) if fill_only else ranking


def place_step(
    placement: PlacementPolicy,
    ranking: Ranking,
    jobs: Mapping[str, JobState],
    cluster: ClusterState,
    now: float,
    *,
    fill_only: bool = False,
) -> Plan:
    """The placement half of a round: the target allocation for ``ranking``, as the changes to
    make; in a fill round only launches of waiting jobs onto GPUs free now (and terminations)."""
    target = placement.place(ranking, jobs, cluster, now)
    plan = target.plan
    if plan is None or plan.terminate or ranking.terminate:  # else diff_plan returns the policy's own diff
        plan = diff_plan(target, ranking, jobs)
    return fill_only_plan(plan, jobs, cluster) if fill_only else plan


def run_round(
    *,
    admission: AdmissionPolicy,
    scheduling: SchedulingPolicy,
    placement: PlacementPolicy,
    offered: Sequence[JobState],
    jobs: Mapping[str, JobState],
    cluster: ClusterState,
    now: float,
) -> RoundResult:
    """Run one round on a snapshot. ``jobs`` holds the admitted, unfinished jobs.

    Jobs accepted this round join the ranked set as waiting jobs; the caller applies the resulting
    plan (and the admission verdicts) to its own state afterwards.
    """
    verdict = admission.admit(offered, jobs, cluster, now)
    if verdict.accepted:
        by_id = {j.job_id: j for j in offered}
        candidates: Mapping[str, JobState] = {**jobs, **{i: by_id[i] for i in verdict.accepted}}
    else:
        candidates = jobs
    ranking = rank_step(scheduling, candidates, cluster, now)
    target = placement.place(ranking, candidates, cluster, now)
    return RoundResult(verdict, ranking, target, diff_plan(target, ranking, candidates))
