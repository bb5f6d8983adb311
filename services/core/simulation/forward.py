"""Forward simulation from a snapshot: what a set of policies would do from *now* on.

Blox §5.2's automatic scheduler synthesizer: "every ten rounds ... we run a simulation in parallel for
all possible combinations with the same cluster setup and the available jobs on the cluster ... We
use this simulation to collect the metrics of importance". This module is that simulation, for one
set of policies; the synthesizer runs it for each candidate combination
(``services.scheduler.policies.candidates``). It is pure (virtual clock, no I/O), so a policy in a
live service can call it:

1. :func:`take_snapshot` copies what matters of the active jobs (running and waiting), the jobs held
   by admission, and the cluster's shape into plain, picklable values (:class:`Snapshot`); it reads
   its inputs only. It takes a live owner's ``JobState`` objects (the scheduler's book) as well as
   the simulator's own.
2. :func:`simulate` runs a fresh :class:`~services.core.simulation.engine.Simulator` with the given
   policy objects from that snapshot (``Simulator.start_from``) and returns the metrics of the
   snapshot's jobs (:class:`ForwardResult`).

How the snapshot becomes a simulation (choices where Blox is silent, and why):

* **Clock.** Simulated time 0 is the snapshot's ``now``; every time of a job (submit, first start,
  queued since) is stored relative to ``now`` (so mostly negative), and JCT and responsiveness come
  out on the real clock: JCT = finish - submit, including the time the job already spent before the
  snapshot.
* **Remaining work.** A job's total work is ``work_s`` and its work done ``done_s`` when the snapshot
  comes from the simulator (``SimJobState``: exact, in the job's standalone seconds, whatever its
  placement rate was); from a live scheduler it is ``spec.expected_duration_s`` and
  ``executed_time`` (wall seconds at the requested GPU count: the same estimate SRTF uses,
  ``services.scheduler.policies.estimates``). A live job without ``expected_duration_s`` cannot be
  simulated: :class:`MissingDurationError`.
* **Progress that policies read** is restored too: attained service (LAS), executed time (SRTF's
  remaining time), waits and promotion state (LAS's starvation guard), preemption counts. Without
  it every job would look new and LAS would rank a job that ran for days with a fresh one.
* **Order.** Jobs get simulator indexes in (submit time, seq) order, so FIFO and every tie-break
  see the same order as in the snapshot. The engine names jobs ``str(index)``;
  :attr:`ForwardJob.job_id` keeps the real id.
* **Running jobs keep running** on the GPUs they hold at t=0, with no restore cost (they are not
  being resumed); the first round at t=0 may then preempt them like any round would, paying the
  checkpoint cost. A running job whose GPUs are unknown to the snapshot's cluster, or already taken
  by an earlier job (packing), starts out waiting instead. Waiting jobs are admitted; held jobs are
  offered to the admission policy in the first round.
* **What is simulated**: the jobs of the snapshot only, no future arrivals (Blox: "the available
  jobs on the cluster"), until all of them finish (``horizon_s=None``, Blox) or for ``horizon_s``
  seconds. A job still unfinished at the horizon (or stuck: rejected, or stalled) counts as
  finishing at the horizon (at the end of the simulation if there is none): a lower bound of its
  JCT, so policies that leave work undone are not rewarded for it. Its responsiveness is censored
  the same way if it never started.
* **Round triggers**: ``ForwardSettings.triggers`` overrides the scheduling policy's own (the
  synthesizer passes its own, timer rounds only, so the forward run of e.g. SRTF behaves as SRTF
  would under the synthesizer; None keeps the policy's triggers).
* **Costs**: the same :class:`~services.core.costs.CostModel` as any simulation (default costs).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from services.core.costs import CostModel
from services.core.decisions import Ranking
from services.core.packing import PackingModel
from services.core.protocols import AdmissionPolicy, PlacementPolicy, SchedulingPolicy, Trigger
from services.core.simulation.engine import InitialJob, Outcome, SimConfig, Simulator
from services.core.simulation.jobs import SimJobState
from services.core.simulation.packing import PackingSimulator
from services.core.simulation.stats import percentile
from services.core.simulation.workload import TraceJob
from services.core.state import UNAVAILABLE, ClusterState, Gpu, JobState, JobStatus, Node


class MissingDurationError(ValueError):
    """A live job has no ``expected_duration_s``, so its remaining work cannot be simulated."""

    def __init__(self, job_ids: Iterable[str]) -> None:
        ids = sorted(job_ids)
        shown = ", ".join(ids[:5]) + (f" (+{len(ids) - 5} more)" if len(ids) > 5 else "")
        super().__init__(f"forward simulation needs spec.expected_duration_s for job(s) {shown}")
        self.job_ids = tuple(ids)


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardJob(InitialJob):
    """One job of a snapshot as plain values: the engine's ``InitialJob`` (times relative to the
    snapshot's ``now``; ``trace`` has the simulator's index, arrival 0 and ``duration_s`` = total
    work) with the job's real id."""

    job_id: str
    """The job's real id (the simulator calls it ``trace.job_id``, its index)."""

    @property
    def remaining_s(self) -> float:
        return max(0.0, self.trace.duration_s - self.done_s)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything a forward simulation starts from (picklable, independent of the live objects)."""

    now: float
    jobs: tuple[ForwardJob, ...]
    """In simulator index order: (submit time, seq)."""
    nodes: tuple[Node, ...]
    gpus: tuple[Gpu, ...]
    withheld: frozenset[int] = frozenset()
    """Global ids of GPUs that take no new work (their node drains or went silent): module doc."""

    def cluster(self) -> ClusterState:
        """A fresh, empty cluster of the snapshot's shape (withheld GPUs free: a caller places the
        running jobs first, then :meth:`WithholdingCluster.withhold_free`)."""
        if self.withheld:
            return WithholdingCluster(self.nodes, self.gpus, self.withheld)
        return ClusterState(self.nodes, self.gpus)


class WithholdingCluster(ClusterState):
    """A cluster whose withheld GPUs never become free: the ``UNAVAILABLE`` marker takes each one as
    soon as its last job releases it (a running job on a drained node ends; the node stays closed)."""

    __slots__ = ("withheld",)

    def __init__(self, nodes: Iterable[Node], gpus: Iterable[Gpu], withheld: Iterable[int]) -> None:
        super().__init__(nodes, gpus)
        self.withheld = frozenset(withheld)
        unknown = [g for g in self.withheld if not 0 <= g < self.total_gpus]
        if unknown:
            raise ValueError(f"withheld GPUs {sorted(unknown)} are not in the cluster ({self.total_gpus} GPUs)")

    def withhold_free(self) -> None:
        """Hold every free withheld GPU with the marker (after the running jobs took theirs)."""
        free = sorted(g for g in self.withheld if self.is_free(g))
        if free:
            super().assign(UNAVAILABLE, free)

    def release(self, job_id: str, gpu_ids: Iterable[int]) -> None:
        released = tuple(gpu_ids)
        super().release(job_id, released)
        if job_id != UNAVAILABLE:
            back = [g for g in released if g in self.withheld and self.is_free(g)]
            if back:
                super().assign(UNAVAILABLE, back)


def _relative(t: float | None, now: float) -> float | None:
    return None if t is None else t - now


def _forward_job(
    job: JobState, index: int, status: JobStatus, now: float, durations: Mapping[str, float]
) -> ForwardJob:
    trace = job.trace if isinstance(job, SimJobState) else None
    if isinstance(job, SimJobState):
        total, done = job.work_s, job.done_s
    else:
        duration = job.spec.expected_duration_s
        if duration is None:
            duration = durations.get(job.job_id)
        if duration is None:
            raise MissingDurationError([job.job_id])
        total, done = duration, job.executed_time
    done = min(max(0.0, done), total)
    if trace is not None:
        record = replace(trace, index=index, arrival_s=0.0, duration_s=total)
    else:
        spec = job.spec
        record = TraceJob(
            index=index,
            arrival_s=0.0,
            gpus=spec.gpus,
            duration_s=total,
            job_class=spec.job_class,
            user=spec.user,
            model=spec.model,
            cpus=spec.cpus,
            memory_gb=spec.memory_gb,
        )
    return ForwardJob(
        job_id=job.job_id,
        trace=record,
        status=status,
        done_s=done,
        executed_time=job.executed_time,
        attained_service=job.attained_service,
        submit_time=job.submit_time - now,
        gpus=tuple(job.gpus) if status is JobStatus.RUNNING else (),
        first_start_time=_relative(job.first_start_time, now),
        admit_time=_relative(job.admit_time, now),
        queued_since=_relative(job.queued_since, now),
        longest_wait_s=job.longest_wait_s,
        preemptions=job.preemptions,
    )


def take_snapshot(
    jobs: Mapping[str, JobState],
    cluster: ClusterState,
    now: float,
    *,
    held: Sequence[JobState] = (),
    durations: Mapping[str, float] | None = None,
    withheld: Iterable[int] = (),
) -> Snapshot:
    """Copy ``jobs`` (admitted, unfinished: running and waiting), ``held`` (not admitted yet) and
    the cluster's shape. The withheld GPUs are ``withheld`` and every GPU of a node where the
    cluster holds one with the ``UNAVAILABLE`` marker (a round's cluster: module doc). Reads its inputs only. Raises
    :class:`MissingDurationError` for live jobs without ``spec.expected_duration_s`` (all of them
    named), unless ``durations`` gives them one (a caller's estimate, e.g. the ETA's fallback:
    ``services.scheduler.eta``)."""
    durations = durations or {}
    entries: list[tuple[float, int, str, JobState, JobStatus]] = []
    seen: set[str] = set()
    for job in jobs.values():
        if job.status.is_final or job.job_id in seen:
            continue
        status = JobStatus.RUNNING if job.is_running else JobStatus.QUEUED
        entries.append((job.submit_time, job.seq, job.job_id, job, status))
        seen.add(job.job_id)
    for job in held:
        if job.status.is_final or job.job_id in seen:
            continue
        entries.append((job.submit_time, job.seq, job.job_id, job, JobStatus.HELD))
        seen.add(job.job_id)
    entries.sort(key=lambda e: (e[0], e[1], e[2]))
    missing = [
        e[2]
        for e in entries
        if not isinstance(e[3], SimJobState) and e[3].spec.expected_duration_s is None and e[2] not in durations
    ]
    if missing:
        raise MissingDurationError(missing)
    forward = tuple(
        _forward_job(job, index, status, now, durations) for index, (_, _, _, job, status) in enumerate(entries)
    )
    # The marker holds only what was free of a withheld node; its jobs' GPUs are withheld too.
    closed = {cluster.node_of(g) for g, holders in enumerate(cluster.gpu_jobs) if UNAVAILABLE in holders}
    marked = (g.gpu_id for g in cluster.gpus if g.node_id in closed)
    return Snapshot(
        now=now, jobs=forward, nodes=tuple(cluster.nodes.values()), gpus=tuple(cluster.gpus),
        withheld=frozenset((*withheld, *marked)),
    )  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardSettings:
    """How a snapshot is simulated (picklable: a caller may run simulations in other processes)."""

    round_s: float = 300.0
    """Round length (Blox: 300 s); the forward run's rounds fall at now, now + round_s, ..."""
    horizon_s: float | None = None
    """Simulate this long; None (Blox) until every job of the snapshot has finished."""
    costs: CostModel = field(default_factory=CostModel)
    triggers: Trigger | None = None
    """Round triggers of the scheduling policy (``Retriggered``); None keeps the policy's own."""
    fill_between_rounds: bool = False
    """Fill rounds between the policy's rounds (``SimConfig.fill_between_rounds``), as the live
    scheduler runs them by default (the ETA simulates them; the synthesizer, like Blox, does not)."""
    packing: bool = False
    """Run on ``PackingSimulator`` with the default ``PackingModel`` so that a packing placement's
    plans (several jobs on one GPU) are simulated, as the live scheduler's ``packing`` runs them;
    False: the plain engine (such a plan is an error there)."""

    def __post_init__(self) -> None:
        if not self.round_s > 0:
            raise ValueError(f"round_s must be positive, got {self.round_s}")
        if self.horizon_s is not None and not (self.horizon_s > 0 and math.isfinite(self.horizon_s)):
            raise ValueError(f"horizon_s must be a positive number of seconds or None, got {self.horizon_s}")
        # CostModel's default table is a mappingproxy, which cannot be pickled to a worker process.
        object.__setattr__(self, "costs", CostModel(dict(self.costs.models), self.costs.default))


@dataclass(frozen=True, slots=True)
class ForwardResult:
    """One forward run: metrics over the snapshot's jobs, on the real clock."""

    avg_jct_s: float
    p95_jct_s: float
    avg_responsiveness_s: float
    makespan_s: float
    """Seconds from the snapshot until the last of its jobs finished."""
    jobs: int
    finished: int
    """Jobs that finished within the horizon (the others are censored, see the module doc)."""
    preemptions: int
    """Suspensions during the forward run (not counting the jobs' earlier ones)."""
    simulated_s: float
    stalled: bool

    def metric(self, name: str) -> float:
        """The value of metric ``name`` (a field of this result)."""
        if name not in _METRIC_FIELDS:
            raise ValueError(f"forward simulation does not measure {name!r}; valid: {sorted(_METRIC_FIELDS)}")
        value: float = getattr(self, name)
        return value


_METRIC_FIELDS = frozenset({"avg_jct_s", "p95_jct_s", "avg_responsiveness_s", "makespan_s"})
FORWARD_METRICS: frozenset[str] = _METRIC_FIELDS
"""The metrics :class:`ForwardResult` can report (what the synthesizer may optimize)."""


class Retriggered:
    """A scheduling policy with other round triggers; everything else (fast paths included) is the
    base policy's."""

    def __init__(self, base: SchedulingPolicy, triggers: Trigger) -> None:
        self._base = base
        self.name = base.name
        self.triggers = triggers

    def rank(self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Ranking:
        return self._base.rank(jobs, cluster, now)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


def run_forward(
    snapshot: Snapshot,
    *,
    admission: AdmissionPolicy,
    scheduling: SchedulingPolicy,
    placement: PlacementPolicy,
    settings: ForwardSettings,
) -> tuple[Outcome, list[SimJobState | None]]:
    """Run the simulation of :func:`simulate` and return the engine's raw outcome and each
    snapshot job's final simulated state, in snapshot order (None: rejected on arrival), for
    callers that need per-job results (the ETA reads each job's simulated first start)."""
    if settings.triggers is not None:
        scheduling = Retriggered(scheduling, settings.triggers)  # type: ignore[assignment]
    cluster = snapshot.cluster()
    config = SimConfig(
        round_s=settings.round_s,
        max_time_s=settings.horizon_s,
        costs=settings.costs,
        fill_between_rounds=settings.fill_between_rounds,
    )
    simulator: Simulator
    if settings.packing:  # a packing placement's plans put several jobs on one GPU
        simulator = PackingSimulator(
            (), cluster, admission=admission, scheduling=scheduling, placement=placement, config=config,
            packing=PackingModel(),
        )  # fmt: skip
    else:
        simulator = Simulator(
            (), cluster, admission=admission, scheduling=scheduling, placement=placement, config=config
        )
    states = simulator.start_from(snapshot.jobs)
    if isinstance(cluster, WithholdingCluster):
        cluster.withhold_free()  # after the running jobs took their GPUs, before the first round
    return simulator.run(), states


def simulate(
    snapshot: Snapshot,
    *,
    admission: AdmissionPolicy,
    scheduling: SchedulingPolicy,
    placement: PlacementPolicy,
    settings: ForwardSettings | None = None,
) -> ForwardResult:
    """Run these policies forward from ``snapshot`` (module doc) and measure the snapshot's jobs.

    The policies must be fresh objects (a policy may keep state between rounds); the snapshot is
    not changed, so one snapshot serves any number of runs."""
    settings = settings or ForwardSettings()
    out, states = run_forward(
        snapshot, admission=admission, scheduling=scheduling, placement=placement, settings=settings
    )
    censor = settings.horizon_s if settings.horizon_s is not None else out.end_time
    jct: list[float] = []
    responsiveness: list[float] = []
    finished = 0
    preemptions = 0
    last = 0.0
    for fj, job in zip(snapshot.jobs, states, strict=True):
        if job is not None:
            preemptions += job.preemptions - fj.preemptions
        if job is not None and job.status is JobStatus.COMPLETED and job.finish_time is not None:
            end = job.finish_time
            finished += 1
        else:
            end = censor
        first = job.first_start_time if job is not None else None
        jct.append(end - fj.submit_time)
        responsiveness.append((first if first is not None and first <= end else end) - fj.submit_time)
        last = max(last, end)
    jct.sort()
    count = len(jct)
    return ForwardResult(
        avg_jct_s=math.fsum(jct) / count if count else math.nan,
        p95_jct_s=percentile(jct, 95),
        avg_responsiveness_s=math.fsum(responsiveness) / count if count else math.nan,
        makespan_s=last if count else math.nan,
        jobs=count,
        finished=finished,
        preemptions=preemptions,
        simulated_s=out.end_time,
        stalled=out.stalled,
    )


__all__ = [
    "FORWARD_METRICS",
    "ForwardJob",
    "ForwardResult",
    "ForwardSettings",
    "MissingDurationError",
    "Retriggered",
    "Snapshot",
    "WithholdingCluster",
    "run_forward",
    "simulate",
    "take_snapshot",
]
