"""``fitgpp`` victim selection: Fitting Grace Period Preemption (Yabuuchi et al., OpML '19; seed 000).

When a trial-and-error (TE) job cannot start, FitGpp preempts the one running best-effort (BE) job
that solves (§2.2)::

    Score(j) = ||D_j|| / max_J ||D_j||  +  s * GP_j / max_J GP_j                      (Eq. 1)
    argmin_j { Score(j) | D_TE <= D_j + N  and  PC_j < P }                              (Eq. 2)

``D_j`` is the vector (CPUs, RAM, GPUs) the job demands, each relative to the capacity of the node
it runs on (footnote 1); ``J`` is the set of all running BE jobs (the maxima are taken over all of
them, not only the eligible ones); ``N`` is the free resource on ``j``'s node, so ``D_TE <= D_j + N``
(componentwise) says that preempting ``j`` alone makes room for the TE job on that node; ``PC_j`` is
how often ``j`` was preempted and ``P`` the limit. ``GP_j`` is the job's grace period
(``spec.grace_period_s``). The paper's best setting is ``s = 4.0`` with ``P = 1`` (§3).

Choices where the paper is silent:

* ``P``: a job's own ``spec.max_preemptions`` wins; otherwise the policy option ``max_preemptions``
  (None: unbounded). The paper's evaluation uses P = 1 for every job.
* Norm: Euclidean. If every running BE job has a zero grace period (or demand), that term is 0.
* No eligible job: nothing is preempted (``()``); the TE job waits for the next round.
* Ties on the score: the most recently submitted job is preempted first (the tail of the FIFO
  queue FitGpp is built on), then the larger ``seq``.
* A TE job wider than every node cannot be helped by a single preemption: ``()``.
* A BE job spanning nodes is eligible if the condition holds on any node it spans, with its
  CPU/RAM split over its nodes by GPU count (``services.placement.policies.demand``).

Honouring the grace period (the victim keeps its GPUs until it has checkpointed, at most
``grace_period_s``) is the owner's job: the worker's two-phase stop, or the simulator's suspend
cost. The policy only chooses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from schemas.job import JobClass
from services.core.registry import VICTIM
from services.core.state import ClusterState, JobState
from services.placement.policies.demand import free_room, may_preempt, share_on_node


def relative_demand(job: JobState, cluster: ClusterState) -> tuple[float, float, float]:
    """``D_j``: (CPUs, RAM, GPUs) relative to the capacity of the job's first node (footnote 1)."""
    node = cluster.nodes[cluster.node_of(job.gpus[0])] if job.gpus else None
    spec = job.spec
    if node is None:
        return (0.0, 0.0, 0.0)
    return (spec.cpus / node.cpus, spec.memory_gb / node.memory_gb, spec.gpus / len(node.gpu_ids))


@VICTIM.register("fitgpp")
@dataclass(frozen=True, kw_only=True, slots=True)
class FitGppVictim:
    """Preempt the one running BE job with the lowest FitGpp score that makes room (Eq. 1-2)."""

    name: ClassVar[str] = "fitgpp"

    s: float = 4.0
    """Weight of the grace period against the resource demand (paper's best: 4.0)."""
    max_preemptions: int | None = None
    """``P`` for jobs whose spec does not set ``max_preemptions``; None: unbounded."""

    def __post_init__(self) -> None:
        if not (self.s >= 0 and math.isfinite(self.s)):
            raise ValueError(f"s must be a finite number >= 0, got {self.s}")
        if self.max_preemptions is not None and self.max_preemptions < 0:
            raise ValueError(f"max_preemptions must be >= 0 or None, got {self.max_preemptions}")

    def scores(self, running: Sequence[JobState], cluster: ClusterState) -> dict[str, float]:
        """Eq. 1 for every running BE job (the set ``J``)."""
        best_effort = [j for j in running if j.job_class is JobClass.BE and j.gpus]
        norms = {j.job_id: math.hypot(*relative_demand(j, cluster)) for j in best_effort}
        max_norm = max(norms.values(), default=0.0)
        max_gp = max((j.spec.grace_period_s for j in best_effort), default=0.0)
        out: dict[str, float] = {}
        for j in best_effort:
            size = norms[j.job_id] / max_norm if max_norm > 0 else 0.0
            grace = j.spec.grace_period_s / max_gp if max_gp > 0 else 0.0
            out[j.job_id] = size + self.s * grace
        return out

    def choose(
        self, needed: JobState, running: Sequence[JobState], cluster: ClusterState, now: float
    ) -> tuple[str, ...]:
        if needed.spec.gpus > cluster.largest_node_gpus:
            return ()
        scores = self.scores(running, cluster)
        if not scores:
            return ()
        room = free_room(running, cluster)
        want = needed.spec
        best: tuple[float, float, int] | None = None
        chosen = ""
        for j in running:
            score = scores.get(j.job_id)
            if score is None or j.job_id == needed.job_id or not may_preempt(j, self.max_preemptions):
                continue
            makes_room = any(
                want.gpus <= g + room[n].gpus
                and want.cpus <= c + room[n].cpus + 1e-9
                and want.memory_gb <= m + room[n].memory_gb + 1e-9
                for n, (g, c, m) in share_on_node(j, cluster).items()
            )
            if not makes_room:
                continue
            key = (score, -j.submit_time, -j.seq)
            if best is None or key < best:
                best, chosen = key, j.job_id
        return (chosen,) if best is not None else ()
