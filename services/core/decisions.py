"""What policies return. Immutable, so a decision can be logged, sent and compared.

Fast-path fields (all optional, all additive): a producer that already knows a cheaper form of its
answer may attach it so a consumer does not have to recompute it in time proportional to every job.
``Ranking.order`` may be any ``Sequence`` (for example a lazy merge of two sorted lists, see
``services.core.ordering``); ``Ranking.running``/``Ranking.waiting`` restate the order restricted
to running/non-running jobs and ``Ranking.key`` compares two jobs' ranks; ``Placement.plan``
carries the diff when the placement policy computed it while placing. Consumers must treat these
hints as exactly equivalent to the full answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Admission:
    """An admission verdict for the jobs offered this round (new arrivals and previously held)."""

    accepted: tuple[str, ...] = ()
    held: tuple[str, ...] = ()
    rejected: Mapping[str, str] = field(default_factory=dict)
    """job id -> reason a user can act on."""


@dataclass(frozen=True, slots=True)
class Ranking:
    """Jobs in the order they should get GPUs, most deserving first."""

    order: Sequence[str]
    """Every admitted, unfinished job, most deserving first. A tuple, or a lazy ``Sequence`` view:
    iterate it front to back and stop early when you can (see ``services.core.placing``)."""
    terminate: Mapping[str, str] = field(default_factory=dict)
    """Jobs to end now, with the reason (e.g. converged: Blox §5.3 loss-based termination)."""
    gpu_targets: Mapping[str, int] = field(default_factory=dict)
    """Elastic policies (Optimus) ask for a GPU count other than the spec's here."""
    preempt: bool = True
    """Whether placement may suspend a running job to make room for a job ranked above it.
    Non-preemptive policies (vanilla FIFO, FitGpp §3's baseline) set False: a round then only fills
    free GPUs."""
    running: Sequence[str] | None = None
    """Optional hint: ``order`` restricted to jobs that are running now, in the same order."""
    waiting: Sequence[str] | None = None
    """Optional hint: ``order`` restricted to jobs that are not running, in the same order."""
    key: Callable[[str], Any] | None = None
    """Optional hint: a job id's sort key this round; ``key(a) < key(b)`` iff ``a`` ranks above
    ``b``. With ``running`` (whose ``reversed()`` is lazy) and ``waiting`` it lets placement walk the
    waiting jobs upwards and the preemption victims downwards without visiting every running job."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What must change to go from the current allocation to the target: suspend first, then launch.

    A job that moves (migration) appears in both.
    """

    launch: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    suspend: tuple[str, ...] = ()
    terminate: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return not (self.launch or self.suspend or self.terminate)


@dataclass(frozen=True, slots=True)
class Placement:
    """The target allocation after this round: every job that should hold GPUs, and which ones."""

    allocation: Mapping[str, tuple[int, ...]]
    """May be a lazy ``Mapping`` view (the running jobs kept, plus the launches)."""
    plan: Plan | None = None
    """Optional hint: the launches and suspensions this allocation implies (``terminate`` empty),
    for policies that know them while placing; ``diff_plan`` then skips its walk over every job."""
