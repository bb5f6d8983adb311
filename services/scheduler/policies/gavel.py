"""``gavel``: Gavel's heterogeneity-aware scheduling (Narayanan et al., OSDI '20; Blox Table 1's
"heterogeneity aware LAS").

Each round solves Gavel's allocation LP (``services.core.gavel``: ``max-min-fairness``, Gavel's
heterogeneity-aware LAS and the default; ``finish-time-fairness``; ``makespan``) and turns it into
this round's (job, GPU type) pairs with Gavel's priorities, allocation over time received
(``services.core.gavel_rounds``). The ranking lists the jobs granted a type, in the order they were
granted, then the others. Pair it with the ``gavel`` placement policy, which puts each job on GPUs of
the type it was granted (same mechanism, same options); with any other placement policy the order
still holds but the types are not honoured.

Options: ``objective`` (above), ``heterogeneity_aware`` (false: every type counts as equally fast,
Gavel's own agnostic baseline), ``default_duration_s`` (run time assumed for a job without
``expected_duration_s``; FTF and makespan only), ``fill`` (grant GPUs left after Gavel's pairs to
waiting jobs). Preemptive and round-based like Gavel (its rounds are 6 minutes; ours are the
scheduler's ``round``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from services.core.decisions import Ranking
from services.core.gavel_rounds import GavelPolicyBase
from services.core.protocols import Trigger
from services.core.registry import SCHEDULING
from services.core.state import ClusterState, JobState


@SCHEDULING.register("gavel")
class GavelScheduling(GavelPolicyBase):
    """Rank by Gavel's round-based priorities over its LP allocation."""

    name: ClassVar[str] = "gavel"
    triggers: ClassVar[Trigger] = Trigger.TIMER
    preemptive: ClassVar[bool] = True

    def rank(self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Ranking:
        return Ranking(order=self.mechanism.decide(jobs, cluster, now).order)
