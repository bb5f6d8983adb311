"""Quantum bookkeeping shared by the time-slicing rankings (``hermes``, ``rr``, ``slaq``; Hermes §3.3-4.1).

These policies give a GPU to a job for a time quantum and decide again when it ends. A policy is a
pure function of the snapshot, so "the quantum has not ended yet" is read from it: a running job is
*protected* during the first quantum of *progress* of its current run: while it restores its
checkpoint and then while ``now - resumed_at < quantum`` (``resumed_at`` falls back to
``last_start_time`` where the owner cannot tell when progress resumed). It ranks ahead of every job
that is not protected, so placement keeps it. Once that quantum is over it competes at every
decision like the waiting jobs (and keeps its GPU while it wins).

Why from ``resumed_at``: counted from the launch, a restore + relaunch longer than the quantum (tens
of seconds against Hermes' 10 s) ends the quantum before the job makes any progress, and the
policies then preempt resumed jobs forever without progress (found in the simulator, where a
Hermes run with the default preemption costs never finished).

Choice (the snapshot holds no record of earlier decisions): a job that wins again at the end of its
quantum is re-examined at each later round instead of getting a fresh protected quantum; with
rounds as long as the quantum (``round_s = quantum_s``, the intended setting) the two agree.
"""

from __future__ import annotations

from services.core.state import JobState

EPS = 1e-9


def protected(job: JobState, now: float, quantum_s: float) -> bool:
    """Whether running ``job`` is still restoring or inside the first quantum of progress of its run."""
    if not job.is_running:
        return False
    started = job.resumed_at if job.resumed_at is not None else job.last_start_time
    return started is not None and now - started < quantum_s - EPS


def check_quantum(quantum_s: float) -> float:
    """Validate a quantum option (seconds)."""
    if not quantum_s > 0:
        raise ValueError(f"quantum_s must be > 0 seconds, got {quantum_s}")
    return float(quantum_s)
