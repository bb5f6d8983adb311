"""Simulated Pollux jobs: progress as goodput (``services.core.goodput``) instead of the cost model's
``(gpus / requested) ** scaling_exponent``.

A workload job with ``TraceJob.goodput`` set adapts its batch size to its allocation, as an AdaptDL
job does, so its progress rate on ``g`` GPUs over ``n`` nodes is its goodput speed-up
``SPEEDUP(n, g)`` (best goodput there over the best on one GPU; the goodput model includes its own
inter-node cost, so no spread slowdown is applied on top). Its ``duration_s`` is therefore its run
time alone on *one* GPU at the best batch size (``GoodputProfile.seconds(1, 1)``), and its
requested ``gpus`` should be 1: the simulator's one-GPU launch, which skips ``_rate``, runs at
rate 1, which is exactly ``SPEEDUP(1, 1)``.

The noise scale moves with progress (the profile's knots), so the goodput does; the engine's
progress is piecewise linear (a run's rate is fixed when it launches), so a run's rate is the mean
speed-up over the rest of the job's training on those GPUs, exact when the run goes on to the end
and close when Pollux re-allocates it first (the next run's rate starts from the progress made). The
job also *reports* the noise scale at its current progress (``noise_scale_now``, read through
``SimJobState.grad_noise_scale``), as ``roundhouse.train`` does live, so the Pollux policy sees the
same kind of state in the simulator and on a live cluster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.core.goodput import profile_for
from services.core.state import ClusterState

if TYPE_CHECKING:
    from services.core.simulation.jobs import SimJobState


def noise_scale_now(job: SimJobState) -> float | None:
    """The gradient noise scale a goodput job reports at its current progress; None otherwise."""
    trace = job.trace
    if trace is None or not trace.goodput:
        return None
    profile = profile_for(trace.model)
    return None if profile is None else profile.noise_scale_at(profile.progress_fraction(job.done_s))


def goodput_speedup(job: SimJobState, gpus: tuple[int, ...], cluster: ClusterState) -> float | None:
    """The progress rate of a goodput job on ``gpus``; None for a job whose progress is not goodput
    (the engine's own model applies). The rate is the job's mean speed-up there over the rest of
    its training (``GoodputProfile.mean_speedup``): exact while it keeps these GPUs to the end."""
    trace = job.trace
    if trace is None or not trace.goodput:
        return None
    profile = profile_for(trace.model)
    if profile is None:
        return None
    fraction = profile.progress_fraction(job.done_s)
    return profile.mean_speedup(cluster.nodes_spanned(gpus), len(gpus), fraction)
