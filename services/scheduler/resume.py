"""When a live run counts as resumed: ``JobState.resumed_at`` for the time-slicing policies.

``rr``, ``slaq`` and ``hermes`` keep a running job while ``now <= resumed_at``
(``policies/time_slicing.protected``), so that a checkpoint restore + relaunch longer than their
quantum cannot get a resumed job preempted before it makes any progress: the livelock found in the
simulator, which knows ``resumed_at`` exactly (``services.core.simulation.jobs``). Live, the scheduler learns
it from the job's own progress reports:

* A run has **resumed** once the ``job-metrics`` aggregate shows an iteration of *this* run: the
  aggregate's ``lease_id`` is the run's lease and its ``iteration`` is past the one the run resumed
  from (``Lease.from_iteration``: the grant's ``resume_iteration``, the iteration stored with the
  checkpoint, not the progress an earlier run reported past it; 0 for a fresh start). Both checks
  are needed: the worker publishes the channel's numbers from its first tick, before the process
  has restored anything (iteration 0), and ``Job.restore`` sets the channel's iteration to the
  checkpoint's before the first new iteration is done. ``resumed_at`` is then the newest sample's
  ``ts`` (within a metrics period plus a flush of the first new iteration), put within
  ``[launch, now]`` on the scheduler's clock like every worker fact (``reconcile.fact_time``).
* Until then it is **still restoring**, but for a bounded time: ``resumed_at = launch + allowance``
  (``SchedulerConfig.restore_allowance_s``). A job that never reports progress (a plain command
  not using ``roundhouse.train``) is thus kept for one allowance after each launch and then competes
  like any other; a reporting job leaves the protection at its first reported iteration, however
  long the allowance. The allowance is an operator's setting rather than the spec's
  ``grace_period_s``, which a user sets and could raise to keep a GPU.

The launch is ``last_start_time``, the grant's commit, as for the quantum itself.
"""

from __future__ import annotations

from typing import Final

from services.metrics.aggregates import JobAggregate
from services.scheduler.leases import Lease

DEFAULT_RESTORE_ALLOWANCE_S: Final = 120.0
"""Longest time a run counts as restoring without reporting progress. Covers the simulator's
largest restore + relaunch (45 s, ``services.core.costs``) with room for slow storage; a longer
allowance costs only jobs that never report progress (longer slices), a shorter one risks the
livelock for real restores that are slower than it."""


def progress_at(aggregate: JobAggregate, lease: Lease, launched: float, now: float) -> float | None:
    """When ``aggregate`` shows the run of ``lease`` (launched at ``launched``) making progress, on
    our clock; None if it does not show that (another run's numbers, or none past the restore)."""
    if aggregate.lease_id != lease.lease_id or aggregate.iteration <= lease.from_iteration:
        return None
    return min(now, max(aggregate.last_ts, launched))


def resumed_at(launched: float, progress: float | None, allowance_s: float) -> float:
    """``JobState.resumed_at`` of a run launched at ``launched``: its first progress, or the end of
    the restore allowance if that comes first (or no progress was seen)."""
    bound = launched + allowance_s
    return bound if progress is None else min(progress, bound)
