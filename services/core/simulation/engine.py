"""The discrete-event simulator: the policies of ``services.core`` on a virtual clock.

Events: job arrivals (from the workload stream), job completions (exact times, *inside* rounds: a
job ends when its work is done, not at the next round edge), and rounds. A round runs on the
timer (every ``round_s``, on the grid 0, round_s, 2*round_s, ... as in Blox) and, if the scheduling
policy's ``triggers`` ask for it (or ``SimConfig.extra_triggers``), right after an arrival or a
completion. A round is ``admit -> rank -> place -> plan diff`` with the very policy objects the
services use and the very round functions (``services.core.round.rank_step`` and ``place_step``, the
scheduler's and the placement service's halves), then the plan is applied: suspensions first
(checkpoint cost), then launches (restore + relaunch cost for resumed jobs), as modelled in
``services.core.costs``. Each job's transitions (admit, launch, suspend, finish) are
``services.core.lifecycle``'s, the functions the scheduler's job book applies to live jobs.

Starting from a state instead of an empty cluster: ``Simulator.start_from`` (forward simulation from
a snapshot, ``services.core.simulation.forward``).

Fast paths (see ``services.core.protocols``): with a sort-keyed scheduling policy the ranking is
kept incrementally (``services.core.ordering.KeyedOrder``); with a ``keeps_running`` placement policy
rounds that cannot change anything are skipped (nothing waiting or held; or, for a non-preemptive
policy, no arrival or completion since the last round) and the timer jumps to the next event.

Determinism: no wall clock, no hash-order iteration, no unseeded randomness; the same workload and
configuration give the same result, bit for bit.
"""

from __future__ import annotations

import gc
import heapq
import math
from array import array
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Protocol

from services.core.costs import CostModel
from services.core.decisions import Plan
from services.core.heterogeneity import HeterogeneityModel
from services.core.lifecycle import admit as admit_job
from services.core.lifecycle import finish as finish_job
from services.core.lifecycle import launch as launch_job
from services.core.lifecycle import suspend as suspend_job
from services.core.network import NetworkModel
from services.core.ordering import KeyedOrder
from services.core.protocols import (
    AdmissionPolicy,
    PlacementPolicy,
    SchedulingPolicy,
    Trigger,
    accepts_all,
    is_preemptive,
    is_sort_keyed,
    keeps_running,
)
from services.core.round import place_step, rank_step
from services.core.simulation.goodput_jobs import goodput_speedup
from services.core.simulation.invariants import InvariantError, check_invariants, snapshot_inputs
from services.core.simulation.jobs import SimClock, SimJobState
from services.core.simulation.workload import TraceJob, checked_in_order
from services.core.state import ClusterState, JobState, JobStatus

INF = math.inf
_heappush = heapq.heappush
"""Bound once: a module attribute lookup on every launch otherwise."""
_RUNNING_STATUS = JobStatus.RUNNING
_COMPLETED_STATUS = JobStatus.COMPLETED
_HELD_STATUS = JobStatus.HELD
NO_TRIGGERS = Trigger(0)
_EPS = 1e-9


class SimulationError(RuntimeError):
    """The simulation cannot go on (a policy returned an impossible plan, a stall, ...)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    """How to run one simulation. Times in seconds of simulated time."""

    round_s: float = 300.0
    """Round length (Blox: 300 s)."""
    track: tuple[int, int] | None = None
    """Inclusive job-index window to measure (Blox: 3000-4000); the run ends when all are done."""
    max_time_s: float | None = None
    """Stop at this simulated time even if jobs remain (they are reported as unfinished)."""
    extra_triggers: Trigger = NO_TRIGGERS
    """Run rounds on these events too, whatever the scheduling policy declares."""
    costs: CostModel = field(default_factory=CostModel)
    debug: bool = False
    """Check invariants after every event and that policies leave their inputs untouched (slow)."""
    fill_between_rounds: bool = False
    """Between the policy's rounds, an arrival or completion it does not react to runs a fill round
    (``services.core.fill``: waiting jobs onto free GPUs in rank order, never preempting), as the live
    scheduler does by default. Off by default: Blox and the papers' simulators start jobs at rounds."""
    fast_paths: bool = True
    """Use the policies' optional fast-path hooks (incremental order, round skipping). False runs
    every round through plain ``rank()``: the same results, slower (a baseline for benchmarks)."""
    record_jobs: bool = False
    """Keep each measured job's index, submit and first-start times and GPUs (``Outcome.job_index``
    ...), for per-job output; off by default: ~32 bytes per job that summaries do not need."""
    start_latency_s: float | tuple[float, ...] = 0.0
    """Control-plane start latency: seconds from when a job could run (decided, its GPUs free and any
    checkpoint of its own written) until it runs, its GPUs held meanwhile; the live cluster's grant,
    lease and process start (``benchmarks/start_latency.py`` measures it). A constant, or measured
    samples: job ``seq`` takes sample ``seq % len`` (deterministic). 0 (the default): instant, as
    the papers' simulators."""
    stop_latency_s: float = 0.0
    """Control-plane stop latency: seconds from when a job's work is done until its completion is
    recorded and its GPUs are free (the worker's report reaching the scheduler). 0 by default."""
    record_reschedules: bool = False
    """Keep, for every relaunch of a measured job after a preemption, how long it was out
    (``Outcome.reschedule_s``, ``Outcome.suspended_s``): FitGpp §3's "intervals between preemptions
    and re-scheduling"; off by default: 16 bytes per preemption."""
    network: NetworkModel | None = None
    """Derive a multi-GPU job's rate from its model's gradient size and the link bandwidths of the
    GPUs it holds (``services.core.network``) instead of the cost model's fixed ``spread_slowdown``.
    None (the default): the fixed slowdown, as before."""
    heterogeneity: bool = False
    """Make a job's progress rate depend on the GPU types it holds: its throughput on the slowest of
    them (``services.core.heterogeneity``: its spec's ``gpu_throughputs``, else its model's in Gavel's
    table). Off by default: every GPU runs every job at the trace's speed, results unchanged."""

    def __post_init__(self) -> None:
        if not self.round_s > 0:
            raise ValueError(f"round length must be positive, got {self.round_s}")
        if self.track is not None and not 0 <= self.track[0] <= self.track[1]:
            raise ValueError(f"track window must be START:END with 0 <= START <= END, got {self.track}")
        latencies = self.start_latency_s if isinstance(self.start_latency_s, tuple) else (self.start_latency_s,)
        if not latencies or not all(math.isfinite(x) and x >= 0 for x in (*latencies, self.stop_latency_s)):
            raise ValueError(
                f"start and stop latencies must be finite and >= 0 (and samples non-empty), got "
                f"start {self.start_latency_s!r}, stop {self.stop_latency_s!r}"
            )


@dataclass(slots=True)
class Outcome:
    """Raw results: per measured job (arrays, in completion order) and cluster totals."""

    jct: array[float] = field(default_factory=lambda: array("d"))
    responsiveness: array[float] = field(default_factory=lambda: array("d"))
    run: array[float] = field(default_factory=lambda: array("d"))
    """Productive wall seconds of each measured job (the 'execution time' of slowdown)."""
    preemptions: array[int] = field(default_factory=lambda: array("q"))
    lost_gpu_s: array[float] = field(default_factory=lambda: array("d"))
    job_class: list[str] = field(default_factory=list)
    job_index: array[int] = field(default_factory=lambda: array("q"))
    """With ``SimConfig.record_jobs`` (else empty): each measured job's trace index, submit time,
    first start (its finish if it never started) and requested GPUs, in the same order as ``jct``."""
    submit: array[float] = field(default_factory=lambda: array("d"))
    first_start: array[float] = field(default_factory=lambda: array("d"))
    gpus: array[int] = field(default_factory=lambda: array("q"))
    reschedule_s: array[float] = field(default_factory=lambda: array("d"))
    """With ``SimConfig.record_reschedules`` (else empty), one entry per relaunch of a measured job
    after a preemption, in launch order: seconds from the preemption decision (the suspend prompt,
    the start of the victim's grace period) to the decision that launches it again (FitGpp §3)."""
    suspended_s: array[float] = field(default_factory=lambda: array("d"))
    """The same relaunches: seconds from the end of the job's own checkpoint hold (its grace period:
    when it gave its GPUs back) to when it runs again, i.e. the time it waited in the queue."""
    first_submit: float = INF
    last_finish: float = 0.0
    measured_total: int = 0
    rejected: int = 0
    unfinished: int = 0
    all_preemptions: int = 0
    all_lost_gpu_s: float = 0.0
    busy_gpu_s: float = 0.0
    productive_gpu_s: float = 0.0
    total_gpus: int = 0
    end_time: float = 0.0
    events: int = 0
    rounds: int = 0
    arrived: int = 0
    completed: int = 0
    stalled: bool = False
    loss_reached: dict[int, float] = field(default_factory=dict)
    """Per measured job with a loss curve and a ``loss_target`` that its loss reached: the exact
    time its smooth loss first got there (job index -> seconds); the target may be reached long
    before the job ends (Hermes' time to 90% of the optimal loss) or end it (loss-termination).
    The target itself counts: a job that ``loss-termination`` ends a little before, within its
    relative threshold of the target, has no entry."""


@dataclass(frozen=True, slots=True, kw_only=True)
class InitialJob:
    """A job already in the system when a simulation starts (``Simulator.start_from``): what it is,
    where it stands and what it went through. Times are on the simulated clock, which starts at 0,
    so a job's past is negative."""

    trace: TraceJob
    """The job (its id is ``trace.job_id``; ``duration_s`` is its total work; ``arrival_s`` is ignored)."""
    status: JobStatus
    """HELD (not admitted yet), QUEUED (admitted, waiting) or RUNNING."""
    submit_time: float
    done_s: float = 0.0
    """Work done, in seconds of the job's standalone run time (of ``trace.duration_s``)."""
    executed_time: float = 0.0
    attained_service: float = 0.0
    gpus: tuple[int, ...] = ()
    """The GPUs a RUNNING job holds."""
    first_start_time: float | None = None
    admit_time: float | None = None
    queued_since: float | None = None
    longest_wait_s: float = 0.0
    preemptions: int = 0


class Progress(Protocol):
    """Where a run reports how far it got (``roundhouse.sim.progress.ProgressBar`` draws a bar): the
    measured jobs done so far and the simulated time, every 1,024 events or so, and once at the end."""

    def update(self, done: int, sim_t: float) -> None: ...

    def close(self, done: int, sim_t: float) -> None: ...


class Simulator:
    """Runs one workload on one cluster with one set of policies."""

    def __init__(
        self,
        workload: Iterable[TraceJob],
        cluster: ClusterState,
        *,
        admission: AdmissionPolicy,
        scheduling: SchedulingPolicy,
        placement: PlacementPolicy,
        config: SimConfig | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.config = config or SimConfig()
        self.cluster = cluster
        self.admission = admission
        self.scheduling = scheduling
        self.placement = placement
        self._workload: Iterator[TraceJob] = checked_in_order(workload)
        self._clock = SimClock()
        self._keyed = (
            KeyedOrder(scheduling, service_line=_service_line)  # type: ignore[arg-type]
            if is_sort_keyed(scheduling) and self.config.fast_paths
            else None
        )
        self._fast = self._keyed is not None and keeps_running(placement)
        self._preemptive = is_preemptive(scheduling)
        self._hetero = HeterogeneityModel([g.gpu_type for g in cluster.gpus]) if self.config.heterogeneity else None
        self._accepts_all = accepts_all(admission) and self.config.fast_paths and not self.config.debug
        """Admit offered jobs without asking the policy, which promised to accept them all (its
        ``Admission`` would list them in the order offered; a debug run asks it anyway)."""
        triggers = scheduling.triggers | self.config.extra_triggers
        self._timer = bool(triggers & Trigger.TIMER)
        self._on_arrival = bool(triggers & Trigger.ARRIVAL)
        self._on_completion = bool(triggers & Trigger.COMPLETION)
        self.active: dict[str, JobState] = {}
        """Admitted, unfinished jobs (running and waiting): what policies see."""
        self._jobs: dict[str, SimJobState] = {}
        """Every job in the system (held, waiting, running), by id."""
        self._running: dict[str, SimJobState] = {}
        self._held: list[JobState] = []
        self._new: list[JobState] = []
        self._events: list[tuple[float, int, str, int]] = []
        self._event_seq = 0
        self._busy_until = [0.0] * cluster.total_gpus
        self._changed = False
        self._seq = 0
        self.out = Outcome(total_gpus=cluster.total_gpus)
        track = self.config.track
        self._track_left = (track[1] - track[0] + 1) if track is not None else -1
        self._progress = progress
        self._done_measured = 0
        # No more instance attributes here without removing one: at 30, CPython 3.11 stops sharing
        # the instance dict's keys and every ``self.x`` read of the hot loop gets ~10% slower
        # (test_engine checks the count).

    # --- starting from a state ------------------------------------------------------------------
    def start_from(self, jobs: Iterable[InitialJob]) -> list[SimJobState | None]:
        """Put ``jobs`` in the system at time 0, before ``run``, so that the simulation goes on from
        that state instead of an empty cluster (forward simulation from a snapshot,
        ``services.core.simulation.forward``). Returns each job's simulated state, in order (None
        for a job rejected on arrival: it needs more GPUs than the cluster has); a caller reads
        them after ``run`` for per-job results.

        Each job arrives at 0, in the order given (its ``seq``), and takes the state it had: submit
        time, work done, executed time, attained service, first start, longest wait, preemptions. A
        HELD job is offered to the admission policy in the first round; a QUEUED job is admitted
        (with its admission time and its wait); a RUNNING job keeps running on its GPUs from 0 with
        no restore or relaunch cost (it is not being resumed), or waits if those GPUs are not free
        (unknown to the cluster, or taken by a job given before it). The first round is as after
        arrivals at 0: at 0 if the policy rounds on arrivals or on the timer. The jobs' ids must
        differ from the workload's (its indexes count from 0). Call it before ``run``."""
        out = self.out
        jobs_by_id = self._jobs
        states: list[SimJobState | None] = []
        for initial in jobs:
            trace = initial.trace
            self._arrive(trace, 0.0)
            job = jobs_by_id.get(trace.job_id)
            states.append(job)
            if job is None:
                continue  # rejected on arrival
            job.submit_time = initial.submit_time
            if job.measured and initial.submit_time < out.first_submit:
                out.first_submit = initial.submit_time
            job.done0 = initial.done_s
            job.executed_time = initial.executed_time
            job.attained_service = initial.attained_service
            job.first_start_time = initial.first_start_time
            job.longest_wait_s = initial.longest_wait_s
            job.preemptions = initial.preemptions
            if initial.status is _HELD_STATUS:
                continue  # offered to admission in the first round, as any arrival
            if self._new and self._new[-1] is job:
                self._new.pop()
            else:
                self._new.remove(job)
            admit_job(job, 0.0)  # with the admission time and wait it had, if known
            if initial.admit_time is not None:
                job.admit_time = initial.admit_time
            if initial.queued_since is not None:
                job.queued_since = initial.queued_since
            self.active[job.job_id] = job
            if self._keyed is not None:
                self._keyed.push(job, 0.0)
            if initial.status is _RUNNING_STATUS and self._can_hold(job, initial.gpus):
                job.queued_since = None
                costs = job.costs
                job.costs = replace(costs, restore_s=0.0, relaunch_s=0.0)  # it goes on: no resume
                try:
                    self._launch(job, initial.gpus, 0.0)
                finally:
                    job.costs = costs
        return states

    def _can_hold(self, job: SimJobState, gpus: tuple[int, ...]) -> bool:
        """Whether a running job of a snapshot may go on on ``gpus``: they exist, each once, and are
        free or may be shared with their holders (``_may_share``: a packed job of a live snapshot)."""
        cluster = self.cluster
        return (
            bool(gpus)
            and len(set(gpus)) == len(gpus)
            and all(0 <= g < cluster.total_gpus and (cluster.is_free(g) or self._may_share(job, g)) for g in gpus)
        )

    # --- main loop ----------------------------------------------------------------------------
    def run(self) -> Outcome:
        with _fewer_collections():
            return self._run()

    def _run(self) -> Outcome:
        config = self.config
        round_s = config.round_s
        max_time = config.max_time_s if config.max_time_s is not None else INF
        events = self._events
        workload = self._workload
        upcoming = next(workload, None)
        round_at = INF
        now = 0.0
        loops = 0
        bar = self._progress
        if self._seq:  # jobs arrived before the run (start_from), at 0: the round they trigger, as in the loop
            if self._on_arrival or self._timer:
                round_at = 0.0
            elif config.fill_between_rounds:
                self._round(0.0, fill_only=True)
        # Hot loop: attributes that never change are read once (``active``, ``_jobs``, ``_running``
        # and ``_events`` are never rebound; ``_held`` and ``_new`` are, so they are read each time).
        active = self.active
        jobs = self._jobs
        running = self._running
        clock = self._clock
        out = self.out
        debug = config.debug
        on_completion = self._on_completion
        on_arrival = self._on_arrival
        timer = self._timer
        fill = config.fill_between_rounds
        fill_due = False
        pop = heapq.heappop
        completed = _COMPLETED_STATUS
        while True:
            if round_at < INF and not (active or self._held or self._new):
                round_at = INF  # an empty system needs no round until something arrives
            while events:  # a stale completion (the job was suspended or resized since) is no event
                head = events[0]
                job = jobs.get(head[2])
                if job is not None and job.version == head[3]:
                    break
                pop(events)
            t = events[0][0] if events else INF
            if upcoming is not None and upcoming.arrival_s < t:
                t = upcoming.arrival_s
            if round_at < t:  # noqa: PLR1730 (no min() call: once per event)
                t = round_at
            if t == INF or t > max_time:
                break
            now = t
            clock.now = t
            while events and events[0][0] <= t:
                _, _, job_id, version = pop(events)
                job = jobs.get(job_id)
                if job is None or job.version != version:
                    continue  # stale
                out.events += 1
                self._end(job, t, completed)
                if on_completion:
                    round_at = t
                else:
                    fill_due = fill
                    if timer and round_at == INF:
                        round_at = _tick_at_or_after(t, round_s)
            while upcoming is not None and upcoming.arrival_s <= t:
                self._arrive(upcoming, t)
                upcoming = next(workload, None)
                if on_arrival:
                    round_at = t
                else:
                    fill_due = fill
                    if timer and round_at > t:
                        round_at = min(round_at, _tick_at_or_after(t, round_s))
            if round_at <= t:
                ran = self._round(t)
                round_at = self._next_round(t, ran, round_s)
                if not events and upcoming is None and not running and (active or self._held) and not ran:
                    out.stalled = True  # jobs wait, nothing runs and nothing will arrive
                    break
            elif fill_due:
                self._round(t, fill_only=True)  # the policy's own round schedule is unchanged
            fill_due = False
            if debug:
                self._check(t)
            if self._track_left == 0:
                break
            loops += 1
            if bar is not None and not loops & 1023:
                bar.update(self._done_measured, t)
        self._finish(now)
        if bar is not None:
            bar.close(self._done_measured, now)
        return self.out

    def _next_round(self, t: float, ran: bool, round_s: float) -> float:
        if not (self.active or self._held or self._new):
            return INF
        if self._fast:
            waiting = self._keyed.waiting_count if self._keyed is not None else 0
            if not waiting and not self._held:
                return INF  # nothing to decide until an event
            if not self._preemptive and not self._held:
                return INF  # a non-preemptive round changes nothing until an event
        if not self._timer:
            return INF
        return _tick_after(t, round_s)

    # --- events -------------------------------------------------------------------------------
    def _arrive(self, trace: TraceJob, t: float) -> None:
        out = self.out
        out.events += 1
        out.arrived += 1
        track = self.config.track
        measured = track is None or track[0] <= trace.index <= track[1]
        self._seq += 1
        costs = self.config.costs.for_model(trace.model)
        job = SimJobState(
            job_id=trace.job_id,
            spec=None,  # built from ``trace`` on first use (SimJobState.spec)
            trace=trace,
            submit_time=trace.arrival_s,
            status=_HELD_STATUS,
            seq=self._seq,
            clock=self._clock,
            work_s=trace.duration_s,
            costs=costs,
            checkpoint_s=trace.checkpoint_s if trace.checkpoint_s is not None else costs.checkpoint_s,
            measured=measured,
            total_iterations=trace.iterations,
        )
        self._jobs[job.job_id] = job
        if measured:
            out.measured_total += 1
            out.first_submit = min(out.first_submit, trace.arrival_s)
        if trace.gpus > self.cluster.total_gpus:
            self._reject(job, t, f"needs {trace.gpus} GPUs; the cluster has {self.cluster.total_gpus}")
            return
        self._new.append(job)
        self._changed = True

    def _end(self, job: SimJobState, t: float, status: JobStatus) -> None:
        out = self.out
        if job.status is _RUNNING_STATUS:
            self._release(job, t, False)
        finish_job(job, status, t)
        job_id = job.job_id
        del self.active[job_id]
        del self._jobs[job_id]
        if self._keyed is not None:
            self._keyed.discard(job_id)
        out.completed += 1
        out.all_preemptions += job.preemptions
        out.all_lost_gpu_s += job.lost_gpu_s
        self._changed = True
        if job.measured:
            if status is _COMPLETED_STATUS:
                t += self.config.stop_latency_s  # it is recorded done when the control plane knows
            out.jct.append(t - job.submit_time)
            first = job.first_start_time if job.first_start_time is not None else t
            out.responsiveness.append(first - job.submit_time)
            out.run.append(job.executed_time)
            out.preemptions.append(job.preemptions)
            out.lost_gpu_s.append(job.lost_gpu_s)
            out.job_class.append(job.trace.job_class.value if job.trace is not None else job.spec.job_class.value)
            if self.config.record_jobs:
                out.job_index.append(job.trace.index if job.trace is not None else job.seq)
                out.submit.append(job.submit_time)
                out.first_start.append(first)
                out.gpus.append(job.gpus_requested)
            if job.loss_log is not None:
                self._record_loss(job)
            out.last_finish = max(out.last_finish, t)
            self._measured_done()

    def _reject(self, job: SimJobState, t: float, reason: str) -> None:
        finish_job(job, JobStatus.REJECTED, t)
        del self._jobs[job.job_id]
        self.out.rejected += 1
        if job.measured:
            self.out.measured_total -= 1
            self._measured_done()

    def _measured_done(self) -> None:
        self._done_measured += 1
        if self._track_left > 0:
            self._track_left -= 1

    # --- progress -----------------------------------------------------------------------------
    def _rate(self, job: SimJobState, gpus: tuple[int, ...]) -> float:
        speed = 1.0 if self._hetero is None else self._hetero.job_factor(job.spec, gpus)  # GPU types (off: 1)
        if (goodput := goodput_speedup(job, gpus, self.cluster)) is not None:  # Pollux's jobs (TraceJob.goodput)
            return goodput * speed
        requested = job.gpus_requested
        rate = 1.0
        if len(gpus) != requested:
            rate = (len(gpus) / requested) ** job.costs.scaling_exponent
        network = self.config.network
        if network is not None:  # replaces the fixed spread slowdown below
            return rate * speed * network.speed(job.spec.model, gpus, self.cluster)
        if len(gpus) > 1:
            needed = -(-len(gpus) // max(1, self.cluster.largest_node_gpus))
            if self.cluster.nodes_spanned(gpus) > needed:
                rate /= job.costs.spread_slowdown
        return rate * speed

    def _launch(self, job: SimJobState, gpus: tuple[int, ...], t: float) -> None:
        job_id = job.job_id
        self.cluster.assign(job_id, gpus)
        busy = self._busy_until
        start = t
        # Comparisons, not max() (a builtin call each): this runs on every launch.
        for g in gpus:
            held = busy[g]
            if held > start:  # noqa: PLR1730
                start = held
        preempted_at = job.last_preempt_time
        if preempted_at is not None:
            # Its own checkpoint must be written before it can be restored, on whatever GPUs.
            ready = preempted_at + job.checkpoint_s
            if ready > start:  # noqa: PLR1730
                start = ready
            if self.config.record_reschedules and job.measured:
                self.out.reschedule_s.append(t - preempted_at)
                self.out.suspended_s.append(start - ready)
        latency = self.config.start_latency_s
        if latency:  # the control plane's grant and process start, after the GPUs are free
            start += latency[job.seq % len(latency)] if isinstance(latency, tuple) else latency
        if start > t:
            # GPUs free before ``start`` are held for this job, idle, until it can begin: busy time,
            # counted here because ``alloc_since`` is ``start`` (a victim's checkpoint hold is its own).
            out = self.out
            for g in gpus:
                held = busy[g]
                idle = start - (held if held > t else t)
                if idle > 0.0:  # zero for a GPU that only frees at ``start`` (the usual swap)
                    out.busy_gpu_s += idle
        n = len(gpus)
        overhead = 0.0
        if job.preemptions > 0 or job.done0 > 0:
            costs = job.costs
            overhead = costs.restore_s + costs.relaunch_s
            job.lost_gpu_s += overhead * n
        # The job has its GPUs from ``start``, once the victims' checkpoints (and its own) are written,
        # not from the decision at ``t``: counted from ``t``, utilization counted the victims'
        # checkpoint holds twice, and responsiveness ended before the job could run.
        job.alloc_since = start
        version = job.version = job.version + 1
        launch_job(job, t, gpus, start)  # decided at ``t``, first started at ``start``
        rate = 1.0 if n == 1 and job.gpus_requested == 1 and self._hetero is None else self._rate(job, gpus)
        productive_from = start + overhead
        # ``job.start_line(productive_from, rate)``, inline (a call per launch saved):
        job.productive_from = productive_from
        job.rate = rate
        job.line_a = job.service0 - n * productive_from
        self._running[job_id] = job
        keyed = self._keyed
        if keyed is not None:
            keyed.mark_running(job)
        left = job.work_s - job.done0
        finish = productive_from + (left if left > 0.0 else 0.0) / rate
        seq = self._event_seq = self._event_seq + 1
        _heappush(self._events, (finish, seq, job_id, version))

    def _split_stale(self) -> None:
        """Drop the stale completion events (every suspension leaves one) from the event heap, so
        that it stays the size of the running set."""
        events = self._events
        jobs = self._jobs
        live = []
        for event in events:
            job = jobs.get(event[2])
            if job is not None and job.version == event[3]:
                live.append(event)
        heapq.heapify(live)
        events[:] = live

    def _release(self, job: SimJobState, t: float, checkpoint: bool) -> None:
        out = self.out
        out.productive_gpu_s += job.freeze(not checkpoint)  # final: only _end releases without one
        gpus = job.gpus
        n = len(gpus)
        job_id = job.job_id
        self.cluster.release(job_id, gpus)
        hold_until = t
        if checkpoint:
            checkpoint_s = job.checkpoint_s
            hold_until = t + checkpoint_s
            job.lost_gpu_s += checkpoint_s * n
            busy = self._busy_until
            for g in gpus:
                busy[g] = hold_until
        elif self.config.stop_latency_s:  # done, but its GPUs are free only once the control plane knows
            hold_until = t + self.config.stop_latency_s
            busy = self._busy_until
            for g in gpus:
                busy[g] = hold_until
        productive_from = job.productive_from
        if productive_from > t:  # stopped during its restore: only the part of that cost from when
            # it had its GPUs (``alloc_since``) to now was paid
            began = job.alloc_since
            job.lost_gpu_s -= (productive_from - (began if began > t else t)) * n
        # Negative if stopped before it had its GPUs: that takes back the idle hold counted at launch.
        out.busy_gpu_s += (hold_until - job.alloc_since) * n
        del self._running[job_id]
        job.rate = 0.0  # its ``gpus`` go with the transition that follows (suspend or finish)
        job.version += 1

    # --- rounds -------------------------------------------------------------------------------
    def _round(self, t: float, fill_only: bool = False) -> bool:
        """Run one round at ``t``; returns whether it changed the allocation. ``fill_only``: a fill
        round (``services.core.fill``), skipped when no GPU is free."""
        if fill_only and not self.cluster.free_gpu_count:
            return False
        offered: list[JobState] = []
        if self._held or self._new:
            offered = self._held + self._new
            self._held = []
            self._new = []
        keyed = self._keyed
        if self._fast and not offered:
            waiting = keyed.waiting_count if keyed is not None else 0
            if not waiting or (not self._preemptive and (not self._changed or not self.cluster.free_gpu_count)):
                self._changed = False
                return False
        self.out.rounds += 1
        self._changed = False
        active = self.active
        cluster = self.cluster
        if offered and self._accepts_all:
            self._admit(offered, t)
        elif offered:
            verdict = self.admission.admit(offered, active, cluster, t)
            by_id = {j.job_id: j for j in offered}
            self._admit([by_id.pop(job_id) for job_id in verdict.accepted], t)
            for job_id, reason in verdict.rejected.items():
                self._reject(self._jobs[by_id.pop(job_id).job_id], t, reason)
            held = set(verdict.held)
            unanswered = [j for j in by_id if j not in held]
            if unanswered:
                raise SimulationError(
                    f"admission policy {self.admission.name!r} gave no verdict for job(s) {unanswered[:5]}"
                )
            self._held = [j for j in offered if j.job_id in held]
        if not active:
            return False
        debug = self.config.debug
        before = snapshot_inputs(active, cluster) if debug else None
        # The round of the services (``services.core.round``): the scheduler's half, then the
        # placement service's. The incremental order, when kept, is the ranking ``rank()`` would give.
        known = None
        if keyed is not None:
            known = keyed.ranking(active, t)
            if debug:
                expected = list(self.scheduling.rank(active, cluster, t).order)
                if list(known.order) != expected:
                    raise InvariantError(f"incremental order of {self.scheduling.name!r} differs from rank() at t={t}")
        ranking = rank_step(self.scheduling, active, cluster, t, fill_only=fill_only, ranking=known)
        plan = place_step(self.placement, ranking, active, cluster, t, fill_only=fill_only)
        if before is not None and snapshot_inputs(active, cluster) != before:
            raise InvariantError(f"a policy mutated its inputs during the round at t={t}")
        return self._apply(plan, t)

    def _admit(self, jobs: list[JobState], t: float) -> None:
        active = self.active
        keyed = self._keyed
        for job in jobs:
            admit_job(job, t)
            active[job.job_id] = job
            if keyed is not None:
                keyed.push(job, t)

    def _apply(self, plan: Plan, t: float) -> bool:
        jobs = self._jobs
        active = self.active
        for job_id in plan.terminate:
            job = jobs.get(job_id)
            if job is None or job_id not in active:
                raise SimulationError(f"plan terminates job {job_id!r}, which is not admitted")
            self._end(job, t, JobStatus.COMPLETED)
        release = self._release
        keyed = self._keyed
        for job_id in plan.suspend:
            job = jobs.get(job_id)
            if job is None or job.status is not _RUNNING_STATUS:
                raise SimulationError(f"plan suspends job {job_id!r}, which is not running")
            # The suspension, inline (no method call per victim): its checkpoint holds the GPUs, the
            # job waits again and is re-keyed.
            release(job, t, True)
            suspend_job(job, t)
            if keyed is not None:
                keyed.push(job, t)
        total = self.cluster.total_gpus
        holders = self.cluster.gpu_jobs
        launch = self._launch
        for job_id, gpus in plan.launch.items():
            job = jobs.get(job_id)
            if job is None or job.status is _RUNNING_STATUS or job_id not in active:
                raise SimulationError(f"plan launches job {job_id!r}, which is not a waiting job")
            for g in gpus:
                if not 0 <= g < total or (holders[g] and not self._may_share(job, g)):
                    raise SimulationError(f"plan puts job {job_id!r} on GPU {g}, which is not free")
            launch(job, gpus if type(gpus) is tuple else tuple(gpus), t)
        if len(self._events) > 2 * len(self._running) + 256:  # once a round, not once a launch
            self._split_stale()
        return bool(plan.launch or plan.suspend or plan.terminate)

    def _may_share(self, job: SimJobState, gpu: int) -> bool:
        """Whether ``job`` may join the jobs on ``gpu`` (asked only for a GPU that is not free): never
        here; the packing simulator (``services.core.simulation.packing``) says yes when they fit."""
        return False

    # --- end ----------------------------------------------------------------------------------
    def _finish(self, t: float) -> None:
        out = self.out
        out.end_time = t
        self._clock.now = t
        for job in self._running.values():
            out.productive_gpu_s += job.freeze(final=True)
            out.busy_gpu_s += (t - job.alloc_since) * len(job.gpus)
        out.unfinished = sum(1 for job in self._jobs.values() if job.measured)
        for job in self._jobs.values():
            if job.measured and job.loss_log is not None:
                self._record_loss(job)
        if self.config.debug:
            self._check_gpu_time()

    def _check_gpu_time(self) -> None:
        """GPU time is counted once: productive <= busy <= capacity (a checkpoint hold or an idle
        reservation counted twice would push utilization above 1)."""
        out = self.out
        capacity = out.total_gpus * out.end_time
        slack = 1e-6 * max(1.0, capacity)
        if not out.productive_gpu_s <= out.busy_gpu_s + slack or not out.busy_gpu_s <= capacity + slack:
            raise InvariantError(
                f"GPU time: productive {out.productive_gpu_s:.3f}, busy {out.busy_gpu_s:.3f}, "
                f"capacity {capacity:.3f} GPU-s (must be productive <= busy <= capacity)"
            )

    def _record_loss(self, job: SimJobState) -> None:
        reached = job.loss_reached_at
        if reached is not None and job.trace is not None:
            self.out.loss_reached[job.trace.index] = reached

    def _check(self, t: float) -> None:
        check_invariants(self.active, self._held + self._new, self._jobs, self.cluster, t)


GC_GEN0_THRESHOLD = 20_000
"""The cyclic garbage collector's first threshold while a simulation runs (Python's default: 700)."""


@contextmanager
def _fewer_collections() -> Iterator[None]:
    """Collect cyclic garbage less often while the loop runs, then restore the process's setting.

    Every swap allocates short-lived tuples and lists (keys, queue entries, events), and at Python's
    default threshold the collector ran ~350 times in case (a), three of them full collections over
    every object of the process: ~0.2 s of a 4 s run. The loop makes little cyclic garbage, so
    collecting every 20,000 net allocations instead keeps memory the same and results cannot
    change (collection timing is invisible to the simulation). A caller that disabled automatic
    collection (threshold 0) or set a larger threshold keeps its setting."""
    threshold = gc.get_threshold()
    if threshold[0] == 0 or threshold[0] >= GC_GEN0_THRESHOLD:
        yield
        return
    gc.set_threshold(GC_GEN0_THRESHOLD, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)


def _service_line(job: SimJobState) -> tuple[float, float]:
    return job.line_a, job.productive_from


def _tick_at_or_after(t: float, round_s: float) -> float:
    return math.ceil(t / round_s - _EPS) * round_s


def _tick_after(t: float, round_s: float) -> float:
    return (math.floor(t / round_s + _EPS) + 1) * round_s
