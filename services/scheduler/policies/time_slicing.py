"""Quantum bookkeeping shared by the time-slicing rankings (``hermes``, ``rr``, ``slaq``; Hermes §3.3-4.1).

These policies give a GPU to a job for a time quantum and decide again when it ends. A policy is a
pure function of the snapshot, so "the quantum has not ended yet" is read from it: a running job is
*protected* while ``now - last_start_time < quantum``, i.e. during the first quantum of its current
run, and for as long as it is still restoring its checkpoint (``now <= resumed_at``, where the owner
knows when progress resumes). It ranks ahead of every job that is not protected, so placement keeps
it. Once both are over it competes at every decision like the waiting jobs (and keeps its GPU while
it wins).

Why the restore clause: a restore + relaunch as long as the quantum or longer (tens of seconds
against Hermes' 10 s) would otherwise end the quantum before the job makes any progress, and the
policies would then preempt resumed jobs forever (found in the simulator: an ``rr`` run with the
default preemption costs never finished). The quantum still counts from the launch, so with rounds
on a grid of the quantum a job restored within its quantum competes at the next round, as before,
and the preemption overhead is part of the slice (the cost of time-slicing).

Choice (the snapshot holds no record of earlier decisions): a job that wins again at the end of its
quantum is re-examined at each later round instead of getting a fresh protected quantum; with
rounds as long as the quantum (``round_s = quantum_s``, the intended setting) the two agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from services.core.decisions import Ranking
from services.core.protocols import Trigger
from services.core.state import ClusterState, JobState

Key = tuple[int, float, int, float, int]

EPS = 1e-9


def protected(job: JobState, now: float, quantum_s: float) -> bool:
    """Whether running ``job`` is inside the first quantum of its current run or still restoring."""
    if not job.is_running:
        return False
    started = job.last_start_time
    if started is not None and now - started < quantum_s - EPS:
        return True
    resumed = job.resumed_at
    return resumed is not None and now <= resumed + EPS


def check_quantum(quantum_s: float) -> float:
    """Validate a quantum option (seconds)."""
    if not quantum_s > 0:
        raise ValueError(f"quantum_s must be > 0 seconds, got {quantum_s}")
    return float(quantum_s)


class QuantumRanking:
    """A time-slicing ranking: protected running jobs first, then the others by ``order_key``.

    Subclasses (``rr``, ``slaq``) give ``name`` and ``order_key(job, now)``, the ``(float, int)``
    middle of the key; ties go to submit time, then ``seq``. Triggers: timer and churn."""

    name: ClassVar[str]
    triggers: ClassVar[Trigger] = Trigger.TIMER | Trigger.CHURN

    def __init__(self, *, quantum_s: float = 30.0) -> None:
        self.quantum_s = check_quantum(quantum_s)

    def order_key(self, job: JobState, now: float) -> tuple[float, int]:
        raise NotImplementedError

    def key(self, job: JobState, now: float) -> Key:
        if protected(job, now, self.quantum_s):
            return (0, 0.0, 0, job.submit_time, job.seq)
        primary, secondary = self.order_key(job, now)
        return (1, primary, secondary, job.submit_time, job.seq)

    def rank(self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Ranking:
        key = self.key
        return Ranking(order=tuple(j.job_id for j in sorted(jobs.values(), key=lambda j: key(j, now))))
