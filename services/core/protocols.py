"""The four swappable policy kinds (after Blox Table 6). Implementations register by name.

Every policy is a pure function of its inputs: it receives ``now`` instead of reading a clock, does
no I/O, never mutates ``jobs`` or ``cluster``, and is deterministic given its seed. That is what lets
the same object run in the services, in the simulator and in unit tests.

Fast paths (optional; read this before writing a policy that must scale)
------------------------------------------------------------------------
A simulated cluster with 10^5 waiting jobs cannot afford a full sort and a walk over every job on
each of 10^4..10^5 rounds. Policies may therefore declare, with the optional members below, facts
that let the owner of the state (simulator or scheduler service) keep an incrementally maintained
order and skip work that cannot change the outcome. The semantics of ``rank``/``place`` never change;
the hooks only promise equivalences that tests check:

``SchedulingPolicy``
  * ``sort_key(job, now) -> tuple`` (see ``SortKeyPolicy``): declare it only when ``rank`` is exactly
    ``sorted(jobs.values(), key=lambda j: self.sort_key(j, now))`` with empty ``terminate`` and
    ``gpu_targets``. The key of a job that is not running must stay constant while its state stays
    the same, until ``key_stable_until(job, now)`` (``math.inf`` if never: FIFO's submit time, LAS's
    attained service). Keys of running jobs may change with time (LAS); owners re-key them when
    needed. ``services.core.ordering.KeyedOrder`` then maintains the order in O(log n) per change and
    hands placement a lazy ``Ranking`` (``order``, ``running``, ``waiting``, ``key``).
  * ``key_parts(job) -> (head, tail)`` (optional, with ``sort_key``): for a *running* job,
    ``sort_key(job, now) == (*head, job.attained_service, *tail)`` at every ``now``, head and tail
    constant while it runs (LAS). Owners that know how attained service grows then keep running
    jobs in an order that time does not change, and find preemption victims without re-keying
    every running job each round.
  * ``preemptive: ClassVar[bool]`` (default True): False promises that ``rank`` always returns
    ``Ranking(preempt=False)``, so a round can only fill free GPUs; owners skip rounds when no GPU is
    free or nothing changed since the last round.

``PlacementPolicy``
  * ``keeps_running: ClassVar[bool]`` (default False): True promises that a running job is never
    moved or resized unless it is suspended for a higher-ranked job, so a round in which no job is
    waiting (and none is held) changes nothing and may be skipped.
  * ``Placement.plan`` (see ``decisions``): return the diff if you know it, so nobody walks every job.
  * Iterate ``Ranking.order`` front to back and stop early: once no GPU is free and every running
    job has been seen, the rest of the order cannot change the outcome
    (``services.core.placing.place_in_order`` does this for any ``fit`` function).

``AdmissionPolicy``
  * ``accepts_all: ClassVar[bool]`` (default False): True promises ``admit`` accepts every offered
    job, so owners may skip building the offered list.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

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
class SortKeyPolicy(Protocol):
    """Optional capability of a scheduling policy whose ranking is a sort by a per-job key."""

    def sort_key(self, job: JobState, now: float) -> tuple[Any, ...]:
        """The job's key; smaller ranks first. Must be total: end with ``job.seq``."""
        ...

    def key_stable_until(self, job: JobState, now: float) -> float:
        """For a job that is not running: until when ``sort_key`` keeps its current value if the
        job's state does not change (``math.inf`` if forever)."""
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


def is_sort_keyed(policy: object) -> bool:
    """Whether ``policy`` declares the ``SortKeyPolicy`` fast path."""
    return callable(getattr(policy, "sort_key", None)) and callable(getattr(policy, "key_stable_until", None))


def is_preemptive(policy: object) -> bool:
    """A scheduling policy's ``preemptive`` flag (True unless it declares otherwise)."""
    return bool(getattr(policy, "preemptive", True))


def keeps_running(policy: object) -> bool:
    """A placement policy's ``keeps_running`` flag (False unless it declares otherwise)."""
    return bool(getattr(policy, "keeps_running", False))


def accepts_all(policy: object) -> bool:
    """An admission policy's ``accepts_all`` flag (False unless it declares otherwise)."""
    return bool(getattr(policy, "accepts_all", False))
