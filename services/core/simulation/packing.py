"""The simulator with GPU packing: several jobs on one GPU when a packing plan puts them there.

``PackingSimulator`` is ``Simulator`` plus Gandiva's packing (Xiao et al., OSDI '18; seed 001,
"Packing"), with the profiles and the interference model of ``services.core.packing``:

* a plan may launch a job onto a GPU that running jobs hold if their memory fits the GPU together
  (``PackingModel.fits``; paging from host memory is not modelled: a plan that does not fit is an
  error, as the engine's "not free" is) and the GPU holds fewer than ``MAX_JOBS_PER_GPU`` jobs (the
  bound the live scheduler and worker keep); the GPU is marked shared (``ClusterState.shared_gpus``),
  which is what lets the invariant checks accept it; a forward run from a live snapshot
  (``start_from``) keeps a packed running job on its shared GPU by the same rule;
* every job on a shared GPU progresses at ``PackingModel.rates`` of its speed (a multi-GPU job at
  that of its slowest GPU, as synchronous data-parallel training goes); when a co-tenant arrives
  or leaves, the others' progress lines are re-drawn at their new rates (their completion events
  move with them);
* every running job reports its mini-batch time (``JobState.iteration_time_s``): the profile's
  solo time (or the trace's ``duration / iterations``) over its current rate, so that the
  ``gandiva`` policy's introspection can compare packed and solo times and unpack a pair that
  loses to time-slicing, as Gandiva does from the mini-batch times it profiles;
* utilization counts a GPU once however many jobs it holds: ``Outcome.busy_gpu_s`` and
  ``productive_gpu_s`` are, with packing, the union over jobs of each GPU's held (resp. productive)
  intervals; the engine's per-job sums would count a shared GPU twice.

Why a subclass and not a switch in the engine: the engine's hot loop reads ~28 instance attributes
and CPython shares an instance dict's keys only up to 29 (``test_engine``), and a run without
packing should not pay for a feature it does not use. With ``packing=None`` this class is the
engine, bit for bit (it records nothing and changes nothing).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from typing import Any

from services.core.packing import MAX_JOBS_PER_GPU, PackingModel
from services.core.simulation.engine import Simulator
from services.core.simulation.jobs import SimJobState
from services.core.state import UNAVAILABLE, JobStatus

_RUNNING = JobStatus.RUNNING

Interval = tuple[float, float]


class PackingSimulator(Simulator):
    """``Simulator`` that lets a packing plan share GPUs (see the module docstring)."""

    def __init__(self, *args: Any, packing: PackingModel | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.packing = packing
        n = self.cluster.total_gpus
        self.held_intervals: list[list[Interval]] = [[] for _ in range(n)]
        """Per GPU: (from, to) of every job's hold, checkpoint and idle reservation included."""
        self.productive_intervals: list[list[Interval]] = [[] for _ in range(n)]
        """Per GPU: (from, to) of every job's progress (after its restore)."""
        self.packed_launches = 0
        """Launches onto a GPU another job held (a packing)."""
        self._held_from: dict[str, tuple[float, ...]] = {}
        self._progress_from: dict[str, float] = {}

    # --- the engine's hooks -------------------------------------------------------------------
    def _may_share(self, job: SimJobState, gpu: int) -> bool:
        model = self.packing
        if model is None:
            return False
        holders = self.cluster.gpu_jobs[gpu]
        if UNAVAILABLE in holders or len(holders) >= MAX_JOBS_PER_GPU:  # the live scheduler's bound
            return False
        jobs = self._jobs
        models = [job.spec.model, *(jobs[h].spec.model for h in holders)]
        return model.fits(models, self.cluster.gpus[gpu].memory_mb)

    def _launch(self, job: SimJobState, gpus: tuple[int, ...], t: float) -> None:
        if self.packing is None:
            super()._launch(job, gpus, t)
            return
        cluster = self.cluster
        shared = [g for g in gpus if cluster.gpu_jobs[g]]
        super()._launch(job, gpus, t)
        start = job.alloc_since
        busy = self._busy_until
        # A GPU is held for the job from the decision (or when the last holder's checkpoint ends)
        # if it waits idle for the job to start, as the engine counts it, else from the start.
        self._held_from[job.job_id] = tuple(min(start, max(busy[g], t)) for g in gpus)
        self._progress_from[job.job_id] = job.productive_from
        if shared:
            self.packed_launches += 1
            cluster.mark_shared(shared)
            self._rerate(self._tenants(gpus), t)
        else:
            job.iteration_time_s = self._solo_iteration_s(job) / job.rate

    def _release(self, job: SimJobState, t: float, checkpoint: bool) -> None:
        if self.packing is None:
            super()._release(job, t, checkpoint)
            return
        gpus = job.gpus
        others = self._tenants(gpus) - {job.job_id}
        end = t + job.checkpoint_s if checkpoint else t + self.config.stop_latency_s
        self._close(job, gpus, t, end)
        super()._release(job, t, checkpoint)
        if others:
            self._rerate(others, t)

    def _finish(self, t: float) -> None:
        if self.packing is not None:
            for job in self._running.values():
                self._close(job, job.gpus, t, t)
        super()._finish(t)
        self._count_gpus_once()

    def _check_gpu_time(self) -> None:
        self._count_gpus_once()
        super()._check_gpu_time()

    # --- packing ------------------------------------------------------------------------------
    def _tenants(self, gpus: Iterable[int]) -> set[str]:
        holders = self.cluster.gpu_jobs
        return {j for g in gpus for j in holders[g]}

    def _rerate(self, job_ids: Iterable[str], t: float) -> None:
        """Re-draw the progress lines of running ``job_ids`` at their rates with today's co-tenants."""
        model = self.packing
        assert model is not None
        jobs = self._jobs
        holders = self.cluster.gpu_jobs
        for job_id in sorted(job_ids):  # sorted: event order must not depend on set order
            job = jobs[job_id]
            if job.status is not _RUNNING:
                continue
            gpus = job.gpus
            factor = 1.0
            for g in gpus:
                on_gpu = holders[g]
                if len(on_gpu) > 1:
                    rates = model.rates(tuple(jobs[h].spec.model for h in on_gpu))
                    factor = min(factor, rates[on_gpu.index(job_id)])
            base = 1.0 if len(gpus) == 1 and job.gpus_requested == 1 and self._hetero is None else self._rate(job, gpus)
            rate = base * factor
            job.iteration_time_s = self._solo_iteration_s(job) / rate
            if rate == job.rate:
                continue
            self.out.productive_gpu_s += job.freeze()
            job.start_line(job.productive_from, rate)
            job.version += 1  # its pending completion is stale: a new one at the new rate
            left = job.work_s - job.done0
            finish = job.productive_from + (left if left > 0.0 else 0.0) / rate
            seq = self._event_seq = self._event_seq + 1
            heapq.heappush(self._events, (finish, seq, job_id, job.version))

    def _solo_iteration_s(self, job: SimJobState) -> float:
        trace = job.trace
        if trace is not None and trace.iterations:
            return job.work_s / trace.iterations
        assert self.packing is not None
        return self.packing.profile(job.spec.model).iteration_s

    # --- GPU time, each GPU once --------------------------------------------------------------
    def _close(self, job: SimJobState, gpus: tuple[int, ...], t: float, end: float) -> None:
        held_from = self._held_from.pop(job.job_id, None)
        progress_from = self._progress_from.pop(job.job_id, None)
        if held_from is None or progress_from is None:
            return
        for g, begin in zip(gpus, held_from, strict=True):
            if end > begin:
                self.held_intervals[g].append((begin, end))
            if t > progress_from:
                self.productive_intervals[g].append((progress_from, t))

    def _count_gpus_once(self) -> None:
        if self.packing is None:
            return
        out = self.out
        out.busy_gpu_s = self.gpu_seconds(self.held_intervals)
        out.productive_gpu_s = self.gpu_seconds(self.productive_intervals)

    @staticmethod
    def gpu_seconds(per_gpu: list[list[Interval]], start: float = -math.inf, end: float = math.inf) -> float:
        """GPU-seconds in [start, end] during which each GPU had at least one interval (a union per
        GPU, so a GPU shared by several jobs counts once)."""
        total: list[float] = []
        for intervals in per_gpu:
            at = -math.inf
            for a, b in sorted(intervals):
                lo = max(a, at, start)
                hi = min(b, end)
                if hi > lo:
                    total.append(hi - lo)
                at = max(at, hi)
        return math.fsum(total)
