"""What policies return. Immutable, so a decision can be logged, sent and compared."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


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

    order: tuple[str, ...]
    terminate: Mapping[str, str] = field(default_factory=dict)
    """Jobs to end now, with the reason (e.g. converged: Blox §5.3 loss-based termination)."""
    gpu_targets: Mapping[str, int] = field(default_factory=dict)
    """Elastic policies (Optimus) ask for a GPU count other than the spec's here."""


@dataclass(frozen=True, slots=True)
class Placement:
    """The target allocation after this round: every job that should hold GPUs, and which ones."""

    allocation: Mapping[str, tuple[int, ...]]


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
