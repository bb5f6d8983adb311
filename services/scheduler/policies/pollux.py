"""Pollux (Qiao et al., OSDI '21, §4): GPU counts that maximise a fairness-weighted mean of goodput
speed-ups, re-chosen every round (elastic re-allocation).

Each round, for every job ``j`` and every GPU count ``a`` it may hold, ``SPEEDUP_j(a)`` is the
job's best goodput on ``a`` GPUs (packed on as few nodes as the largest node allows) over its best
goodput on one GPU (``services.core.goodput``: throughput x statistical efficiency from the job's
gradient noise scale, the latest it reported in ``JobState.grad_noise_scale``, else its profile's
value at the start of training). Pollux picks the counts that maximise

    FITNESS_p(A) = ( 1/J * sum_j (PENALTY_j(A_j) * SPEEDUP_j(A_j) + eps) ^ p ) ^ (1/p)

* ``p`` (``fairness_p``, default -1 as in adaptdl's ``simulator/pollux.py``): a power mean, more
  negative is fairer (a job with no GPU drags the mean down most, so every job gets some before any
  gets many); ``p = 1`` is the plain sum of speed-ups, ``p = 0`` the geometric mean.
* restart penalty (adaptdl ``simulator/pollux.py``, ``_evaluate``): a job whose count would change
  (a waiting job that would start, a running job that would grow or shrink) has its speed-up
  scaled by ``max(age - restarts * delay, 0) / (age + delay)``, ``delay = restart_delay_s`` (30 s),
  age the time since submission and restarts its preemptions so far: young and often-restarted
  jobs are moved less.

Search. Pollux searches with a genetic algorithm (NSGA-II over job x node matrices, §4.2). Here a
**greedy marginal-gain allocation** stands in (documented simplification, deterministic with no
RNG at all): GPUs are handed out one move at a time, each move taking a job from its count ``a``
to the next count it may hold (``spec.gpus`` from 0, else ``a + 1``), or straight back to its
current count (a jump over the restart penalty), whichever gains most fitness per GPU; the best
move over all jobs wins, ties by submit time then ``seq``; it stops when no GPU is left or no move
gains. Placement (which GPUs) is the placement policy's, as in every Roundhouse policy; the node
count a speed-up assumes is the fewest that can hold the GPUs. A round costs O(GPUs x jobs) moves
(Pollux workload 6 on 64 GPUs, 8 active jobs on average, up to 33: 12 ms a round on average, 42 ms
at the 95th percentile, on a loaded 2-core machine).

Jobs without a goodput profile (``spec.model`` not in ``services.core.goodput.PROFILES``) take
``count ** fallback_exponent`` as their speed-up; rigid jobs (``spec.max_gpus`` unset) may hold 0
or ``spec.gpus`` GPUs; elastic ones 0 or ``spec.gpus`` .. ``spec.max_gpus`` (also capped at the
profile's ``max_replicas``, beyond which the batch size limit leaves a GPU without work).

Output: ``Ranking.gpu_targets`` holds every allocated job's count; the order puts allocated jobs
first (running ones that keep their count, then the rest by submit time) and the unallocated ones
last, running ones at the very end, so placement suspends exactly those when their GPUs are needed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from services.core.decisions import Ranking
from services.core.goodput import GoodputProfile, profile_for
from services.core.protocols import Trigger
from services.core.registry import SCHEDULING
from services.core.state import UNAVAILABLE, ClusterState, JobState

_EPS = 1e-3
"""adaptdl's floor on each speed-up inside the power mean (a job with no GPU counts as 0.001)."""


@dataclass(frozen=True, slots=True)
class _Curve:
    """One job's penalised speed-up for every count it may hold, keyed by GPU count (0 included)."""

    job_id: str
    counts: tuple[int, ...]
    """Counts it may hold, ascending, without 0."""
    speedup: dict[int, float]
    current: int
    tie: tuple[float, int, str]


@SCHEDULING.register("pollux")
@dataclass(frozen=True, kw_only=True, slots=True)
class PolluxPolicy:
    """Goodput-maximising elastic GPU counts, re-chosen each round (Pollux §4)."""

    name: ClassVar[str] = "pollux"
    triggers: ClassVar[Trigger] = Trigger.TIMER
    preemptive: ClassVar[bool] = True

    fairness_p: float = -1.0
    """Exponent of the power mean over jobs' speed-ups, <= 1 (Pollux's p; -1 in its evaluation)."""
    restart_delay_s: float = 30.0
    """Seconds a re-allocation costs a job in the restart penalty (adaptdl's simulator: 30)."""
    fallback_exponent: float = 0.8
    """Speed-up ``count ** x`` of a job without a goodput profile, in (0, 1]."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.fairness_p) and self.fairness_p <= 1.0):
            raise ValueError(f"fairness_p must be a finite number <= 1, got {self.fairness_p}")
        if not (math.isfinite(self.restart_delay_s) and self.restart_delay_s >= 0):
            raise ValueError(f"restart_delay_s must be >= 0, got {self.restart_delay_s}")
        if not 0.0 < self.fallback_exponent <= 1.0:
            raise ValueError(f"fallback_exponent must be in (0, 1], got {self.fallback_exponent}")

    # --- the objective ----------------------------------------------------------------------------
    def term(self, speedup: float) -> float:
        """A job's contribution to the fitness, increasing in its speed-up (the power mean is a
        monotone function of the sum of these, so maximising the sum maximises the mean)."""
        x = speedup + _EPS
        p = self.fairness_p
        if p == 0.0:
            return math.log(x)
        return math.pow(x, p) if p > 0 else -math.pow(x, p)

    def penalty(self, job: JobState, now: float) -> float:
        """The restart penalty factor of a job whose allocation changes (1 = none)."""
        age = max(now - job.submit_time, 0.0)
        delay = self.restart_delay_s
        if age + delay <= 0:
            return 1.0
        return max(age - job.preemptions * delay, 0.0) / (age + delay)

    def speedup(self, job: JobState, gpus: int, node_gpus: int) -> float:
        """``SPEEDUP_j(gpus)`` without the restart penalty."""
        if gpus <= 0:
            return 0.0
        profile = profile_for(job.spec.model)
        if profile is None:
            return math.pow(gpus, self.fallback_exponent)
        nodes = -(-gpus // max(node_gpus, 1))
        return profile.speedup(nodes, gpus, _noise_scale(job, profile))

    # --- the search -------------------------------------------------------------------------------
    def rank(self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Ranking:
        # GPUs a draining node keeps free are held by the UNAVAILABLE marker: nobody may get them.
        capacity = cluster.total_gpus - sum(1 for held in cluster.gpu_jobs if UNAVAILABLE in held)
        node_gpus = cluster.largest_node_gpus
        curves = [self._curve(job, capacity, node_gpus, now) for job in jobs.values()]
        alloc = self._allocate(curves, capacity)
        order = sorted(curves, key=lambda c: _order_key(c, alloc[c.job_id]))
        targets = {c.job_id: alloc[c.job_id] for c in curves if alloc[c.job_id] > 0}
        return Ranking(order=tuple(c.job_id for c in order), gpu_targets=targets)

    def _curve(self, job: JobState, capacity: int, node_gpus: int, now: float) -> _Curve:
        spec = job.spec
        low = spec.gpus
        high = spec.max_gpus if spec.max_gpus is not None else low
        profile = profile_for(spec.model)
        if profile is not None and spec.max_gpus is not None:
            high = max(low, min(high, profile.max_replicas))
        high = min(high, capacity)
        counts = tuple(range(low, high + 1))
        current = len(job.gpus) if job.is_running else 0
        factor = self.penalty(job, now)
        raw = self._speedups(job, profile, counts, node_gpus)
        speedup = {0: 0.0}
        for count, value in zip(counts, raw, strict=True):
            speedup[count] = value if count == current else value * factor
        return _Curve(job.job_id, counts, speedup, current, (job.submit_time, job.seq, job.job_id))

    def _speedups(
        self, job: JobState, profile: GoodputProfile | None, counts: tuple[int, ...], node_gpus: int
    ) -> list[float]:
        """``speedup`` for each of ``counts``, with the one-GPU baseline looked up once."""
        if profile is None:
            return [math.pow(count, self.fallback_exponent) for count in counts]
        noise = _noise_scale(job, profile)
        base = profile.best(1, 1, noise)
        out: list[float] = []
        for count in counts:
            here = profile.best(-(-count // max(node_gpus, 1)), count, noise)
            out.append(0.0 if here is None or base is None else here.goodput / base.goodput)
        return out

    def _allocate(self, curves: list[_Curve], capacity: int) -> dict[str, int]:
        alloc = {c.job_id: 0 for c in curves}
        free = capacity
        while free > 0:
            best: tuple[float, tuple[float, int, str]] | None = None
            move: tuple[_Curve, int] | None = None
            for curve in curves:
                have = alloc[curve.job_id]
                for target in self._moves(curve, have, free):
                    gain = (self.term(curve.speedup[target]) - self.term(curve.speedup[have])) / (target - have)
                    if gain <= 0:
                        continue
                    # Highest gain first; ties by submit time, seq, id (earlier first).
                    key = (-gain, curve.tie)
                    if best is None or key < best:
                        best, move = key, (curve, target)
            if move is None:
                break
            curve, target = move
            free -= target - alloc[curve.job_id]
            alloc[curve.job_id] = target
        return alloc

    @staticmethod
    def _moves(curve: _Curve, have: int, free: int) -> list[int]:
        """Counts a job may move to from ``have`` with ``free`` GPUs left: the next one, and its
        current count (skipping the penalised counts in between)."""
        out: list[int] = []
        step = curve.counts[0] if have == 0 and curve.counts else have + 1
        if curve.counts and step <= curve.counts[-1] and step - have <= free:
            out.append(step)
        if curve.current > max(have, step) and curve.current - have <= free:
            out.append(curve.current)
        return out


def _noise_scale(job: JobState, profile: GoodputProfile) -> float:
    reported = job.grad_noise_scale
    return reported if reported is not None else profile.noise_scale_at(0.0)


def _order_key(curve: _Curve, count: int) -> tuple[int, float, int, str]:
    # Allocated and unchanged, allocated and changed or starting, waiting, running but unallocated.
    kept = count == curve.current
    group = (0 if kept else 1) if count > 0 else (3 if curve.current > 0 else 2)
    return (group, *curve.tie)
