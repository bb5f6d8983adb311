"""Quantum bookkeeping shared by the time-slicing rankings (``hermes``, ``rr``, ``slaq``; Hermes §3.3-4.1).

These policies give a GPU to a job for a time quantum and decide again when it ends. A policy is a
pure function of the snapshot, so "the quantum has not ended yet" is read from it: a running job is
*protected* while ``now - last_start_time < quantum``, i.e. during the first quantum of its current
run; it ranks ahead of every job that is not protected, so placement keeps it. Once that quantum is
over it competes at every decision like the waiting jobs (and keeps its GPU while it wins).

Choice (the snapshot holds no record of earlier decisions): a job that wins again at the end of its
quantum is re-examined at each later round instead of getting a fresh protected quantum; with
rounds as long as the quantum (``round_s = quantum_s``, the intended setting) the two agree.
"""

from __future__ import annotations

from services.core.state import JobState

EPS = 1e-9


def protected(job: JobState, now: float, quantum_s: float) -> bool:
    """Whether running ``job`` is still inside the first quantum of its current run."""
    started = job.last_start_time
    return job.is_running and started is not None and now - started < quantum_s - EPS


def check_quantum(quantum_s: float) -> float:
    """Validate a quantum option (seconds)."""
    if not quantum_s > 0:
        raise ValueError(f"quantum_s must be > 0 seconds, got {quantum_s}")
    return float(quantum_s)
