"""``synthesizer``: Blox's automatic scheduler synthesizer (§5.2) as a scheduling and an admission policy.

Blox §5.2: "every ten rounds (a round is five minutes) we run a simulation in parallel for all
possible combinations with the same cluster setup and the available jobs on the cluster ... and
choose which combination of policies to run in order to maximize the metric of interest."

Three objects:

* :class:`Synthesis`, the decision: the combination running now (one of
  :data:`~services.scheduler.policies.synthesizer.CANDIDATES`), the round count, and every
  ``every`` rounds the forward simulation of all candidates from the current snapshot
  (:mod:`services.scheduler.policies.candidates`, each run by :mod:`services.core.simulation.forward`)
  followed by :func:`~services.scheduler.policies.synthesizer.choose_best`
  (tie rules there: the running combination stays when tied).
* :class:`SynthesizerScheduling` (registered ``synthesizer`` in ``SCHEDULING``): each ``rank`` is one
  round; it lets the decision synthesize when due, then ranks with the current scheduling policy.
* :class:`SynthesizerAdmission` (registered ``synthesizer`` in ``ADMISSION``, in
  ``services.admission.policies.synthesizer``): admits with the current admission policy, and tells
  the decision which jobs it held (they are part of "the jobs on the cluster" to simulate).

Both are pure in the protocol's sense: no I/O, no clock (they use ``now``), inputs never mutated;
the forward simulations are CPU work done in the call (in ``workers`` processes if asked).

**Sharing one decision.** :func:`synthesizer_pair` builds the two policies around one
:class:`Synthesis`. Owners that create policies by name (``roundhouse simulate --scheduler
synthesizer --admission synthesizer``, the services) cannot pass an object, so the registered
factories pair up by ``group`` (option, default ``"default"``): the first of the two kinds created
makes a decision and leaves it waiting; the next policy of the *other* kind created in the same
process with the same group and the same options takes it. A newer policy of the same kind replaces
the waiting one (configuration checks build a throw-away instance first). The waiting slot holds a
weak reference, so nothing outlives its policies.

**Who synthesizes.** Once the scheduling policy has ranked (the simulator; one process), it drives:
rounds are its ``rank`` calls (Blox counts rounds), synthesis on rounds 0, ``every``, 2 x ``every``,
..., from the jobs ``rank`` gets plus the jobs admission held this round (a round whose ``now``
was just simulated, by admission before the first round, is not simulated twice). The admission
policy alone in its process (the live admission service runs apart from the scheduler), or before
any round, drives itself on time: at its first call and then at the first call ``every x round_s``
seconds after the last synthesis, from the jobs it sees (its offered jobs are the held ones); the
live scheduler's policy, alone in its process, simulates without held jobs. The two live halves
decide from different views and may disagree (each applies its own half); a bus message carrying
the choice would fix that, and is not a policy's business.

Choices where Blox is silent, and why:

* **Timer rounds only** (``triggers = TIMER``): Blox is round-based, and churn rounds would make
  "every ten rounds" depend on the arrival rate. The forward runs use the same triggers, so SRTF
  is simulated as it runs under the synthesizer (registered ``srtf`` also rounds on churn).
* **A switch takes effect in the round it is decided** for scheduling (this round's ranking) and
  from the next round for admission (this round's admission already ran before ``rank``).
* **Initial combination** ``fifo+accept-all`` (option ``initial``): round 0 synthesizes anyway.
* **Admission is only as good as what is simulated**: a forward run has no future arrivals (Blox:
  the jobs on the cluster), so admission only matters for jobs held at the snapshot. Under
  Accept All nothing is ever held, every admission candidate ties with it, and the tie rule keeps
  it: the synthesizer then chooses among scheduling policies only. That follows from Blox's design
  as described; we report it rather than invent arrivals.
* **Failures**: if the snapshot cannot be simulated (a live job without ``expected_duration_s``),
  the current combination stays and the reason is recorded (``Synthesis.history``); an empty
  cluster (no jobs) is not simulated and nothing changes.
* **Metrics**: those :mod:`services.core.simulation.forward` measures (``avg_jct_s`` default,
  ``avg_responsiveness_s``, ``p95_jct_s``, ``makespan_s``), all minimized.
"""

from __future__ import annotations

import collections
import math
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from services.core.costs import CostModel
from services.core.decisions import Admission, Ranking
from services.core.protocols import AdmissionPolicy, SchedulingPolicy, Trigger
from services.core.registry import ADMISSION, SCHEDULING
from services.core.simulation import forward
from services.core.state import ClusterState, JobState
from services.scheduler.policies.candidates import simulate_candidates
from services.scheduler.policies.synthesizer import (
    CANDIDATES,
    METRICS,
    SYNTHESIS_EVERY_ROUNDS,
    Combination,
    choose_best,
    should_synthesize,
)

DEFAULT_INITIAL = "fifo+accept-all"
HISTORY_LIMIT = 10_000
"""Synthesis records kept (a live scheduler runs for months; the simulator's runs fit easily)."""


@dataclass(frozen=True, slots=True)
class SynthesisRecord:
    """One synthesis: when, what ran before, what was chosen, and every candidate's value."""

    now: float
    round_index: int
    previous: str
    chosen: str
    values: tuple[tuple[str, float], ...] = ()
    """(candidate label, metric value) in candidate order; empty when skipped."""
    skipped: str = ""
    """Why no simulation ran (empty if one did)."""
    jobs: int = 0


class Synthesis:
    """The decision shared by the synthesizer's scheduling and admission policies (module doc)."""

    def __init__(
        self,
        *,
        metric: str = "avg_jct_s",
        every: int = SYNTHESIS_EVERY_ROUNDS,
        round_s: float = 300.0,
        horizon_s: float | None = None,
        placement: str = "consolidated",
        placement_options: Mapping[str, Any] | None = None,
        rel_tolerance: float = 0.0,
        workers: int = 1,
        initial: str = DEFAULT_INITIAL,
        free_preemption: bool = False,
    ) -> None:
        if metric not in forward.FORWARD_METRICS or metric not in METRICS:
            valid = sorted(forward.FORWARD_METRICS & set(METRICS))
            raise ValueError(f"the synthesizer cannot optimize {metric!r}; valid: {valid}")
        should_synthesize(0, every)  # validates every
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if not (rel_tolerance >= 0 and math.isfinite(rel_tolerance)):
            raise ValueError(f"rel_tolerance must be a finite number >= 0, got {rel_tolerance}")
        by_label = {str(c): c for c in CANDIDATES}
        if initial not in by_label:
            raise ValueError(f"unknown initial combination {initial!r}; valid: {', '.join(by_label)}")
        self.metric = metric
        self.every = every
        self.rel_tolerance = rel_tolerance
        self.workers = workers
        self.settings = forward.ForwardSettings(
            round_s=round_s,
            horizon_s=horizon_s,
            costs=CostModel.free() if free_preemption else CostModel(),
            triggers=SynthesizerScheduling.triggers,
        )
        self.placement = placement
        """The placement policy of every forward run (by name, with ``placement_options``)."""
        self.placement_options: dict[str, Any] = dict(placement_options or {})
        self.current: Combination = by_label[initial]
        self.rounds = 0
        self.last_synthesis: float | None = None
        self.history: collections.deque[SynthesisRecord] = collections.deque(maxlen=HISTORY_LIMIT)
        self.has_scheduling = False
        """Set by the first scheduling round: from then on rounds drive synthesis, not admission."""
        self._held: tuple[JobState, ...] = ()
        self._scheduling: dict[str, SchedulingPolicy] = {}
        self._admission: dict[tuple[str, tuple[tuple[str, Any], ...]], AdmissionPolicy] = {}

    # --- the policies in force -----------------------------------------------------------------
    def scheduling_policy(self) -> SchedulingPolicy:
        name = self.current.scheduling
        policy = self._scheduling.get(name)
        if policy is None:
            policy = self._scheduling[name] = SCHEDULING.create(name)
        return policy

    def admission_policy(self) -> AdmissionPolicy:
        key = (self.current.admission, self.current.admission_options)
        policy = self._admission.get(key)
        if policy is None:
            policy = self._admission[key] = ADMISSION.create(self.current.admission, **self.current.admission_kwargs())
        return policy

    # --- driving -------------------------------------------------------------------------------
    def note_held(self, held: Sequence[JobState]) -> None:
        """Admission held these jobs this round (the next ``on_round`` simulates them too)."""
        self._held = tuple(held)

    def on_round(self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> None:
        """One scheduling round: synthesize if it is round 0, ``every``, 2 x ``every``, ..."""
        self.has_scheduling = True
        held, self._held = self._held, ()
        if should_synthesize(self.rounds, self.every) and self.last_synthesis != now:
            self.synthesize(jobs, cluster, now, held=held)
        self.rounds += 1

    def on_admission(
        self, offered: Sequence[JobState], jobs: Mapping[str, JobState], cluster: ClusterState, now: float
    ) -> None:
        """An admission call; synthesizes on time only when no scheduling policy drives (module doc)."""
        if self.has_scheduling:
            return
        period = self.every * self.settings.round_s
        if self.last_synthesis is None or now >= self.last_synthesis + period:
            self.synthesize(jobs, cluster, now, held=offered)

    def synthesize(
        self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float, *, held: Sequence[JobState] = ()
    ) -> Combination:
        """Simulate every candidate from this state and switch to the best; returns the choice."""
        self.last_synthesis = now
        previous = self.current
        try:
            snapshot = forward.take_snapshot(jobs, cluster, now, held=held)
        except forward.MissingDurationError as exc:
            self._record(now, previous, skipped=str(exc))
            return previous
        if not snapshot.jobs:
            self._record(now, previous, skipped="no jobs to simulate")
            return previous
        results = simulate_candidates(
            snapshot,
            settings=self.settings,
            placement=self.placement,
            placement_options=self.placement_options,
            workers=self.workers,
        )
        values = {c: r.metric(self.metric) for c, r in results.items()}
        self.current = choose_best(values, metric=self.metric, current=previous, rel_tolerance=self.rel_tolerance)
        self._record(
            now, previous, values=tuple((str(c), values[c]) for c in CANDIDATES), jobs=len(snapshot.jobs)
        )
        return self.current

    def _record(
        self,
        now: float,
        previous: Combination,
        *,
        values: tuple[tuple[str, float], ...] = (),
        skipped: str = "",
        jobs: int = 0,
    ) -> None:
        self.history.append(
            SynthesisRecord(now, self.rounds, str(previous), str(self.current), values, skipped, jobs)
        )

    def time_shares(self, end: float) -> dict[str, float]:
        """Seconds each combination was in force, from the first synthesis until ``end`` (Blox Fig. 15)."""
        shares: dict[str, float] = {}
        records = [r for r in self.history]
        for record, after in zip(records, [*records[1:], None], strict=True):
            until = after.now if after is not None else end
            shares[record.chosen] = shares.get(record.chosen, 0.0) + max(0.0, until - record.now)
        return shares


class SynthesizerScheduling:
    """Ranks with the combination in force; every ``every`` rounds the decision may switch it."""

    name: ClassVar[str] = "synthesizer"
    triggers: ClassVar[Trigger] = Trigger.TIMER
    preemptive: ClassVar[bool] = True

    def __init__(self, synthesis: Synthesis) -> None:
        self.synthesis = synthesis

    def rank(self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Ranking:
        self.synthesis.on_round(jobs, cluster, now)
        return self.synthesis.scheduling_policy().rank(jobs, cluster, now)


class SynthesizerAdmission:
    """Admits with the combination in force and reports the jobs it held to the decision."""

    name: ClassVar[str] = "synthesizer"

    def __init__(self, synthesis: Synthesis) -> None:
        self.synthesis = synthesis

    def admit(
        self,
        offered: Sequence[JobState],
        jobs: Mapping[str, JobState],
        cluster: ClusterState,
        now: float,
    ) -> Admission:
        synthesis = self.synthesis
        synthesis.on_admission(offered, jobs, cluster, now)
        verdict = synthesis.admission_policy().admit(offered, jobs, cluster, now)
        if verdict.held:
            held = set(verdict.held)
            synthesis.note_held([j for j in offered if j.job_id in held])
        else:
            synthesis.note_held(())
        return verdict


def synthesizer_pair(**options: Any) -> tuple[SynthesizerScheduling, SynthesizerAdmission]:
    """The two policies around one new :class:`Synthesis` built with ``options``."""
    synthesis = Synthesis(**options)
    return SynthesizerScheduling(synthesis), SynthesizerAdmission(synthesis)


_WAITING: dict[tuple[str, str], tuple[weakref.ref[Synthesis], tuple[tuple[str, Any], ...]]] = {}
"""(group, kind still missing) -> a decision made by the other kind, and the options it was made with."""


def _options_key(options: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, repr(v)) for k, v in options.items()))


def paired_synthesis(kind: str, group: str, options: Mapping[str, Any]) -> Synthesis:
    """The decision for a new ``kind`` ("scheduling" or "admission") policy of ``group`` (module doc)."""
    if kind not in ("scheduling", "admission"):
        raise ValueError(f"kind must be 'scheduling' or 'admission', got {kind!r}")
    other = "admission" if kind == "scheduling" else "scheduling"
    key = _options_key(options)
    waiting = _WAITING.pop((group, kind), None)
    if waiting is not None:
        ref, made_with = waiting
        synthesis = ref()
        if synthesis is not None and made_with == key:
            return synthesis
    synthesis = Synthesis(**options)
    _WAITING[(group, other)] = (weakref.ref(synthesis), key)
    return synthesis


@SCHEDULING.register("synthesizer")
def create_scheduling(*, group: str = "default", **options: Any) -> SchedulingPolicy:
    """The registered ``synthesizer`` scheduling policy, paired by ``group`` (module doc)."""
    return SynthesizerScheduling(paired_synthesis("scheduling", group, options))


def create_admission(*, group: str = "default", **options: Any) -> AdmissionPolicy:
    """The ``synthesizer`` admission policy (registered in ``services.admission.policies.synthesizer``)."""
    return SynthesizerAdmission(paired_synthesis("admission", group, options))
