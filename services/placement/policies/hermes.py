"""``hermes`` placement: per-GPU job queues with a job cap, time-shared by the ranking (seed 003, §3.2-3.3).

Hermes' global scheduler places each arriving job on a GPU and never moves it (Algorithm 1); the
GPU is the least loaded one, counting the jobs placed on it, among the GPUs with fewer than
``G_thres`` jobs (Algorithm 2; ``G_thres = 4``); "once all nodes have reached their maximum job
capacity, the remaining jobs remain in the global scheduler queue". Each GPU's node scheduler
then time-shares the GPU among its jobs (Algorithm 3), one job at a time.

Here: every round,

1. jobs that hold GPUs keep them as their home; other jobs keep the home they were given earlier;
2. jobs without a home, in submit order (the global FIFO queue), get one by Algorithm 2: the GPU
   with the fewest jobs among those with fewer than ``max_jobs_per_gpu``; ties to the lowest GPU id
   (Algorithm 2's strict "fewer than" keeps the first one found); a job that gets none waits in the
   global queue, and later jobs are still tried (Algorithm 1 loops over every job);
3. walking the ranking (``hermes``, ``rr`` or ``slaq``: the node scheduler's order), a job with a
   home runs on it if none of its home GPUs was claimed by a higher-ranked job; so each GPU runs
   its highest-ranked job, and running jobs that lose their GPU are suspended. With
   ``Ranking.preempt`` False, running jobs keep their GPUs and only idle GPUs are filled.

Choices where the paper is silent (its jobs use one GPU each): a job needing ``g`` GPUs gets ``g``
distinct GPUs by ``g`` applications of Algorithm 2 (any nodes), counts as one job on each, and runs
only when it is the highest-ranked job on all of them. Terminated jobs lose their home.

State: the homes live in the policy object between rounds (Hermes never migrates, so the
assignment is history, not a function of one snapshot). Inputs are never mutated; the same
sequence of calls gives the same decisions. A new object (a restarted placement service) rebuilds
the homes of running jobs from the snapshot and re-queues the others in FIFO order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from services.core.decisions import Placement, Plan, Ranking
from services.core.registry import PLACEMENT
from services.core.state import ClusterState, JobState

G_THRES = 4
"""Hermes' maximum number of jobs per GPU (§3.2)."""


@PLACEMENT.register("hermes")
class HermesPlacement:
    """Least-loaded GPU per job (at most ``max_jobs_per_gpu``), then the ranking's best job per GPU."""

    name: ClassVar[str] = "hermes"
    keeps_running: ClassVar[bool] = True

    def __init__(self, *, max_jobs_per_gpu: int = G_THRES) -> None:
        if max_jobs_per_gpu < 1:
            raise ValueError(f"max_jobs_per_gpu must be >= 1, got {max_jobs_per_gpu}")
        self.max_jobs_per_gpu = max_jobs_per_gpu
        self._home: dict[str, tuple[int, ...]] = {}

    @property
    def homes(self) -> Mapping[str, tuple[int, ...]]:
        """Each placed job's GPUs (its time-sharing queue), as of the last ``place`` call."""
        return dict(self._home)

    def assign(self, jobs: Mapping[str, JobState], cluster: ClusterState, terminate: Mapping[str, str]) -> None:
        """Steps 1-2: refresh the homes for this snapshot (Algorithms 1-2)."""
        home: dict[str, tuple[int, ...]] = {}
        for job_id, job in jobs.items():
            if job_id in terminate:
                continue
            if job.is_running:
                home[job_id] = tuple(job.gpus)
            elif job_id in self._home:
                home[job_id] = self._home[job_id]
        count = [0] * cluster.total_gpus
        for gpus in home.values():
            for g in gpus:
                count[g] += 1
        cap = self.max_jobs_per_gpu
        queue = sorted(
            (j for j in jobs.values() if j.job_id not in home and j.job_id not in terminate),
            key=lambda j: (j.submit_time, j.seq),
        )
        for job in queue:
            chosen: list[int] = []
            for _ in range(job.spec.gpus):
                candidate = _find_available_gpu(count, cap, chosen)
                if candidate is None:
                    break
                chosen.append(candidate)
            if len(chosen) < job.spec.gpus:
                continue  # stays in the global queue
            for g in chosen:
                count[g] += 1
            home[job.job_id] = tuple(sorted(chosen))
        self._home = home

    def place(
        self, ranking: Ranking, jobs: Mapping[str, JobState], cluster: ClusterState, now: float
    ) -> Placement:
        terminate = ranking.terminate
        self.assign(jobs, cluster, terminate)
        home = self._home
        claimed: set[int] = set()
        runs: dict[str, tuple[int, ...]] = {}
        if not ranking.preempt:
            for job_id, job in jobs.items():
                if job.is_running and job_id not in terminate:
                    runs[job_id] = home[job_id]
                    claimed.update(home[job_id])
        for job_id in ranking.order:
            gpus = home.get(job_id)
            if gpus is None or job_id in runs or claimed.intersection(gpus):
                continue
            runs[job_id] = gpus
            claimed.update(gpus)
        launch = {j: g for j, g in runs.items() if not jobs[j].is_running}
        suspend = tuple(
            j for j, job in jobs.items() if job.is_running and j not in runs and j not in terminate
        )
        return Placement(allocation=runs, plan=Plan(launch=launch, suspend=suspend, terminate=dict(terminate)))


def _find_available_gpu(count: list[int], cap: int, exclude: list[int]) -> int | None:
    """Algorithm 2: the GPU with the fewest jobs among those with fewer than ``cap`` (first wins ties)."""
    best: int | None = None
    for g, n in enumerate(count):
        if n < cap and g not in exclude and (best is None or n < count[best]):
            best = g
    return best
