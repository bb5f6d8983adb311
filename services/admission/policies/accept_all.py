"""``accept-all``: admit every job as it arrives (Blox §5.1, "Accept All", the default admission).

Nothing is ever held or rejected, so every arrival joins the ranked set in the round it is offered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from services.core.decisions import Admission
from services.core.registry import ADMISSION
from services.core.state import ClusterState, JobState


@ADMISSION.register("accept-all")
class AcceptAll:
    """Admit everything offered, in the order offered."""

    name: ClassVar[str] = "accept-all"
    accepts_all: ClassVar[bool] = True

    def admit(
        self,
        offered: Sequence[JobState],
        jobs: Mapping[str, JobState],
        cluster: ClusterState,
        now: float,
    ) -> Admission:
        return Admission(accepted=tuple(job.job_id for job in offered))
