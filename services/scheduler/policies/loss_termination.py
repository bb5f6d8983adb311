"""``loss-termination``: end a job once its loss reaches its target (Blox §5.3), around any base policy.

Blox §5.3 ("Supporting loss-based termination"): "for each job we take as input an additional
parameter determining the relative loss threshold for termination (e.g., 0.2%). Next, in the
scheduling policy we add code to check if the current loss value for the job ... is below the
threshold and if this is the case, mark the job as completed and ready for termination."

Here that check wraps any scheduling policy, chosen by name: ``SCHEDULING.create("loss-termination",
base="las", base_options={...}, threshold=0.002)`` ranks exactly as ``las`` does and adds to
``Ranking.terminate`` every job whose latest loss is within the relative threshold of its target:

    loss <= target + threshold * |target|

with ``target = spec.loss_target`` (the user's target loss) and ``loss`` the job's most recent
reported loss (``JobState.loss``). The reason names the loss and the target.

Choices where Blox is silent: "within a relative threshold" is measured against ``|target|`` (so a
negative target works too) and a loss *below* the target always qualifies; jobs without a
``loss_target`` or without any reported loss are never terminated by this wrapper; the base
ranking's order and hints are kept unchanged (owners skip jobs listed in ``terminate``), and its
own ``terminate`` entries are kept (a base reason wins over ours for the same job). The wrapper
declares the base's triggers and ``preemptive`` flag, but not the ``sort_key`` fast path, since a
ranking with ``terminate`` entries is not a bare sort.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, cast

from services.core.decisions import Ranking
from services.core.protocols import SchedulingPolicy, Trigger, is_preemptive
from services.core.registry import SCHEDULING
from services.core.state import ClusterState, JobState


def reached_target(job: JobState, threshold: float) -> bool:
    """Whether ``job``'s latest loss is within ``threshold`` (relative) of ``spec.loss_target``."""
    target = job.spec.loss_target
    loss = job.loss
    if target is None or loss is None or not math.isfinite(loss):
        return False
    return loss <= target + threshold * abs(target)


class LossTermination:
    """A scheduling policy that ranks like ``base`` and terminates jobs that reached their loss target."""

    name = "loss-termination"

    def __init__(
        self, *, base: str = "fifo", base_options: Mapping[str, Any] | None = None, threshold: float = 0.002
    ) -> None:
        if not (threshold >= 0 and math.isfinite(threshold)):
            raise ValueError(f"threshold must be a finite relative tolerance >= 0 (0.002 = 0.2%), got {threshold}")
        if base == self.name:
            raise ValueError("loss-termination cannot wrap itself; name a base policy such as 'las'")
        self.base: SchedulingPolicy = SCHEDULING.create(base, **dict(base_options or {}))
        self.threshold = threshold
        self.triggers: Trigger = self.base.triggers
        self.preemptive = is_preemptive(self.base)

    def converged(self, jobs: Mapping[str, JobState]) -> dict[str, str]:
        """``{job id: reason}`` for every job that reached its loss target."""
        out: dict[str, str] = {}
        for job_id, job in jobs.items():
            if reached_target(job, self.threshold):
                out[job_id] = (
                    f"converged: loss {job.loss:g} is within {self.threshold:.3%} of target {job.spec.loss_target:g}"
                )
        return out

    def rank(self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Ranking:
        ranking = self.base.rank(jobs, cluster, now)
        done = self.converged(jobs)
        if not done:
            return ranking
        return dataclasses.replace(ranking, terminate={**done, **ranking.terminate})


@SCHEDULING.register("loss-termination")
def create(**options: Any) -> SchedulingPolicy:
    """Build a :class:`LossTermination`. A factory rather than the class itself because the
    wrapper's ``triggers`` are its base's, an instance attribute where the protocol declares a
    class variable; the object satisfies the protocol at runtime."""
    return cast(SchedulingPolicy, LossTermination(**options))
