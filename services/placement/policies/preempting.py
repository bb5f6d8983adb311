"""``preempting``: FIFO fill on CPU, RAM and GPUs, plus victim-policy preemption for TE jobs (FitGpp).

FitGpp (seed 000, §2.1): "When a TE job arrives at a job queue, one or more BE jobs are suspended to
make room for the incoming TE job if the resource is insufficient." This placement is that
mechanism, with the choice of victims delegated by name to a ``VictimPolicy`` (``fitgpp``, ``lrtp``,
``rand``), so the three algorithms of FitGpp §3 differ only in the victim option.

The walk, over the waiting jobs in ranking order (running jobs keep their resources; the ranking
never preempts here, whatever ``Ranking.preempt`` says):

1. A job that fits on one node (free GPUs, CPUs and RAM all enough: FitGpp jobs are single tasks,
   §2.1) is launched there: best fit on GPUs (the node with the fewest free GPUs that suffice),
   ties by cluster order, lowest GPU ids. A job wider than every node takes whole nodes like
   ``consolidated`` (GPUs only; CPU/RAM are not checked for such jobs).
2. A job of a class in ``preempt_for`` (TE) that does not fit asks the victim policy for running
   jobs to suspend, given the resources as they stand in this round (jobs launched earlier in the
   walk count as running). If the victims make room, it is launched and they are suspended (a
   victim launched earlier in this same walk simply is not launched); if not, nothing is
   suspended for it. Victims are not given back when they were more than needed: that is how the
   LRTP and RAND baselines behave (Appendix A), and FitGpp picks exactly one.
3. A job that still cannot start blocks the queue (FIFO): no later job is launched, except that
   later TE jobs still get their preemption attempt. A blocked BE job ends the walk, so pair this
   placement with the ``fitgpp`` ranking (every TE job ahead of every BE job); with another ranking
   a TE job queued behind a blocked BE job waits its turn. ``backfill=True`` lets later jobs use
   resources a blocked job cannot.

Grace periods (§2.1) are honoured by the owner of the state: a suspended victim holds its GPUs
until it has checkpointed, at most ``spec.grace_period_s``, and the TE job starts after that. The
plan says only who is suspended and where the TE job goes; so that the owner's rule applies, the TE
job is put on the victims' GPUs first (on its node, before GPUs that were already free: a victim
that made room with its CPUs or RAM still holds them during its grace period).

Cost: time proportional to the jobs looked at (launches, waiting TE jobs, one blocked BE job), plus
a scratch copy of the cluster's GPU table for each TE job that needs preemption.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar

from schemas.job import JobClass
from services.core.decisions import Placement, Plan, Ranking
from services.core.placing import FreeMap
from services.core.protocols import VictimPolicy
from services.core.registry import PLACEMENT, VICTIM
from services.core.state import ClusterState, JobState, JobStatus
from services.placement.policies.consolidated import consolidated_fit
from services.placement.policies.demand import NodeRoom, free_room, share_on_node

_VICTIM_OPTIONS: dict[str, frozenset[str]] = {
    "fitgpp": frozenset({"s", "max_preemptions"}),
    "lrtp": frozenset({"max_preemptions"}),
    "rand": frozenset({"max_preemptions", "seed"}),
}


def resource_fit(
    job: JobState,
    free: FreeMap,
    room: Sequence[NodeRoom],
    cluster: ClusterState,
    prefer: Collection[int] = (),
) -> tuple[int, ...] | None:
    """GPUs on one node with enough free GPUs, CPUs and RAM (best fit on GPUs); None if none.

    On the chosen node the GPUs in ``prefer`` (a victim's, just freed) are taken first, then the
    lowest ids."""
    need = job.spec.gpus
    if need > cluster.largest_node_gpus:
        return consolidated_fit(job, need, free, cluster)
    best: int | None = None
    for node, gpus in free.items():
        if len(gpus) < need or not room[node].fits(job):
            continue
        if best is None or (len(gpus), node) < (len(free[best]), best):
            best = node
    if best is None:
        return None
    if prefer:
        return tuple(sorted(sorted(free[best], key=lambda g: (g not in prefer, g))[:need]))
    return tuple(sorted(free[best])[:need])


@PLACEMENT.register("preempting")
class Preempting:
    """FIFO placement on all resources; TE jobs preempt victims chosen by a named victim policy."""

    name: ClassVar[str] = "preempting"
    keeps_running: ClassVar[bool] = True

    def __init__(
        self,
        *,
        victim: str = "fitgpp",
        s: float | None = None,
        max_preemptions: int | None = None,
        seed: int | None = None,
        preempt_for: Sequence[str] = ("TE",),
        backfill: bool = False,
    ) -> None:
        allowed = _VICTIM_OPTIONS.get(victim)
        given: dict[str, Any] = {
            k: v for k, v in (("s", s), ("max_preemptions", max_preemptions), ("seed", seed)) if v is not None
        }
        if allowed is not None:
            extra = sorted(set(given) - allowed)
            if extra:
                raise ValueError(
                    f"option(s) {', '.join(extra)} do not apply to victim={victim!r}; it takes {sorted(allowed)}"
                )
        self.victim_name = victim
        self.victim: VictimPolicy = VICTIM.create(victim, **given)
        try:
            self.preempt_for = frozenset(JobClass(c) for c in preempt_for)
        except ValueError:
            raise ValueError(
                f"preempt_for must name job classes from {[c.value for c in JobClass]}, got {list(preempt_for)}"
            ) from None
        self.backfill = backfill
        self._spans: dict[tuple[int, ...], int] = {}
        """``demand.free_room``'s memo of GPU tuple -> node, for the cluster in ``_spans_of``."""
        self._spans_of: list[int] | None = None

    def place(
        self, ranking: Ranking, jobs: Mapping[str, JobState], cluster: ClusterState, now: float
    ) -> Placement:
        if self._spans_of is not cluster.gpu_node_positions or len(self._spans) > 1_000_000:
            self._spans, self._spans_of = {}, cluster.gpu_node_positions
        walk = _Walk(ranking, jobs, cluster, self._spans)
        waiting = ranking.waiting
        if waiting is None:
            waiting = [j for j in ranking.order if not jobs[j].is_running]
        blocked = False
        for job_id in waiting:
            if job_id in ranking.terminate:
                continue
            job = jobs[job_id]
            urgent = job.job_class in self.preempt_for
            if blocked and not urgent:
                if self.backfill:
                    continue
                break
            gpus = walk.fit(job)
            if gpus is None and urgent:
                gpus = self._preempt(walk, job, now)
            if gpus is None:
                blocked = blocked or not self.backfill
                continue
            walk.launch_job(job, gpus)
        return walk.result()

    def _preempt(self, walk: _Walk, job: JobState, now: float) -> tuple[int, ...] | None:
        running = walk.holders()
        chosen = self.victim.choose(job, running, walk.view(), now)
        if not chosen:
            return None
        by_id = {j.job_id: j for j in running}
        unknown = [v for v in chosen if v not in by_id]
        if unknown:
            raise ValueError(f"victim policy {self.victim_name!r} chose jobs that are not running: {unknown}")
        undo = [walk.drop(by_id[v]) for v in chosen]
        # The TE job takes the victims' GPUs first, so it waits for their grace period (§2.1: the
        # GP "affects the time until the execution of the incoming TE jobs"); on free GPUs of the
        # victim's node it would start at once although only the victim's CPUs or RAM made room.
        gpus = walk.fit(job, prefer={g for v in chosen for g in by_id[v].gpus})
        if gpus is None:
            for victim, relaunch in zip(chosen, undo, strict=True):
                walk.restore(by_id[victim], relaunch)
        return gpus


class _Walk:
    """Scratch state of one ``preempting`` walk: free GPUs, free CPU/RAM per node, decisions."""

    def __init__(
        self, ranking: Ranking, jobs: Mapping[str, JobState], cluster: ClusterState, spans: dict[tuple[int, ...], int]
    ) -> None:
        self.ranking = ranking
        self.jobs = jobs
        self.cluster = cluster
        gone = ranking.terminate
        running_status = JobStatus.RUNNING
        self.running: dict[str, JobState] = {
            j.job_id: j for j in jobs.values() if j.status is running_status and j.job_id not in gone
        }
        self.free: FreeMap = cluster.free_by_node()
        ending = [jobs[j] for j in gone if j in jobs and jobs[j].is_running]
        for j in ending:
            self._give(j.gpus)
        self.room = free_room(self.running.values(), cluster, spans)
        for node, count in enumerate(self._gpu_counts()):
            self.room[node].gpus = count
        self.launch: dict[str, tuple[int, ...]] = {}
        self.suspend: dict[str, None] = {}

    def _gpu_counts(self) -> list[int]:
        counts = [0] * len(self.cluster.node_ids)
        for node, gpus in self.free.items():
            counts[node] = len(gpus)
        return counts

    def _give(self, gpus: tuple[int, ...]) -> None:
        node_of = self.cluster.node_position_of_gpu
        for g in gpus:
            self.free.setdefault(node_of(g), set()).add(g)

    def _take(self, gpus: tuple[int, ...]) -> None:
        node_of = self.cluster.node_position_of_gpu
        for g in gpus:
            node = node_of(g)
            self.free[node].remove(g)
            if not self.free[node]:
                del self.free[node]

    def _account(self, job: JobState, sign: int) -> None:
        for node, (g, c, m) in share_on_node(job, self.cluster).items():
            slot = self.room[node]
            slot.gpus += sign * g
            slot.cpus += sign * c
            slot.memory_gb += sign * m

    def fit(self, job: JobState, prefer: Collection[int] = ()) -> tuple[int, ...] | None:
        return resource_fit(job, self.free, self.room, self.cluster, prefer)

    def launch_job(self, job: JobState, gpus: tuple[int, ...]) -> None:
        self._take(gpus)
        self.launch[job.job_id] = gpus
        self._account(_as_running(job, gpus), -1)

    def holders(self) -> list[JobState]:
        """Jobs holding resources now in this walk: running (not suspended) and launched."""
        kept = [j for j in self.running.values() if j.job_id not in self.suspend]
        launched = [_as_running(self.jobs[j], g) for j, g in self.launch.items()]
        return kept + launched

    def view(self) -> ClusterState:
        """A scratch ``ClusterState`` showing the allocation as it stands in this walk."""
        source = self.cluster
        view = ClusterState(source.nodes.values(), source.gpus)
        for j in self.holders():
            view.assign(j.job_id, j.gpus)
        return view

    def drop(self, job: JobState) -> tuple[int, ...] | None:
        """Free what ``job`` holds in this walk; returns its launch if it was launched this walk."""
        relaunch = self.launch.pop(job.job_id, None)
        if relaunch is None:
            self.suspend[job.job_id] = None
        self._give(job.gpus)
        self._account(job, +1)
        return relaunch

    def restore(self, job: JobState, relaunch: tuple[int, ...] | None) -> None:
        if relaunch is not None:
            self.launch[job.job_id] = relaunch
        else:
            del self.suspend[job.job_id]
        self._take(job.gpus)
        self._account(job, -1)

    def result(self) -> Placement:
        allocation: dict[str, tuple[int, ...]] = {
            j: s.gpus for j, s in self.running.items() if j not in self.suspend
        }
        allocation.update(self.launch)
        plan = Plan(launch=dict(self.launch), suspend=tuple(self.suspend), terminate=dict(self.ranking.terminate))
        return Placement(allocation=allocation, plan=plan)


def _as_running(job: JobState, gpus: tuple[int, ...]) -> JobState:
    """A plain ``JobState`` copy of a waiting job as if it held ``gpus`` (the original, which may be
    an owner's subclass such as the simulator's, is never touched)."""
    if job.is_running and job.gpus == gpus:
        return job
    copy = JobState(**{f.name: getattr(job, f.name) for f in _JOB_FIELDS})
    copy.status = JobStatus.RUNNING
    copy.gpus = gpus
    return copy


_JOB_FIELDS = dataclasses.fields(JobState)
