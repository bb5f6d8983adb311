"""Load-threshold admission: Blox's "Accept 1.2x / 1.5x" (Blox §5.1; Blox ``load_based_accept.py``).

Blox §5.1: "once the number of GPUs requested by admitted jobs crosses a threshold (e.g. 1.5x the
number of GPUs available in the cluster), we enqueue newly arriving jobs in the admission control
block. Jobs are released for scheduling in a FIFO manner as resources become available."

Rule, as in Blox's ``accept``: walk the offered jobs in order (held jobs first, then arrivals,
each in submit order, as the round passes them); while the GPU demand of the admitted, unfinished
jobs (``sum(spec.gpus)`` over ``jobs``, plus jobs accepted earlier in this call) is at most
``factor x total GPUs``, accept the next job; once it exceeds that, hold this job and every job
after it. The check happens before adding a job, so the last job accepted may take demand past
the threshold, exactly as Blox does; and the queue is strict FIFO (no small job overtakes a held
one), which is what "released in a FIFO manner" means and what keeps large jobs from starving.

Choices where Blox is silent: demand counts requested GPUs (``spec.gpus``), not elastic targets;
the held queue is not stored in the policy (the owner keeps held jobs and offers them again, in
order, each round), so the policy stays a pure function of its inputs; nothing is rejected.

Registered as ``load-threshold`` (option ``factor``) and, for Blox's named settings,
``accept-1.2x`` and ``accept-1.5x``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

from services.core.decisions import Admission
from services.core.registry import ADMISSION
from services.core.state import ClusterState, JobState


@ADMISSION.register("load-threshold")
@dataclass(frozen=True, kw_only=True, slots=True)
class LoadThresholdAdmission:
    """Admit in FIFO order while admitted GPU demand is at most ``factor`` x cluster GPUs."""

    name: ClassVar[str] = "load-threshold"

    factor: float = 1.2
    """Demand threshold as a multiple of the cluster's GPU count (Blox: 1.0, 1.2, 1.4, 1.5)."""

    def __post_init__(self) -> None:
        if not self.factor > 0:
            raise ValueError(f"factor must be > 0, got {self.factor}")

    def admit(
        self,
        offered: Sequence[JobState],
        jobs: Mapping[str, JobState],
        cluster: ClusterState,
        now: float,
    ) -> Admission:
        limit = self.factor * cluster.total_gpus
        demand = sum(j.spec.gpus for j in jobs.values())
        accepted: list[str] = []
        for index, job in enumerate(offered):
            if demand > limit:
                return Admission(accepted=tuple(accepted), held=tuple(j.job_id for j in offered[index:]))
            accepted.append(job.job_id)
            demand += job.spec.gpus
        return Admission(accepted=tuple(accepted))


ADMISSION.register("accept-1.2x")(partial(LoadThresholdAdmission, factor=1.2))
ADMISSION.register("accept-1.5x")(partial(LoadThresholdAdmission, factor=1.5))
