"""``lrtp`` victim selection: Longest Remaining Time Preemption (FitGpp §3 baseline, after Big-C).

FitGpp (seed 000) compares against LRTP, which "preferentially preempts the job with the longest
remaining execution time", simulated "on the assumption that it can perfectly estimate the
execution time of each job", and which continues "the preemption process until [it] can prepare
enough resource for an incoming TE job" (Appendix A).

Rule: running BE jobs with ``PC_j < P`` (same ``P`` rule as ``fitgpp``) are preempted in order of
estimated remaining time, longest first, until the TE job fits on one node (GPUs, CPUs and RAM;
see ``services.placement.policies.demand.until_fits``). Every victim taken on the way is kept, as
the baseline does; if even all of them do not make room, nothing is preempted.

Choices: remaining time is ``services.scheduler.policies.estimates.remaining_seconds`` (the
simulator's "perfect estimate" is the job's declared duration / iterations); jobs without an
estimate are preempted after every job with one; ties go to the most recently submitted job, then
the larger ``seq``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from schemas.job import JobClass
from services.core.registry import VICTIM
from services.core.state import ClusterState, JobState
from services.placement.policies.demand import may_preempt, until_fits
from services.scheduler.policies.estimates import remaining_seconds


@VICTIM.register("lrtp")
@dataclass(frozen=True, kw_only=True, slots=True)
class LrtpVictim:
    """Preempt BE jobs, longest remaining time first, until the TE job fits."""

    name: ClassVar[str] = "lrtp"

    max_preemptions: int | None = None
    """``P`` for jobs whose spec does not set ``max_preemptions``; None: unbounded."""

    def __post_init__(self) -> None:
        if self.max_preemptions is not None and self.max_preemptions < 0:
            raise ValueError(f"max_preemptions must be >= 0 or None, got {self.max_preemptions}")

    def choose(
        self, needed: JobState, running: Sequence[JobState], cluster: ClusterState, now: float
    ) -> tuple[str, ...]:
        def key(j: JobState) -> tuple[bool, float, float, int]:
            left = remaining_seconds(j)
            return (left is None, -(left or 0.0), -j.submit_time, -j.seq)

        candidates = sorted(
            (
                j
                for j in running
                if j.job_class is JobClass.BE and j.gpus and j.job_id != needed.job_id
                and may_preempt(j, self.max_preemptions)
            ),
            key=key,
        )
        return until_fits(needed, candidates, running, cluster)
