"""Fill rounds: between a policy's own rounds, put waiting jobs on free GPUs, never preempting.

A timer-only policy (LAS, Tiresias, FIFO, ...) decides every ``round_s``; a job that arrives, or a
GPU that frees, in between would otherwise wait for the next tick. A fill round runs the policy's
ranking with ``preempt=False`` (placement only fills free GPUs, in rank order, stopping where the
policy's walk stops) and without resizing running jobs, and keeps only the plan's launches of
waiting jobs onto GPUs that are free now. It never changes what the policy's own rounds decide; it
only keeps GPUs from idling until the next one. The live scheduler runs them by default
(``fill_between_rounds``); the simulator on request (``SimConfig.fill_between_rounds``), since Blox
and the papers' simulators start jobs only at rounds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from services.core.decisions import Plan, Ranking
from services.core.state import ClusterState, JobState


def fill_only_ranking(ranking: Ranking, jobs: Mapping[str, JobState]) -> Ranking:
    """``ranking`` for a fill round: placement may not preempt, and running jobs keep their size
    (resizing one means restarting it, which waits for the policy's own round)."""
    targets = {job_id: n for job_id, n in ranking.gpu_targets.items() if not jobs[job_id].is_running}
    return replace(ranking, preempt=False, gpu_targets=targets)


def fill_only_plan(plan: Plan, jobs: Mapping[str, JobState], cluster: ClusterState) -> Plan:
    """The part of ``plan`` a fill round may execute: launches of waiting jobs onto GPUs free now
    (none claimed twice) and the terminations; no suspension, so no move or resize either (a
    placement policy that suspends anyway loses those parts, as in the live scheduler)."""
    holders = cluster.gpu_jobs
    claimed: set[int] = set()
    launch: dict[str, tuple[int, ...]] = {}
    for job_id, gpus in plan.launch.items():
        job = jobs.get(job_id)
        if job is None or job.is_running or job_id in plan.terminate:
            continue
        if any(holders[g] or g in claimed for g in gpus):
            continue
        claimed.update(gpus)
        launch[job_id] = tuple(gpus)
    if not plan.suspend and len(launch) == len(plan.launch):
        return plan
    return Plan(launch=launch, suspend=(), terminate=plan.terminate)
