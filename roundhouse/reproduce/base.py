"""What a reproduction is: a named run of a paper's headline experiment, ours beside the paper's numbers.

Each module of ``roundhouse.reproduce`` (one per paper) registers its experiments with
:func:`reproduction`. A runner takes :class:`Options` and returns a :class:`ReproResult` whose
``metrics`` put our number next to the paper's, so ``roundhouse reproduce NAME`` can print them side
by side and ``--json`` can write them (per metric: ``paper`` and ``ours``).

``--quick`` asks for a smaller, seeded version that finishes in under a minute on a laptop; tests
run that. The full version is the one recorded in ``docs/reproductions.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from services.runtime.child_pool import process_pool

T = TypeVar("T")
R = TypeVar("R")


class ReproductionError(RuntimeError):
    """A reproduction cannot run (unknown name, a missing trace file, ...); the message says why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    """How to run a reproduction."""

    quick: bool = False
    """A smaller seeded version (under a minute): what tests use."""
    seed: int = 0
    workers: int = 1
    """Processes for independent simulation cases (``roundhouse.sim.sweep.run_cases``)."""

    def command_line(self, name: str, *, program: str = "roundhouse reproduce") -> str:
        """The command that reruns reproduction ``name`` with these options (flags at defaults left out)."""
        parts = [f"{program} {name}"]
        if self.quick:
            parts.append("--quick")
        if self.seed:
            parts.append(f"--seed {self.seed}")
        if self.workers > 1:
            parts.append(f"--workers {self.workers}")
        return " ".join(parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class Metric:
    """One headline number: ours beside the paper's."""

    ours: float
    paper: float | None
    """The paper's number, or None where the paper states only a qualitative result (say it in
    ``description``)."""
    unit: str
    """``%`` (a relative change, e.g. -96.6), ``x`` (a ratio or speedup), ``s``, ``count``, ..."""
    description: str
    """What the number is, in words: ``"TE p95 slowdown, FitGpp vs FIFO"``."""
    note: str = ""
    """Where ours differs from the paper by more than its noise: why."""

    def to_json(self) -> dict[str, Any]:
        return {
            "paper": self.paper,
            "ours": _finite_or_none(self.ours),
            "unit": self.unit,
            "description": self.description,
            "note": self.note,
        }


@dataclass(slots=True, kw_only=True)
class ReproResult:
    """What one reproduction run found."""

    name: str
    title: str
    source: str
    """The paper and its figure, table or section: ``"FitGpp (OpML '19), Appendix A"``."""
    command: str
    """The command line that produced this result."""
    options: Options
    metrics: dict[str, Metric]
    details: dict[str, Any] = field(default_factory=dict)
    """Raw per-case numbers behind the metrics (JSON-serialisable)."""
    wall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "source": self.source,
            "command": self.command,
            "quick": self.options.quick,
            "seed": self.options.seed,
            "wall_s": round(self.wall_s, 3),
            "metrics": {key: metric.to_json() for key, metric in self.metrics.items()},
            "details": self.details,
        }


Runner = Callable[[Options], ReproResult]


@dataclass(frozen=True, slots=True)
class Reproduction:
    name: str
    title: str
    run: Runner


REPRODUCTIONS: dict[str, Reproduction] = {}
"""Every registered reproduction by name (filled when ``roundhouse.reproduce`` modules are imported;
``roundhouse.reproduce.load_all`` imports them all)."""


def reproduction(name: str, *, title: str) -> Callable[[Runner], Runner]:
    """Register ``runner`` as reproduction ``name`` (``roundhouse reproduce NAME``)."""

    def register(runner: Runner) -> Runner:
        if name in REPRODUCTIONS:
            raise ValueError(f"reproduction {name!r} is registered twice")
        REPRODUCTIONS[name] = Reproduction(name=name, title=title, run=runner)
        return runner

    return register


def parallel_map(fn: Callable[[T], R], items: Sequence[T], workers: int) -> list[R]:
    """``fn`` over ``items``, results in order; up to ``workers`` processes (in this one when 1).

    ``fn`` and the items must be picklable (module-level functions, plain dataclasses)."""
    if workers <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    # Workers that exit with this process: a reproduction killed with SIGKILL leaves none running.
    with process_pool(min(workers, len(items)), start_method=None) as pool:
        return list(pool.map(fn, items))


def relative_change_pct(ours: float, baseline: float) -> float:
    """``100 * (ours - baseline) / baseline``: the papers' "-15% avg JCT" convention."""
    if baseline == 0:
        return math.nan
    return 100.0 * (ours - baseline) / baseline


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
