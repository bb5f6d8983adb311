"""The job lifecycle: every transition of a ``JobState``, written once.

A job is HELD until admission lets it in, then QUEUED (waiting for GPUs), RUNNING while it holds
GPUs, QUEUED again when its run stops (a suspension, or a run lost with its node), and it ends
COMPLETED, FAILED, CANCELLED or REJECTED. Each function below moves a job from one state to the next
and keeps what policies read consistent with it: the GPUs it holds, when it started first and last,
how long it has been waiting and its longest wait (Blox's LAS starvation guard), its preemptions.

Two owners drive these transitions, and both call these functions:

* the simulator (``services.core.simulation.engine``) mutates its jobs in place;
* the scheduler's job book (``services.scheduler.book``) must persist a transition before it applies
  it (a write that fails changes nothing in memory). It passes ``into=Changes()``: the function then
  reads the job and writes the new values into that record instead of into the job; the book stores
  them and applies them to the job once the store committed them. Either way the values come from
  the same rule.

Progress (attained service, executed time) is each owner's own accounting of when a run advances:
:func:`progress` is the rule for an owner that counts it from the run's start (the scheduler: from
the grant). The simulator keeps its running jobs' progress as a line evaluated on access
(``services.core.simulation.jobs.SimJobState``), the same rule from when the run's restore ends.

Speed: the simulator calls these on every arrival, launch, suspension and completion, so they only
read and write attributes: no builtin calls (``max``), no allocation. Their optional parameters are
not keyword-only on purpose: CPython 3.11 looks a keyword-only default up in a dict on every call
that omits it, a positional default costs nothing (measured: ~0.7% of the simulator's case (a)).
Callers still name ``into=`` and ``preempted=``; the simulator passes ``gpus`` and ``started`` to
:func:`launch` by position (a keyword call costs more).
"""

from __future__ import annotations

from typing import Any

from services.core.state import JobState, JobStatus

_QUEUED = JobStatus.QUEUED
_RUNNING = JobStatus.RUNNING
"""Module constants: ``JobStatus.RUNNING`` is an enum class lookup on every call."""


class Changes:
    """The field values of a transition, recorded instead of applied (``into=``).

    Only the fields the transition wrote are set; :meth:`fields` returns them by name, in the order
    they were written."""

    status: JobStatus
    admit_time: float | None
    first_start_time: float | None
    last_start_time: float | None
    last_preempt_time: float | None
    finish_time: float | None
    queued_since: float | None
    longest_wait_s: float
    preemptions: int
    attained_service: float
    executed_time: float
    gpus: tuple[int, ...]

    def fields(self) -> dict[str, Any]:
        return dict(vars(self))


Target = JobState | Changes
"""Where a transition writes: the job itself (default) or a :class:`Changes` record."""


def admit(job: JobState, now: float, into: Target | None = None) -> None:
    """HELD -> QUEUED: admission let the job in at ``now``; it starts waiting for GPUs."""
    target = job if into is None else into
    target.status = _QUEUED
    target.admit_time = now
    target.queued_since = now


def launch(
    job: JobState,
    now: float,
    gpus: tuple[int, ...] | None = None,
    started: float | None = None,
    into: Target | None = None,
) -> None:
    """QUEUED -> RUNNING, decided at ``now``: its wait ends (``longest_wait_s`` keeps the longest
    completed wait) and ``last_start_time`` is ``now``. A first run sets ``first_start_time``: to
    ``started``, when the job gets its GPUs later than the decision (the simulator: once the
    victims' checkpoints are written), else ``now``.

    ``gpus``: the global GPU ids it holds, when the owner knows them at launch (the simulator); the
    scheduler's book learns them from its topology at each snapshot (``JobBook.refresh``).

    Two branches, one rule (the simulator launches on every swap: in place, it writes only what
    changes; a record gets every field the rule sets, so that every grant the book writes has the
    same columns and the store batches them). ``test_lifecycle`` checks that both agree."""
    if into is None:
        job.status = _RUNNING
        if gpus is not None:
            job.gpus = gpus
        if job.first_start_time is None:
            job.first_start_time = now if started is None else started
        job.last_start_time = now
        since = job.queued_since
        if since is not None:
            waited = now - since
            if waited > job.longest_wait_s:  # noqa: PLR1730 (no max() call: once per launch)
                job.longest_wait_s = waited
            job.queued_since = None
        return
    into.status = _RUNNING
    if gpus is not None:
        into.gpus = gpus
    first = job.first_start_time
    into.first_start_time = first if first is not None else (now if started is None else started)
    into.last_start_time = now
    longest = job.longest_wait_s
    since = job.queued_since
    if since is not None:
        waited = now - since
        if waited > longest:  # noqa: PLR1730
            longest = waited
    into.longest_wait_s = longest
    into.queued_since = None


def suspend(job: JobState, now: float, preempted: bool = True, into: Target | None = None) -> None:
    """RUNNING -> QUEUED: the run stopped at ``now``; the job holds no GPU and waits again.

    ``preempted``: the owner stopped it (a plan's suspension), counted in ``preemptions`` and
    ``last_preempt_time``; False for a run that was lost (its node went silent, its grant was
    interrupted), after which the job simply waits again."""
    target = job if into is None else into
    target.status = _QUEUED
    target.queued_since = now
    target.gpus = ()
    if preempted:
        target.preemptions = job.preemptions + 1
        target.last_preempt_time = now


def finish(job: JobState, status: JobStatus, now: float, into: Target | None = None) -> None:
    """-> ``status`` (COMPLETED, FAILED, CANCELLED or REJECTED): the job ends at ``now``, or at the
    finish time it already has (one the owner ended while it ran keeps the time it recorded); it
    waits for nothing and holds no GPU."""
    target = job if into is None else into
    target.status = status
    finished = job.finish_time
    target.finish_time = finished if finished is not None else now
    target.queued_since = None
    target.gpus = ()


def progress(
    job: JobState,
    now: float,
    *,
    since: float,
    service0: float,
    executed0: float,
    gpus: int,
    into: Target | None = None,
) -> None:
    """A running job's progress at ``now``, for an owner that counts it from the run's start: the
    run began at ``since`` with ``service0`` GPU-seconds of attained service (Tiresias' GPUs x
    time) and ``executed0`` seconds executed, and has held ``gpus`` GPUs since."""
    target = job if into is None else into
    dt = now - since
    if dt < 0.0:  # noqa: PLR1730
        dt = 0.0
    target.attained_service = service0 + gpus * dt
    target.executed_time = executed0 + dt


__all__ = ["Changes", "Target", "admit", "finish", "launch", "progress", "suspend"]
