"""Runtime estimates shared by the size-based scheduling policies (SRTF, Optimus, Themis FTF).

A job's size is known only from what its user declared in the spec and what the owner measured:

* ``spec.expected_iterations`` with a measured ``iteration_time_s``: the remaining time is
  ``(expected_iterations - iterations_done) * iteration_time_s``. Progress is counted in iterations,
  so this stays right when the job changed GPU count (Optimus) or was slowed by a bad placement.
* otherwise ``spec.expected_duration_s`` (wall seconds at the requested GPU count): the remaining
  time is ``expected_duration_s - executed_time``.
* otherwise the job has no estimate (``None``). Each policy states what it does with such jobs.

Both rules match how Blox's SRTF/Optimus compute ``time_remaining`` (iteration time x total
iterations minus service so far) and how the Tiresias simulator computes SRTF's
``duration - executed_time``; remaining time never goes below zero.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from services.core.state import JobState


class MissingEstimate(enum.StrEnum):
    """What a size-based policy does with a job that has no runtime estimate."""

    LAST = "last"
    """Rank such jobs after every job with an estimate, in submit order (FIFO)."""
    ERROR = "error"
    """Refuse to rank: raise :class:`MissingEstimateError` naming the jobs."""


class MissingEstimateError(ValueError):
    """A size-based policy was asked to rank jobs whose runtime it cannot estimate."""

    def __init__(self, policy: str, job_ids: Iterable[str]) -> None:
        ids = sorted(job_ids)
        shown = ", ".join(ids[:5]) + (f" (+{len(ids) - 5} more)" if len(ids) > 5 else "")
        super().__init__(
            f"{policy} needs a runtime estimate for job(s) {shown}: set spec.expected_duration_s, or "
            f"spec.expected_iterations once the job reports iteration_time_s; or configure {policy} "
            f"with on_missing='last' to rank such jobs last in submit order"
        )
        self.policy = policy
        self.job_ids = tuple(ids)


def remaining_seconds(job: JobState) -> float | None:
    """Seconds the job still needs at its measured (or requested) speed; ``None`` if unknown."""
    spec = job.spec
    if spec.expected_iterations is not None and job.iteration_time_s is not None:
        left = spec.expected_iterations - job.iterations_done
        return max(0.0, left * job.iteration_time_s)
    if spec.expected_duration_s is not None:
        return max(0.0, spec.expected_duration_s - job.executed_time)
    return None


def estimates(job: JobState) -> tuple[float, float] | None:
    """(remaining seconds, total seconds) in one pass, or None when the job has no estimate."""
    spec = job.spec
    iterations, per_iteration = spec.expected_iterations, job.iteration_time_s
    if iterations is not None and per_iteration is not None:
        left = (iterations - job.iterations_done) * per_iteration
        return (left if left > 0 else 0.0), iterations * per_iteration
    duration = spec.expected_duration_s
    if duration is not None:
        left = duration - job.executed_time
        return (left if left > 0 else 0.0), duration
    return None


def total_seconds(job: JobState) -> float | None:
    """Seconds the whole job takes running alone on its GPUs; ``None`` if unknown."""
    spec = job.spec
    if spec.expected_iterations is not None and job.iteration_time_s is not None:
        return spec.expected_iterations * job.iteration_time_s
    if spec.expected_duration_s is not None:
        return spec.expected_duration_s
    return None


def parse_missing(value: MissingEstimate | str) -> MissingEstimate:
    """Accept the enum or its string from config; reject anything else with the valid choices."""
    try:
        return MissingEstimate(value)
    except ValueError:
        valid = ", ".join(repr(m.value) for m in MissingEstimate)
        raise ValueError(f"on_missing must be one of {valid}, not {value!r}") from None
