"""The synthesizer's forward runs: every candidate combination simulated from one snapshot (Blox §5.2).

Blox §5.2: "we run a simulation in parallel for all possible combinations with the same cluster
setup and the available jobs on the cluster". The simulation of one set of policies is
``services.core.simulation.forward`` (policy objects in, metrics out); this module creates each
candidate's policies by registry name, the same placement policy for all, and runs them, in
``workers`` processes if asked (a name travels to another process, a policy object may not).
:func:`forward_simulate` takes the snapshot and runs them all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from services.core.registry import ADMISSION, PLACEMENT, SCHEDULING
from services.core.simulation.forward import ForwardResult, ForwardSettings, Snapshot, simulate, take_snapshot
from services.core.state import ClusterState, JobState, JobStatus
from services.scheduler.policies.synthesizer import CANDIDATES, Combination

DEFAULT_PLACEMENT = "consolidated"

PlacementOptions = tuple[tuple[str, Any], ...]
"""A placement policy's keyword options as sorted (name, value) pairs: hashable and picklable."""


def simulate_candidate(
    snapshot: Snapshot,
    candidate: Combination,
    settings: ForwardSettings,
    placement: str = DEFAULT_PLACEMENT,
    placement_options: PlacementOptions = (),
) -> ForwardResult:
    """Run ``candidate`` forward from ``snapshot`` (in this process; see :func:`simulate_candidates`)."""
    return simulate(
        snapshot,
        admission=ADMISSION.create(candidate.admission, **candidate.admission_kwargs()),
        scheduling=SCHEDULING.create(candidate.scheduling),
        placement=PLACEMENT.create(placement, **dict(placement_options)),
        settings=settings,
    )


def _simulate_packed(args: tuple[Snapshot, Combination, ForwardSettings, str, PlacementOptions]) -> ForwardResult:
    return simulate_candidate(*args)


def simulate_candidates(
    snapshot: Snapshot,
    *,
    candidates: Sequence[Combination] = CANDIDATES,
    settings: ForwardSettings | None = None,
    placement: str = DEFAULT_PLACEMENT,
    placement_options: Mapping[str, Any] | None = None,
    workers: int = 1,
) -> dict[Combination, ForwardResult]:
    """Every candidate's forward run from ``snapshot``, in candidate order; up to ``workers``
    processes (Blox runs them in parallel; 1 runs them here, one after another)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    settings = settings or ForwardSettings()
    options: PlacementOptions = tuple(sorted((placement_options or {}).items()))
    distinct = _distinct_runs(snapshot, candidates)
    runs = list(dict.fromkeys(distinct.values()))
    if workers == 1 or len(runs) <= 1:
        results = [simulate_candidate(snapshot, c, settings, placement, options) for c in runs]
    else:
        with ProcessPoolExecutor(max_workers=min(workers, len(runs))) as pool:
            results = list(pool.map(_simulate_packed, [(snapshot, c, settings, placement, options) for c in runs]))
    by_run = dict(zip(runs, results, strict=True))
    return {c: by_run[distinct[c]] for c in candidates}


def _distinct_runs(snapshot: Snapshot, candidates: Sequence[Combination]) -> dict[Combination, Combination]:
    """For each candidate, the candidate whose run stands for it. Without held jobs the admission
    policy is never consulted (a forward run has no arrivals after t=0), so candidates that differ
    only in admission give the same run, bit for bit: one run per scheduling policy suffices."""
    if any(fj.status is JobStatus.HELD for fj in snapshot.jobs):
        return {c: c for c in candidates}
    first: dict[str, Combination] = {}
    return {c: first.setdefault(c.scheduling, c) for c in candidates}


def forward_simulate(
    jobs: Mapping[str, JobState],
    cluster: ClusterState,
    now: float,
    *,
    held: Sequence[JobState] = (),
    candidates: Sequence[Combination] = CANDIDATES,
    settings: ForwardSettings | None = None,
    placement: str = DEFAULT_PLACEMENT,
    placement_options: Mapping[str, Any] | None = None,
    workers: int = 1,
) -> dict[Combination, ForwardResult]:
    """``take_snapshot`` then :func:`simulate_candidates`: each candidate's metrics from this state on."""
    snapshot = take_snapshot(jobs, cluster, now, held=held)
    return simulate_candidates(
        snapshot,
        candidates=candidates,
        settings=settings,
        placement=placement,
        placement_options=placement_options,
        workers=workers,
    )


__all__ = ["DEFAULT_PLACEMENT", "forward_simulate", "simulate_candidate", "simulate_candidates"]
