"""Workloads whose jobs converge early: loss curves for Blox §5.3 loss-based termination.

Blox §5.3: "Prior work (jeon2019analysis) has observed that 'around 75% of jobs reach within 0.1% of
lowest loss using only 40% of the epochs' ... Based on the observation ... we randomly assign 75%
of the jobs to converge in 40% of their training time." Blox's trace "contains per-job loss
progression"; it is not published, so :class:`Converging` attaches a modelled curve
(:class:`services.core.simulation.loss.LossCurve`) and a target loss to every job of a base stream:

* with probability ``early_fraction`` (0.75), drawn per job from the stream ``"<seed>:converging"``
  (never from the base workload's streams, so the base jobs are the same with and without curves),
  the job's smooth loss reaches its target at ``early_progress`` (0.4) of its work, i.e. at 40% of
  its run time alone on its GPUs ("40% of their training time");
* every other job reaches its target exactly at the end of its work (progress 1.0): it converges
  when its epochs run out, so loss-based termination cannot shorten it.

Curve shape (Roundhouse's choice; Blox gives none): every job starts at loss ``initial`` (1.0),
decays exponentially towards ``floor`` (0.0) and its ``loss_target`` is ``target`` (0.1): "within
0.1% of lowest loss" is folded into the target the termination policy compares against, so that
the policy's relative threshold (``loss-termination``'s ``threshold``) only has to absorb rounding.
The curve's scale does not matter to termination (only when the target is crossed does), and the
curve is smooth (``noise`` 0): a noisy reported loss could dip under the target early and stop a
job too soon, which Blox's "converge in 40%" does not describe. Loss samples are the simulator's
(``services.core.simulation.loss``); the termination check runs at rounds, so a job ends at the first round
after it reaches its target.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from roundhouse.sim.synthetic import stream
from services.core.simulation.loss import LossCurve
from services.core.simulation.workload import TraceJob, WorkloadError


@dataclass(frozen=True, slots=True, kw_only=True)
class Converging:
    """``base`` with a loss curve and target on every job (see the module docstring)."""

    base: Iterable[TraceJob]
    seed: int = 0
    early_fraction: float = 0.75
    early_progress: float = 0.4
    initial: float = 1.0
    floor: float = 0.0
    target: float = 0.1

    def __post_init__(self) -> None:
        if not 0 <= self.early_fraction <= 1:
            raise WorkloadError(f"early fraction must be in [0, 1], got {self.early_fraction}")
        if not 0 < self.early_progress <= 1:
            raise WorkloadError(f"early progress must be in (0, 1], got {self.early_progress}")
        if not self.floor < self.target < self.initial:
            raise WorkloadError(f"need floor < target < initial, got {self.floor}, {self.target}, {self.initial}")

    def curves(self) -> tuple[LossCurve, LossCurve]:
        """The (early, at-the-end) curves: shared by all jobs of each kind (immutable)."""
        early = LossCurve.reaching(self.target, self.early_progress, initial=self.initial, floor=self.floor)
        late = LossCurve.reaching(self.target, 1.0, initial=self.initial, floor=self.floor)
        return early, late

    def __iter__(self) -> Iterator[TraceJob]:
        early, late = self.curves()
        draws = stream(self.seed, "converging")
        for job in self.base:
            curve = early if draws.random() < self.early_fraction else late
            yield replace(job, loss_curve=curve, loss_target=self.target)


def converges_early(job: TraceJob) -> bool:
    """Whether ``job`` (from :class:`Converging`) reaches its target before the end of its work."""
    if job.loss_curve is None or job.loss_target is None:
        return False
    return job.loss_curve.progress_at(job.loss_target) < 1.0 - 1e-9


__all__ = ["Converging", "converges_early"]
