"""Gavel's round-based mechanism (OSDI '20, §5): from an allocation ``X`` to this round's types.

The LP (``services.core.gavel``) says what fraction of time each job should spend on each GPU type;
a round can only run each job on one type or not at all. Gavel turns one into the other with
priorities (``scheduler/scheduler.py``, ``_schedule_jobs_on_workers_helper``): the priority of a
(job, type) pair is ``X[j][t] / received[j][t]``, where ``received`` is the fraction of the job's
time in the system it has spent on that type so far (a pair never served has infinite priority).
Pairs are taken in decreasing priority; a pair is granted if its job has no type yet this round and
the type still has ``scale`` GPUs left. Over many rounds each job's time on each type converges to
``X``.

Deviations, each for a reason:

* ``received`` is kept in seconds, not rounds: the simulator's and the live scheduler's rounds can
  be cut short by fill rounds, and seconds mean the same in both. It lives in the mechanism object
  (Gavel keeps it in its scheduler too): a scheduler that restarts starts it afresh, which only
  makes every job look unserved for one round.
* ``fill`` (default on): GPUs left after the pairs go to waiting jobs, fastest type first, so a round
  never idles GPUs a job could use (Gavel's LP usually fills the cluster anyway; its greedy pass
  does not).
* A job wider than every type (Gavel's LP gives it nothing) is granted ``ANY_TYPE`` when enough
  GPUs are left after everyone else: it runs across types, fastest first, at the slowest one's speed,
  rather than never.
* The remaining run time FTF and makespan need is the job's ``expected_duration_s`` (else
  ``default_duration_s``) less the work done: seconds on each type times the job's throughput there,
  from ``received``; a job it has no record of counts its executed seconds at full speed.

Used by both halves of the Gavel policy pair: the scheduling policy ranks by it, the placement
policy puts each job on GPUs of the type it was given. Deterministic: ties break by ``seq``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from services.core.gavel import Allocation, AllocJob, AllocProblem, Objective, allocate
from services.core.heterogeneity import throughput_row
from services.core.lp import load_solver
from services.core.state import UNAVAILABLE, ClusterState, JobState

_MIN_SHARE = 1e-6
ANY_TYPE = "*"
"""The grant of a job wider than every GPU type: it runs across types (at the slowest one's speed)."""


@dataclass(frozen=True, slots=True)
class RoundDecision:
    allocation: Allocation
    assignment: Mapping[str, str]
    """Job id -> the GPU type it runs on this round (jobs not here wait)."""
    order: tuple[str, ...]
    """Every job: those assigned in the order they were granted, then the rest by their best pair."""


def type_capacity(cluster: ClusterState) -> dict[str, int]:
    """GPUs of each type that work may use (a draining node's free GPUs, held by ``UNAVAILABLE``, do not count)."""
    capacity: dict[str, int] = {}
    for gpu, holders in zip(cluster.gpus, cluster.gpu_jobs, strict=True):
        if UNAVAILABLE in holders:
            continue
        capacity[gpu.gpu_type] = capacity.get(gpu.gpu_type, 0) + 1
    return dict(sorted(capacity.items()))


@dataclass(slots=True)
class _Grants:
    """One round's grants so far: GPUs left per type, each granted job's type, the grant order."""

    left: dict[str, int]
    assignment: dict[str, str] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)

    def grant(self, job_id: str, gpu_type: str, taken: Mapping[str, int]) -> None:
        for t, count in taken.items():
            self.left[t] -= count
        self.assignment[job_id] = gpu_type
        self.order.append(job_id)


class RoundMechanism:
    """Gavel's allocation plus priorities, with the per-type service it must remember."""

    def __init__(
        self,
        objective: Objective,
        *,
        heterogeneity_aware: bool = True,
        default_duration_s: float = 3600.0,
        fill: bool = True,
    ) -> None:
        if not default_duration_s > 0:
            raise ValueError(f"default_duration_s must be > 0, got {default_duration_s}")
        load_solver()  # SciPy's import, before the first decision (policies do no I/O while deciding)
        self.objective = objective
        self.heterogeneity_aware = heterogeneity_aware
        self.default_duration_s = default_duration_s
        self.fill = fill
        self._received: dict[str, dict[str, float]] = {}
        self._last_now: float | None = None
        self._rows: dict[str, tuple[tuple[str, ...], tuple[float, ...]]] = {}

    # --- memory --------------------------------------------------------------------------
    def received(self, job_id: str) -> Mapping[str, float]:
        """Seconds ``job_id`` has run on each type, as far as this mechanism saw."""
        return self._received.get(job_id, {})

    def _throughputs(self, job: JobState, types: tuple[str, ...]) -> tuple[float, ...]:
        cached = self._rows.get(job.job_id)
        if cached is None or cached[0] != types:
            spec = job.spec
            cached = (types, throughput_row(types, model=spec.model, throughputs=spec.gpu_throughputs))
            self._rows[job.job_id] = cached
        return cached[1]

    def _observe(self, jobs: Mapping[str, JobState], cluster: ClusterState, types: tuple[str, ...], now: float) -> None:
        """Credit each running job with the time since the last call (or its start) on its slowest type."""
        last = self._last_now
        for job_id in [j for j in self._received if j not in jobs]:
            del self._received[job_id]
            self._rows.pop(job_id, None)
        for job in jobs.values():
            if not job.is_running or not job.gpus:
                continue
            started = job.resumed_at if job.resumed_at is not None else job.last_start_time
            since = max(x for x in (last, started, job.submit_time) if x is not None)
            if now <= since:
                continue
            held = {cluster.gpus[g].gpu_type for g in job.gpus}
            row = dict(zip(types, self._throughputs(job, types), strict=True))
            slowest = min(sorted(held), key=lambda t: row.get(t, 1.0))
            book = self._received.setdefault(job.job_id, {})
            book[slowest] = book.get(slowest, 0.0) + (now - since)
        self._last_now = now if last is None else max(last, now)

    # --- one round -----------------------------------------------------------------------
    def _remaining(self, job: JobState, types: tuple[str, ...], row: tuple[float, ...]) -> tuple[float, float]:
        duration = job.spec.expected_duration_s or self.default_duration_s
        book = self._received.get(job.job_id)
        if book is None:
            done = job.executed_time
        else:
            speed = dict(zip(types, row, strict=True))
            done = sum(seconds * speed.get(t, 1.0) for t, seconds in book.items())
        return duration, max(1.0, duration - done)

    def problem(self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> AllocProblem:
        """The allocation LP's input for ``jobs`` on ``cluster`` at ``now`` (jobs in ``seq`` order)."""
        capacity = type_capacity(cluster)
        types = tuple(capacity)
        rows = []
        for job in sorted(jobs.values(), key=lambda j: (j.seq, j.job_id)):
            row = self._throughputs(job, types)
            duration, remaining = self._remaining(job, types, row)
            rows.append(AllocJob(
                job_id=job.job_id, scale=job.gpus_requested, throughputs=row, remaining_s=remaining,
                elapsed_s=max(0.0, now - job.submit_time), duration_s=duration,
            ))  # fmt: skip
        return AllocProblem(types=types, capacity=tuple(capacity.values()), jobs=tuple(rows))

    def decide(self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> RoundDecision:
        """Update the memory to ``now`` and grant this round's (job, type) pairs."""
        types = tuple(type_capacity(cluster))
        self._observe(jobs, cluster, types, now)
        problem = self.problem(jobs, cluster, now)
        if self.objective is Objective.MAX_MIN_FAIRNESS:
            # Times do not enter max-min fairness: leave them out, so that rounds in which no job came
            # or went ask the memoised LP the same question (a 6-minute round solves only on churn).
            problem = AllocProblem(problem.types, problem.capacity, tuple(
                AllocJob(j.job_id, j.scale, j.throughputs, j.weight) for j in problem.jobs
            ))  # fmt: skip
        elif self.objective is Objective.MAKESPAN:  # only the remaining time enters it
            problem = AllocProblem(problem.types, problem.capacity, tuple(
                AllocJob(j.job_id, j.scale, j.throughputs, j.weight, j.remaining_s) for j in problem.jobs
            ))  # fmt: skip
        allocation = allocate(problem, self.objective, heterogeneity_aware=self.heterogeneity_aware)
        grants = _Grants(dict(zip(problem.types, problem.capacity, strict=True)))
        best = self._grant_pairs(jobs, allocation, problem.types, now, grants)
        rest = sorted(
            (j for j in jobs.values() if j.job_id not in grants.assignment),
            key=lambda j: (best.get(j.job_id, (math.inf, 0.0, j.seq, "")), j.seq),
        )
        if self.fill:
            self._fill(rest, problem.types, grants)
        self._across_types(rest, problem, grants)
        order = grants.order + [j.job_id for j in rest if j.job_id not in grants.assignment]
        return RoundDecision(allocation=allocation, assignment=grants.assignment, order=tuple(order))

    def _grant_pairs(
        self,
        jobs: Mapping[str, JobState],
        allocation: Allocation,
        types: tuple[str, ...],
        now: float,
        grants: _Grants,
    ) -> dict[str, tuple[float, float, int, str]]:
        """Gavel's greedy pass: (job, type) pairs by decreasing ``X / received``; each job's best key."""
        pairs: list[tuple[float, float, int, str, str]] = []
        best: dict[str, tuple[float, float, int, str]] = {}
        for job in jobs.values():
            alive = max(now - job.submit_time, 1e-9)
            served = self._received.get(job.job_id, {})
            for t in types:
                share = allocation[job.job_id][t]
                if share < _MIN_SHARE:
                    continue
                fraction = served.get(t, 0.0) / alive
                priority = share / fraction if fraction > 0 else math.inf
                key = (-priority, -share, job.seq, t)
                pairs.append((*key, job.job_id))
                if job.job_id not in best or key < best[job.job_id]:
                    best[job.job_id] = key
        pairs.sort()
        for *_, gpu_type, job_id in pairs:
            need = jobs[job_id].gpus_requested
            if job_id not in grants.assignment and grants.left[gpu_type] >= need:
                grants.grant(job_id, gpu_type, {gpu_type: need})
        return best

    def _fill(self, rest: list[JobState], types: tuple[str, ...], grants: _Grants) -> None:
        """GPUs left after the pairs go to waiting jobs, each on its fastest type with room."""
        for job in rest:
            speeds = self._throughputs(job, types) if self.heterogeneity_aware else None
            row = dict(zip(types, speeds or (1.0,) * len(types), strict=True))
            for t in sorted(types, key=lambda t: (-row[t], t)):
                if row[t] > 0 and grants.left[t] >= job.gpus_requested:
                    grants.grant(job.job_id, t, {t: job.gpus_requested})
                    break

    def _across_types(self, rest: list[JobState], problem: AllocProblem, grants: _Grants) -> None:
        """A job wider than every type (Gavel cannot run it) gets ``ANY_TYPE`` if enough GPUs are left."""
        widest = max(problem.capacity, default=0)
        for job in rest:
            need = job.gpus_requested
            if job.job_id in grants.assignment or need <= widest or need > sum(grants.left.values()):
                continue
            speed = dict(zip(problem.types, self._throughputs(job, problem.types), strict=True))
            taken: dict[str, int] = {}
            for t in sorted(problem.types, key=lambda t: (-speed[t], t)):
                taken[t] = min(need, grants.left[t])
                need -= taken[t]
            grants.grant(job.job_id, ANY_TYPE, taken)


def mechanism_from_options(
    objective: str, heterogeneity_aware: object, default_duration_s: float, fill: object
) -> RoundMechanism:
    """A :class:`RoundMechanism` from a policy's options, each checked with a message that says why."""
    try:
        parsed = Objective(objective)
    except ValueError:
        valid = ", ".join(o.value for o in Objective)
        raise ValueError(f"objective must be one of {valid}, got {objective!r}") from None
    for name, value in (("heterogeneity_aware", heterogeneity_aware), ("fill", fill)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be true or false, got {value!r}")
    if isinstance(default_duration_s, bool) or not isinstance(default_duration_s, int | float):
        raise TypeError(f"default_duration_s must be a number, got {default_duration_s!r}")
    return RoundMechanism(
        parsed, heterogeneity_aware=bool(heterogeneity_aware), default_duration_s=float(default_duration_s),
        fill=bool(fill),
    )  # fmt: skip


class GavelPolicyBase:
    """The options both halves of the ``gavel`` policy pair take, and the mechanism built from them
    (the scheduling policy ranks with it, the placement policy places with it: same options, same
    decisions)."""

    def __init__(
        self,
        *,
        objective: str = "max-min-fairness",
        heterogeneity_aware: bool = True,
        default_duration_s: float = 3600.0,
        fill: bool = True,
    ) -> None:
        self.mechanism: RoundMechanism = mechanism_from_options(
            objective, heterogeneity_aware, default_duration_s, fill
        )
