"""When will a queued job start? A forward simulation of the live state under the policy in force.

Slurm's ``squeue --start`` estimates a pending job's start from its backfill plan; Roundhouse runs
the real thing instead: the same policy objects the scheduler ranks with, in the simulator
(``services.core.simulation.forward``), from a snapshot of the leader's book, with every job's
expected duration. A queued job's ETA is its first start in that simulation.

What is simulated (and what is not):

* **Jobs**: every running job (on the GPUs it holds, with the work it has done) and the first
  ``max_jobs`` queued jobs in the last round's order (then, for jobs that arrived since, submission
  order). A queued job beyond them gets no ETA (its ``eta_reason`` says so): the cost stays bounded
  whatever the queue's length. Leaving the tail out can only make the simulated jobs start earlier
  where a left-out job would have been started ahead of them (a preemptive policy or a backfill).
  Jobs held by admission are not simulated (the admission policy runs in its own service; a held
  job has no ETA until admitted) and no future arrivals are: an ETA assumes nothing else arrives,
  as ``squeue --start`` does, so a later arrival that a policy ranks first (SRTF, LAS, a higher
  priority tier) delays the job past its ETA.
* **Policies**: fresh instances of the scheduling policy and options in force (the synthesizer's
  current combination, not a synthesizer), the placement policy and options named by the
  scheduler's ``eta_placement`` settings (the placement service runs its own, which the scheduler
  cannot read), accept-all admission. Rounds every ``round_s`` from now, fill rounds between them
  as the live scheduler runs them (``fill_between_rounds``), the default preemption costs. The
  simulator does not model priority tiers (a trace job has none).
* **Durations**: a job's ``spec.expected_duration_s``. A job without one gets a fallback: the median
  ``expected_duration_s`` of the snapshot's jobs of the same user and class that have one, else of
  the same class, else ``default_duration_s``; a running job that already ran longer is expected to
  run as long again as it has (twice its executed time in all). ETAs that depend on a fallback are
  marked ``quality="guessed"``: the job's own duration was guessed, or a job with a guessed
  duration was running at the snapshot or started before it in the simulation. Otherwise
  ``quality="durations"``: as good as the declared durations are. A running job past its declared
  duration is simulated as ending at once.
* **Horizon**: ``horizon_s`` of simulated time; a queued job that has not started by then gets no
  ETA (``reason``: it does not start within the horizon).
* **Time scale**: durations and preemption costs are divided by ``time_scale`` (an emulated
  cluster's speed-up, whose workers run a job's ``expected_duration_s`` that many times faster).

The simulation is CPU work: :func:`predict` is pure and picklable, and :class:`EtaRefresher` runs it
in a worker process (or a thread) off the event loop, at most every ``interval_s`` and only when the
book changed (or ``refresh_s`` passed), and keeps the last :class:`EtaTable`; ``query.jobs`` reads
that table, never simulating per query. An ETA is absolute (the scheduler's wall clock), so it stays
valid between runs; ``eta_s`` is computed against the query's time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import BrokenExecutor, Executor, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from services.core.costs import CostModel, ModelCosts
from services.core.registry import ADMISSION, PLACEMENT, SCHEDULING
from services.core.simulation.forward import ForwardJob, ForwardSettings, Snapshot, run_forward, take_snapshot
from services.core.state import ClusterState, JobState, JobStatus
from services.runtime.child_pool import process_pool

log = logging.getLogger("roundhouse.scheduler.eta")

Quality = Literal["durations", "guessed"]
DURATIONS: Final[Quality] = "durations"
"""Every duration the ETA depends on was declared (``expected_duration_s``)."""
GUESSED: Final[Quality] = "guessed"
"""The ETA depends on a fallback duration (module doc)."""

Options = tuple[tuple[str, Any], ...]
"""A policy's keyword options as sorted (name, value) pairs: hashable and picklable."""


def options(mapping: Mapping[str, Any] | None) -> Options:
    return tuple(sorted((mapping or {}).items()))


@dataclass(frozen=True, slots=True, kw_only=True)
class EtaSettings:
    """What the ETA simulates and how far (picklable: it travels to the worker process)."""

    scheduling: str
    scheduling_options: Options = ()
    placement: str = "consolidated"
    placement_options: Options = ()
    round_s: float = 300.0
    fill_between_rounds: bool = True
    horizon_s: float = 7 * 86_400.0
    max_jobs: int = 1000
    """Queued jobs simulated (all running jobs are)."""
    default_duration_s: float = 3600.0
    time_scale: float = 1.0
    packing: bool = False
    """The scheduler packs (``SchedulerConfig.packing``): simulate packed plans (``ForwardSettings.packing``)."""

    def __post_init__(self) -> None:
        if not (self.horizon_s > 0 and math.isfinite(self.horizon_s)):
            raise ValueError(f"horizon_s must be a positive number of seconds, got {self.horizon_s}")
        if self.max_jobs < 1:
            raise ValueError(f"max_jobs must be >= 1, got {self.max_jobs}")
        if not (self.default_duration_s > 0 and math.isfinite(self.default_duration_s)):
            raise ValueError(f"default_duration_s must be positive, got {self.default_duration_s}")
        if not (self.time_scale > 0 and math.isfinite(self.time_scale)):
            raise ValueError(f"time_scale must be positive, got {self.time_scale}")


@dataclass(frozen=True, slots=True)
class Eta:
    """One queued job's expected start: ``start`` on the scheduler's wall clock, or None with ``reason``."""

    start: float | None
    quality: Quality | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class EtaTable:
    """The result of one ETA run: each queued job's :class:`Eta`, as of ``now`` (the snapshot's time)."""

    now: float
    etas: Mapping[str, Eta] = field(default_factory=dict)
    simulated_jobs: int = 0
    simulated_s: float = 0.0
    """Simulated seconds the run covered."""
    epoch: int | None = None
    """The leader's term the snapshot was taken in (a table of an earlier term is not shown)."""
    elapsed_s: float = 0.0
    """Wall seconds the simulation took (set by the refresher)."""
    left_out: frozenset[str] = frozenset()
    """Queued jobs not simulated: beyond the first ``max_jobs`` in queue order."""
    max_jobs: int = 0

    def left_out_reason(self) -> str:
        return f"beyond the first {self.max_jobs} queued jobs the ETA simulates (scheduler setting eta_max_jobs)"


@dataclass(frozen=True, slots=True)
class EtaRequest:
    """One ETA run's input: the snapshot (durations filled in, queued jobs' first starts cleared so
    the simulation records their first start from now) and which jobs' durations were guessed."""

    snapshot: Snapshot
    settings: EtaSettings
    guessed: frozenset[str] = frozenset()
    left_out: frozenset[str] = frozenset()
    """Queued jobs left out of the simulation (beyond ``settings.max_jobs``)."""
    epoch: int | None = None
    """The leader's term it was taken in."""
    version: int = 0
    """The book's ``state_version`` it was taken at."""


# --- durations --------------------------------------------------------------------------------
def fallback_durations(jobs: Iterable[JobState], default_s: float) -> dict[str, float]:
    """A duration for each job without ``spec.expected_duration_s``: the median declared duration of
    the jobs of the same user and class, else of the same class, else ``default_s``; a running job
    that ran longer than that is given twice its executed time (it runs as long again)."""
    jobs = list(jobs)
    by_user_class: dict[tuple[str, str], list[float]] = {}
    by_class: dict[str, list[float]] = {}
    for job in jobs:
        duration = job.spec.expected_duration_s
        if duration is not None:
            by_user_class.setdefault((job.spec.user, job.job_class.value), []).append(duration)
            by_class.setdefault(job.job_class.value, []).append(duration)
    user_class = {key: statistics.median(values) for key, values in by_user_class.items()}
    of_class = {key: statistics.median(values) for key, values in by_class.items()}
    out: dict[str, float] = {}
    for job in jobs:
        if job.spec.expected_duration_s is not None:
            continue
        cls = job.job_class.value
        estimate = user_class.get((job.spec.user, cls), of_class.get(cls, default_s))
        out[job.job_id] = max(estimate, 2.0 * job.executed_time)
    return out


# --- the request (on the event loop: reads the book, copies plain values) ---------------------
def prepare(
    jobs: Mapping[str, JobState],
    cluster: ClusterState,
    now: float,
    settings: EtaSettings,
    *,
    order: Sequence[str] = (),
    epoch: int | None = None,
    version: int = 0,
    withheld: Iterable[int] = (),
) -> EtaRequest:
    """The request for the admitted, unfinished ``jobs`` (the book's ``active``) on ``cluster``:
    every running job and the first ``settings.max_jobs`` queued ones, in ``order`` (the last
    round's ranking) and then by submission. ``withheld``: the global ids of GPUs on nodes that take
    no new work (draining or silent); no queued job starts on them in the simulation. Reads its
    inputs only."""
    running = [j for j in jobs.values() if j.is_running]
    limit = settings.max_jobs
    kept: list[JobState] = []
    for job_id in order:  # the last round's ranking: most of the queue, already in order
        if len(kept) >= limit:
            break
        state = jobs.get(job_id)
        if state is not None and state.status is JobStatus.QUEUED:
            kept.append(state)
    if len(kept) < limit:  # jobs that arrived since the last round, by submission
        ranked = {j.job_id for j in kept}
        rest = [j for j in jobs.values() if j.status is JobStatus.QUEUED and j.job_id not in ranked]
        rest.sort(key=lambda j: (j.submit_time, j.seq, j.job_id))
        kept += rest[: limit - len(kept)]
    simulated = {j.job_id for j in kept}
    left_out = frozenset(
        job_id for job_id, j in jobs.items() if j.status is JobStatus.QUEUED and job_id not in simulated
    )
    chosen = {j.job_id: j for j in (*running, *kept)}
    durations = fallback_durations(chosen.values(), settings.default_duration_s)
    snapshot = take_snapshot(chosen, cluster, now, durations=durations, withheld=withheld)
    scale = settings.time_scale
    forward = tuple(_for_eta(fj, scale) for fj in snapshot.jobs)
    snapshot = replace(snapshot, jobs=forward)
    return EtaRequest(snapshot, settings, frozenset(durations), left_out, epoch, version)


def _for_eta(fj: ForwardJob, scale: float) -> ForwardJob:
    """A queued job's first start is cleared (its simulated first start is then its ETA; no policy
    reads it), and the job's work divided by the time scale."""
    first = None if fj.status is JobStatus.QUEUED else fj.first_start_time
    if scale == 1.0 and first == fj.first_start_time:
        return fj
    total = fj.trace.duration_s / scale
    trace = replace(fj.trace, duration_s=total)
    return replace(fj, trace=trace, done_s=min(fj.done_s, total), first_start_time=first)


def _scaled_costs(scale: float) -> CostModel:
    costs = CostModel()
    if scale == 1.0:
        return costs

    def scaled(c: ModelCosts) -> ModelCosts:
        return replace(c, checkpoint_s=c.checkpoint_s / scale, restore_s=c.restore_s / scale,
                       relaunch_s=c.relaunch_s / scale)  # fmt: skip

    return CostModel({name: scaled(c) for name, c in costs.models.items()}, scaled(costs.default))


# --- the simulation (pure CPU work; runs in a worker process) ---------------------------------
def predict(request: EtaRequest) -> EtaTable:
    """Simulate ``request`` forward and read each queued job's first start (module doc)."""
    settings = request.settings
    snapshot = request.snapshot
    now = snapshot.now
    etas: dict[str, Eta] = {}
    left_out = request.left_out
    if not any(fj.status is JobStatus.QUEUED for fj in snapshot.jobs):
        return EtaTable(now, etas, simulated_jobs=len(snapshot.jobs), left_out=left_out, max_jobs=settings.max_jobs)
    forward = ForwardSettings(
        round_s=settings.round_s,
        horizon_s=settings.horizon_s,
        costs=_scaled_costs(settings.time_scale),
        fill_between_rounds=settings.fill_between_rounds,
        packing=settings.packing,
    )
    out, states = run_forward(
        snapshot,
        admission=ADMISSION.create("accept-all"),
        scheduling=SCHEDULING.create(settings.scheduling, **dict(settings.scheduling_options)),
        placement=PLACEMENT.create(settings.placement, **dict(settings.placement_options)),
        settings=forward,
    )
    starts: dict[str, float | None] = {}
    for fj, state in zip(snapshot.jobs, states, strict=True):
        if fj.status is JobStatus.RUNNING:
            starts[fj.job_id] = -math.inf
        else:
            starts[fj.job_id] = state.first_start_time if state is not None else None
    # The earliest moment a job with a guessed duration held GPUs: ETAs from then on depend on it.
    guessed_from = min((s for j in request.guessed if (s := starts.get(j)) is not None), default=math.inf)
    horizon_h = settings.horizon_s / 3600
    for fj, state in zip(snapshot.jobs, states, strict=True):
        if fj.status is not JobStatus.QUEUED:
            continue
        start = starts[fj.job_id]
        if state is None:
            etas[fj.job_id] = Eta(None, reason="it needs more GPUs than the live nodes have")
        elif start is None:
            why = "the simulation stalled" if out.stalled else f"it does not start within {horizon_h:g} h (simulated)"
            etas[fj.job_id] = Eta(None, reason=why)
        else:
            quality = GUESSED if fj.job_id in request.guessed or guessed_from < start else DURATIONS
            etas[fj.job_id] = Eta(now + max(0.0, start), quality)
    return EtaTable(
        now, etas, simulated_jobs=len(snapshot.jobs), simulated_s=out.end_time, left_out=left_out,
        max_jobs=settings.max_jobs,
    )  # fmt: skip


# --- the refresher (I/O side) ------------------------------------------------------------------
Executors = Literal["process", "thread"]
TAKE_SPACING: Final = 20.0
"""Runs start at least this many times the last snapshot's cost apart (it runs on the event loop)."""
MAX_BACKOFF_S: Final = 300.0


class EtaRefresher:
    """Keeps :attr:`table` current: every ``interval_s``, if ``take()`` returns a request (the book
    changed, or ``refresh_s`` passed), runs :func:`predict` in the executor and keeps the result.

    ``take`` runs on the event loop (it reads the book); the simulation does not. One run at a time:
    a run that takes longer than ``interval_s`` delays the next, never stacks them."""

    def __init__(
        self,
        take: Callable[[], EtaRequest | None],
        *,
        interval_s: float,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        executor: Executors = "process",
    ) -> None:
        self._take = take
        self.interval_s = interval_s
        self._sleep = sleep
        self._kind = executor
        self._pool: Executor | None = None
        self._task: asyncio.Task[None] | None = None
        self.table: EtaTable | None = None
        self.runs = 0
        self.failures = 0
        self.last_take_s = 0.0
        """Wall seconds the last ``take()`` held the event loop."""
        self._backoff_s = 0.0
        """After failures, the loop waits this long (doubling, at most ``MAX_BACKOFF_S``)."""

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="eta")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        pool, self._pool = self._pool, None
        if pool is not None:
            # A simulation in flight is not waited for: the worker is stopped (Python 3.11's
            # ProcessPoolExecutor has no public way; without it, exit would wait for the run).
            workers = dict(getattr(pool, "_processes", None) or {})
            pool.shutdown(wait=False, cancel_futures=True)
            for process in workers.values():
                process.terminate()

    def _executor(self) -> Executor:
        if self._pool is None:
            if self._kind == "process":
                # Spawned, and exiting with the scheduler even when it is killed (child_pool.py).
                self._pool = process_pool(max_workers=1)
            else:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eta")
        return self._pool

    async def _loop(self) -> None:
        while True:
            # Taking the snapshot is the one part on the event loop (~35 ms per 1,000 jobs on a loaded
            # 2-core machine): spaced so that it takes at most 1/TAKE_SPACING of the loop's time.
            await self._sleep(self.next_wait_s)
            await self.refresh()

    @property
    def next_wait_s(self) -> float:
        """How long the loop waits before the next run: ``interval_s``, or longer after a costly
        snapshot or failures."""
        return max(self.interval_s, TAKE_SPACING * self.last_take_s, self._backoff_s)

    def _failed(self, what: str) -> None:
        """Count a failure, log it (the 1st, 2nd, 4th, 8th, ...), and back off."""
        self.failures += 1
        if self.failures & (self.failures - 1) == 0:
            log.exception("ETA: %s (failure %d; retried with back-off)", what, self.failures)
        self._backoff_s = min(MAX_BACKOFF_S, max(self.interval_s, 2 * self._backoff_s))

    async def refresh(self) -> EtaTable | None:
        """One run now if ``take()`` has a request; returns the new table (None if none ran)."""
        began = time.perf_counter()
        try:
            request = self._take()
        except Exception:
            self._failed("taking the snapshot failed")
            return None
        finally:
            self.last_take_s = time.perf_counter() - began
        if request is None:
            return None
        began = time.perf_counter()
        try:
            table = await asyncio.get_running_loop().run_in_executor(self._executor(), predict, request)
        except asyncio.CancelledError:
            raise
        except BrokenExecutor:
            self._pool = None  # its worker died: the next run starts a new one
            self._failed("the worker process died")
            return None
        except Exception:
            self._failed("the forward simulation failed")
            return None
        self._backoff_s = 0.0
        elapsed = time.perf_counter() - began
        self.table = replace(table, epoch=request.epoch, elapsed_s=elapsed)
        self.runs += 1
        log.debug("ETA: %d jobs simulated in %.3f s", table.simulated_jobs, elapsed)
        return self.table


__all__ = [
    "DURATIONS",
    "GUESSED",
    "Eta",
    "EtaRefresher",
    "EtaRequest",
    "EtaSettings",
    "EtaTable",
    "fallback_durations",
    "options",
    "predict",
    "prepare",
]
