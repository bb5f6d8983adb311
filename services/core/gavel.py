"""Gavel's heterogeneity-aware allocations (Narayanan et al., OSDI '20, §3-4), as LPs for HiGHS.

An allocation ``X[j][t]`` is the fraction of time job ``j`` should run on GPU type ``t`` (with its
``scale`` GPUs). Every objective shares Gavel's constraints (``scheduler/policies/policy.py``,
``get_base_constraints``): ``0 <= X <= 1``, ``sum_t X[j][t] <= 1`` (a job runs on one type at a
time) and ``sum_j scale_j X[j][t] <= N_t`` (a type's GPUs are not oversubscribed). A job's effective
throughput is ``sum_t throughput[j][t] X[j][t]`` (``services.core.heterogeneity`` gives the
throughputs, relative to V100). Objectives, after stanford-futuredata/gavel ``scheduler/policies/``:

``max-min-fairness`` (``max_min_fairness.py``, ``MaxMinFairnessPolicyWithPerf``): Gavel's
    heterogeneity-aware LAS, the policy Blox implements (Blox Table 1). Maximise the smallest
    ``scale_j x throughput_j(X) / (weight_j x proportional_j)`` where ``proportional_j`` is the job's
    throughput on an equal split of every type (``ProportionalPolicy``).
``finish-time-fairness`` (``finish_time_fairness.py``, Themis' metric): minimise the largest
    ``rho_j = (elapsed_j + remaining_j / throughput_j(X)) / isolated_j``, ``isolated_j`` being the
    job's run time on an equal 1/N share of the cluster. Not an LP in ``X``; for a fixed ``rho`` the
    constraints are linear, so this bisects on ``rho`` over max-min LPs (Gavel uses cvxpy's
    quasi-convex ``inv_pos`` form).
``makespan`` (``min_total_duration.py``): minimise the time the last job finishes, i.e. maximise
    the smallest ``throughput_j(X) / remaining_j``.

``heterogeneity_aware=False`` gives each objective's agnostic baseline the way Gavel builds its
own (``MaxMinFairnessPolicy``): every job's throughput is the same on every type, so the LP splits
time without regard to speed.

Max-min LPs have many optima; after the first solve a second LP keeps every job at the optimal
minimum (less 1e-6) and maximises the sum of the same normalised throughputs, so spare capacity is
used (a one-step version of Gavel's water filling, ``max_min_fairness_water_filling.py``) and the
answer does not depend on which vertex the solver happened to reach first.

Size: ``jobs x types + 1`` variables and ``2 x jobs + types`` rows; 500 jobs on 3 types solve in
~0.1 s (max-min, makespan) and ~1 s (FTF's bisection) on a loaded 2-core machine
(``tests/unit/core/test_gavel_lp.py`` bounds it).
"""

from __future__ import annotations

import enum
import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.core.lp import LinearProgram, LpError, solve


class Objective(enum.StrEnum):
    MAX_MIN_FAIRNESS = "max-min-fairness"
    FINISH_TIME_FAIRNESS = "finish-time-fairness"
    MAKESPAN = "makespan"


@dataclass(frozen=True, slots=True)
class AllocJob:
    """One job as the allocation LP sees it."""

    job_id: str
    scale: int
    """GPUs it runs on (Gavel's scale factor)."""
    throughputs: tuple[float, ...]
    """Relative throughput on each type, in the problem's ``types`` order."""
    weight: float = 1.0
    remaining_s: float = 1.0
    """Run time left at throughput 1.0 (the reference type), for FTF and makespan."""
    elapsed_s: float = 0.0
    """Seconds since it arrived, for FTF."""
    duration_s: float = 1.0
    """Whole run time at throughput 1.0, for FTF's isolated time."""


@dataclass(frozen=True, slots=True)
class AllocProblem:
    types: tuple[str, ...]
    capacity: tuple[int, ...]
    """GPUs of each type, in ``types`` order."""
    jobs: tuple[AllocJob, ...]


Allocation = Mapping[str, Mapping[str, float]]
"""``X[job_id][gpu_type]``: fraction of time on that type."""

_FLOOR = 1e-9
_KEEP_MIN = 1e-6
_CACHE_SIZE = 4
_cache: OrderedDict[tuple[object, ...], Allocation] = OrderedDict()


def allocate(problem: AllocProblem, objective: Objective, *, heterogeneity_aware: bool = True) -> Allocation:
    """The allocation of ``objective`` for ``problem``; jobs that fit no type get all zeros.

    Results are memoised for the last few distinct problems: in one process (the simulator) the
    scheduling and the placement halves of Gavel ask the same question each round.
    """
    key = (problem, objective, heterogeneity_aware)
    hit = _cache.get(key)
    if hit is not None:
        _cache.move_to_end(key)
        return hit
    if not heterogeneity_aware:
        problem = AllocProblem(
            problem.types,
            problem.capacity,
            tuple(
                AllocJob(j.job_id, j.scale, (1.0,) * len(problem.types), j.weight, j.remaining_s, j.elapsed_s,
                         j.duration_s)
                for j in problem.jobs
            ),
        )  # fmt: skip
    if objective is Objective.MAX_MIN_FAIRNESS:
        result = _max_min_fairness(problem)
    elif objective is Objective.MAKESPAN:
        result = _makespan(problem)
    else:
        result = _finish_time_fairness(problem)
    _cache[key] = result
    if len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return result


def _fits(problem: AllocProblem, job: AllocJob, t: int) -> bool:
    return job.scale <= problem.capacity[t] and job.throughputs[t] > 0


def _proportional(problem: AllocProblem, job: AllocJob) -> float:
    """Gavel's ``ProportionalPolicy`` throughput: time split over types in proportion to their size."""
    total = sum(problem.capacity)
    return sum(tp * n / total for tp, n in zip(job.throughputs, problem.capacity, strict=True)) if total else 0.0


def _max_min(problem: AllocProblem, coef: Sequence[Sequence[float]], *, spare: bool = True) -> tuple[float, Allocation]:
    """Maximise ``min_j sum_t coef[j][t] X[j][t]`` (jobs that fit nowhere are left out of the min),
    then (``spare``) the sum of the same terms with every job kept at that minimum. Returns (minimum, X)."""
    types = problem.types
    n_types = len(types)
    jobs = problem.jobs
    z = len(jobs) * n_types
    lp = LinearProgram(n_vars=z + 1)
    lp.upper = [1.0] * z + [None]
    placeable: list[int] = []
    for j, job in enumerate(jobs):
        base = j * n_types
        for t in range(n_types):
            if not _fits(problem, job, t):
                lp.upper[base + t] = 0.0
        if any(lp.upper[base + t] for t in range(n_types)):
            placeable.append(j)
        lp.add_row([(base + t, 1.0) for t in range(n_types)], 1.0)
    for t in range(n_types):
        lp.add_row([(j * n_types + t, float(job.scale)) for j, job in enumerate(jobs)], float(problem.capacity[t]))
    if not placeable:
        return 0.0, {job.job_id: dict.fromkeys(types, 0.0) for job in jobs}
    share_rows = []
    for j in placeable:
        terms = [(j * n_types + t, -coef[j][t]) for t in range(n_types)]
        share_rows.append(terms)
        lp.add_row([*terms, (z, 1.0)], 0.0)  # z <= sum_t coef X
    lp.c[z] = -1.0
    first = solve(lp)
    best = first.x[z]
    if not spare:
        return best, _unflatten(problem, first.x[:z])
    # Second stage: keep everyone at the optimal minimum, use what is left.
    keep = LinearProgram(n_vars=z, upper=lp.upper[:z])
    for j in range(len(jobs)):
        keep.add_row([(j * n_types + t, 1.0) for t in range(n_types)], 1.0)
    for t in range(n_types):
        keep.add_row([(j * n_types + t, float(job.scale)) for j, job in enumerate(jobs)], float(problem.capacity[t]))
    floor = best * (1.0 - _KEEP_MIN)
    for terms in share_rows:
        keep.add_row(terms, -floor)  # sum_t coef X >= floor
        for var, c in terms:
            keep.c[var] += c  # minimise -sum(coef X)
    try:
        x = solve(keep).x
    except LpError:  # numerically tight: the first stage's answer is still optimal for the min
        x = first.x[:z]
    return best, _unflatten(problem, x)


def _unflatten(problem: AllocProblem, x: Sequence[float]) -> Allocation:
    n_types = len(problem.types)
    return {
        job.job_id: {t: min(1.0, max(0.0, x[j * n_types + i])) for i, t in enumerate(problem.types)}
        for j, job in enumerate(problem.jobs)
    }


def _max_min_fairness(problem: AllocProblem) -> Allocation:
    coef = []
    for job in problem.jobs:
        prop = _proportional(problem, job)
        scale = job.scale / (job.weight * prop) if prop > 0 else 0.0
        coef.append([tp * scale for tp in job.throughputs])
    return _max_min(problem, coef)[1]


def _makespan(problem: AllocProblem) -> Allocation:
    coef = [[tp / max(job.remaining_s, _FLOOR) for tp in job.throughputs] for job in problem.jobs]
    return _max_min(problem, coef)[1]


def _isolated_s(problem: AllocProblem, job: AllocJob) -> float:
    """Run time on an equal 1/N share of the cluster: all the time if the share holds ``scale``
    GPUs, else that fraction of the time; the share's GPUs split over types by their size."""
    total = sum(problem.capacity)
    n = max(1, len(problem.jobs))
    if total == 0:
        return math.inf
    fraction = min(1.0, total / (n * job.scale))
    rate = fraction * _proportional(problem, job)
    return job.duration_s / rate if rate > 0 else math.inf


_BISECT_STEPS = 24
_RHO_TOLERANCE = 0.005
"""Bisection stops when the best finish-time ratio is known within 0.5%."""


def _finish_time_fairness(problem: AllocProblem) -> Allocation:
    isolated = [_isolated_s(problem, job) for job in problem.jobs]

    def needed_rates(rho: float) -> list[float] | None:
        rates = []
        for job, iso in zip(problem.jobs, isolated, strict=True):
            if not math.isfinite(iso):  # fits nowhere: left out of the min by ``_max_min``
                rates.append(1.0)
                continue
            budget = rho * iso - job.elapsed_s
            if budget <= 0:
                return None
            rates.append(max(job.remaining_s, _FLOOR) / budget)
        return rates

    def coefficients(rho: float) -> list[list[float]] | None:
        rates = needed_rates(rho)
        if rates is None:
            return None
        return [[tp / r for tp in job.throughputs] for job, r in zip(problem.jobs, rates, strict=True)]

    def feasible(rho: float) -> bool:
        # One LP per probe, without the second stage: only whether everyone can reach its rate matters.
        coef = coefficients(rho)
        return coef is not None and _max_min(problem, coef, spare=False)[0] >= 1.0 - 1e-9

    finite = [
        (job.elapsed_s + 1.0) / iso for job, iso in zip(problem.jobs, isolated, strict=True) if math.isfinite(iso)
    ]
    low = max(finite, default=1.0)
    high = max(low * 2.0, 2.0)
    steps = 0
    while not feasible(high):  # grow until feasible (it is for large enough rho)
        low, high = high, high * 4.0
        steps += 1
        if steps > 60:  # nothing fits anywhere: fall back to max-min fairness's split
            return _max_min_fairness(problem)
    for _ in range(_BISECT_STEPS):
        if high / low < 1 + _RHO_TOLERANCE:
            break
        mid = math.sqrt(low * high)
        if feasible(mid):
            high = mid
        else:
            low = mid
    coef = coefficients(high)
    assert coef is not None  # feasible(high) held
    return _max_min(problem, coef)[1]
