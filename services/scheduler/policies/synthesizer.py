"""Blox's automatic scheduler synthesizer (§5.2): the candidate set and the pure choice of the best.

Blox §5.2: "every ten rounds (a round is five minutes) we run a simulation in parallel for all
possible combinations with the same cluster setup and the available jobs on the cluster ... We use
this simulation to collect the metrics of importance and choose which combination of policies to
run in order to maximize the metric of interest." The combinations are three scheduling policies,
FIFO, SRTF and LAS, times three admission policies, Accept All, Accept-1.2x and Accept-1.4x.

This module is the decision half only:

* :data:`CANDIDATES`: the nine (scheduling, admission) combinations, in a fixed canonical order;
* :func:`should_synthesize`: whether round ``n`` is a synthesis round (every ``every`` rounds);
* :func:`choose_best`: given each combination's metric from the forward simulations, the one to run.

The forward simulation of every combination from the current state is
:mod:`services.scheduler.policies.candidates` (each run by :mod:`services.core.simulation.forward`);
the registered ``synthesizer`` scheduling and admission policies that run it every ``every``
rounds and switch to :func:`choose_best`'s pick are in :mod:`services.scheduler.policies.synthesis`.

Tie-breaking (Blox is silent), in this order:

1. the best value for the metric's direction (``min`` for times, ``max`` for throughput-like
   metrics); values within ``rel_tolerance`` of the best (relative to ``|best|``; 0 = exact ties
   only) count as tied, so simulation noise does not make the scheduler flap;
2. among tied combinations, the one running now (``current``): switching has a cost (jobs may be
   preempted or held differently) and no measured benefit; failing that, one that changes only
   one half of it (keeps its scheduling or its admission policy), for the same reason. This
   matters because a forward simulation without held jobs cannot tell admission policies apart:
   all three admissions of the best scheduling policy tie, and the one in force should stay;
3. then the earliest in :data:`CANDIDATES` order (FIFO before SRTF before LAS; Accept All before
   1.2x before 1.4x): the simplest policy wins a tie, and the result never depends on dict order.

Every candidate must have a finite result; a missing or NaN result is an error, since silently
skipping a combination would bias the choice.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SYNTHESIS_EVERY_ROUNDS = 10
"""Blox §5.2: synthesize every ten rounds (of five minutes)."""


class Direction(enum.StrEnum):
    MIN = "min"
    MAX = "max"


METRICS: Mapping[str, Direction] = {
    "avg_jct_s": Direction.MIN,
    "p95_jct_s": Direction.MIN,
    "avg_responsiveness_s": Direction.MIN,
    "makespan_s": Direction.MIN,
    "avg_slowdown": Direction.MIN,
    "utilization": Direction.MAX,
    "throughput_jobs_per_h": Direction.MAX,
}
"""Metrics the synthesizer knows how to compare, with the direction that is better (Blox §5.2 uses
average JCT; Appendix A adds responsiveness)."""


@dataclass(frozen=True, slots=True)
class Combination:
    """One candidate: a scheduling policy and an admission policy, by registry name and options."""

    scheduling: str
    admission: str
    admission_options: tuple[tuple[str, Any], ...] = field(default=())
    label: str = ""

    def __str__(self) -> str:
        return self.label or f"{self.scheduling}+{self.admission}"

    def admission_kwargs(self) -> dict[str, Any]:
        return dict(self.admission_options)


_ADMISSIONS: tuple[tuple[str, tuple[tuple[str, Any], ...], str], ...] = (
    ("accept-all", (), "accept-all"),
    ("load-threshold", (("factor", 1.2),), "accept-1.2x"),
    ("load-threshold", (("factor", 1.4),), "accept-1.4x"),
)

CANDIDATES: tuple[Combination, ...] = tuple(
    Combination(scheduling, admission, options, f"{scheduling}+{label}")
    for scheduling in ("fifo", "srtf", "las")
    for admission, options, label in _ADMISSIONS
)
"""Blox §5.2's nine combinations, in canonical (tie-breaking) order."""


def should_synthesize(round_index: int, every: int = SYNTHESIS_EVERY_ROUNDS) -> bool:
    """Whether round ``round_index`` (0-based) is a synthesis round: 0, every, 2 x every, ..."""
    if every <= 0:
        raise ValueError(f"every must be a positive number of rounds, got {every}")
    return round_index % every == 0


def choose_best(
    results: Mapping[Combination, float],
    *,
    metric: str = "avg_jct_s",
    direction: Direction | str | None = None,
    current: Combination | None = None,
    rel_tolerance: float = 0.0,
    candidates: tuple[Combination, ...] = CANDIDATES,
) -> Combination:
    """The combination to run next, from each candidate's simulated ``metric`` (see module doc).

    ``direction`` defaults to the metric's entry in :data:`METRICS`; name it for other metrics.
    """
    if direction is None:
        try:
            direction = METRICS[metric]
        except KeyError:
            raise ValueError(
                f"unknown metric {metric!r}: pass direction='min' or 'max', or use one of {sorted(METRICS)}"
            ) from None
    direction = Direction(direction)
    if not (rel_tolerance >= 0 and math.isfinite(rel_tolerance)):
        raise ValueError(f"rel_tolerance must be a finite number >= 0, got {rel_tolerance}")
    missing = [str(c) for c in candidates if c not in results]
    if missing:
        raise ValueError(f"no {metric} result for candidate(s) {missing}: simulate every candidate")
    values = {c: results[c] for c in candidates}
    bad = [str(c) for c, v in values.items() if not math.isfinite(v)]
    if bad:
        raise ValueError(f"{metric} is not a finite number for {bad}")
    sign = 1.0 if direction is Direction.MIN else -1.0
    best = min(sign * v for v in values.values())
    slack = rel_tolerance * abs(best)
    tied = [c for c in candidates if sign * values[c] <= best + slack]
    if current is not None:
        if current in tied:
            return current
        halves = [c for c in tied if c.scheduling == current.scheduling or _same_admission(c, current)]
        if halves:
            return halves[0]
    return tied[0]


def _same_admission(a: Combination, b: Combination) -> bool:
    return (a.admission, a.admission_options) == (b.admission, b.admission_options)
