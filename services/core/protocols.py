"""The four swappable policy kinds (after Blox Table 6). Implementations register by name.

Every policy is a pure function of its inputs: it receives ``now`` instead of reading a clock, does
no I/O, never mutates ``jobs`` or ``cluster``, and is deterministic given its seed. That is what lets
the same object run in the services, in the simulator and in unit tests.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import ClassVar, Protocol, runtime_checkable

from services.core.decisions import Admission, Placement, Ranking
from services.core.state import ClusterState, JobState


class Trigger(enum.Flag):
    """When a policy wants a round: on the timer, and/or on churn."""

    TIMER = enum.auto()
    ARRIVAL = enum.auto()
    COMPLETION = enum.auto()
    CHURN = ARRIVAL | COMPLETION


@runtime_checkable
class AdmissionPolicy(Protocol):
    name: ClassVar[str]

    def admit(
        self,
        offered: Sequence[JobState],
        jobs: Mapping[str, JobState],
        cluster: ClusterState,
        now: float,
    ) -> Admission:
        """Decide on ``offered`` (held jobs first, then new arrivals, each in submit order).

        ``jobs`` holds every admitted, unfinished job.
        """
        ...


@runtime_checkable
class SchedulingPolicy(Protocol):
    name: ClassVar[str]
    triggers: ClassVar[Trigger]

    def rank(self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Ranking:
        """Order the admitted, unfinished jobs (running and waiting) by who should hold GPUs."""
        ...


@runtime_checkable
class PlacementPolicy(Protocol):
    name: ClassVar[str]

    def place(
        self,
        ranking: Ranking,
        jobs: Mapping[str, JobState],
        cluster: ClusterState,
        now: float,
    ) -> Placement:
        """Return the allocation every job should hold after this round.

        Running jobs not in the result are suspended; jobs whose GPUs change are migrated.
        """
        ...


@runtime_checkable
class VictimPolicy(Protocol):
    name: ClassVar[str]

    def choose(
        self,
        needed: JobState,
        running: Sequence[JobState],
        cluster: ClusterState,
        now: float,
    ) -> tuple[str, ...]:
        """Pick running jobs to preempt so that ``needed`` fits (FitGpp, LRTP, RAND); may be empty."""
        ...
