"""``rand`` victim selection: preempt randomly chosen BE jobs (FitGpp §3 baseline RAND).

FitGpp (seed 000) compares against RAND, which "preempts a randomly selected running BE job", and
like LRTP "continue[s] the preemption process until [it] can prepare enough resource for an
incoming TE job" (Appendix A).

Rule: running BE jobs with ``PC_j < P`` (same ``P`` rule as ``fitgpp``) are shuffled and preempted
in that order until the TE job fits on one node (``demand.until_fits``); all victims taken on the
way are kept; if even all of them do not make room, nothing is preempted.

Determinism without hidden state: each call draws from a fresh ``random.Random`` seeded with the
string ``"{seed}:{TE job id}:{now!r}"`` (string seeds are hashed with SHA-512, so the draw does not
depend on ``PYTHONHASHSEED``), over the candidates sorted by ``seq`` then job id. The same inputs
and seed always give the same victims; different TE jobs or times give independent draws. The
paper averages RAND over four runs: vary ``seed``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from schemas.job import JobClass
from services.core.registry import VICTIM
from services.core.state import ClusterState, JobState
from services.placement.policies.demand import may_preempt, until_fits


@VICTIM.register("rand")
@dataclass(frozen=True, kw_only=True, slots=True)
class RandVictim:
    """Preempt randomly chosen BE jobs until the TE job fits."""

    name: ClassVar[str] = "rand"

    seed: int = 0
    max_preemptions: int | None = None
    """``P`` for jobs whose spec does not set ``max_preemptions``; None: unbounded."""

    def __post_init__(self) -> None:
        if self.max_preemptions is not None and self.max_preemptions < 0:
            raise ValueError(f"max_preemptions must be >= 0 or None, got {self.max_preemptions}")

    def choose(
        self, needed: JobState, running: Sequence[JobState], cluster: ClusterState, now: float
    ) -> tuple[str, ...]:
        candidates = sorted(
            (
                j
                for j in running
                if j.job_class is JobClass.BE and j.gpus and j.job_id != needed.job_id
                and may_preempt(j, self.max_preemptions)
            ),
            key=lambda j: (j.seq, j.job_id),
        )
        random.Random(f"{self.seed}:{needed.job_id}:{now!r}").shuffle(candidates)
        return until_fits(needed, candidates, running, cluster)
