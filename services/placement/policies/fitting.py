"""The class body shared by placement policies that are a fit rule walked over the ranking.

``consolidated`` and ``first-free`` differ only in how they pick GPUs for one job (the ``Fit``) and
what that fit promises (its ``SingleNode``); everything else (keep running jobs, preempt from the
bottom of the ranking, optional backfill) is ``services.core.placing.place_in_order``. A policy
module keeps its fit functions and a tiny registered subclass of ``FittingPolicy`` naming them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from services.core.decisions import Placement, Ranking
from services.core.placing import Fit, SingleNode, place_in_order
from services.core.state import ClusterState, JobState


class FittingPolicy:
    """A placement policy that walks the ranking with ``place_in_order`` using one fit rule.

    Subclasses set ``name`` and, as ``staticmethod``s (so they are not bound to the instance),
    ``fit`` and ``single_node``. ``backfill`` is passed to ``place_in_order`` unchanged.
    """

    name: ClassVar[str]
    keeps_running: ClassVar[bool] = True
    fit: Fit
    single_node: SingleNode | None
    """The fit's promise (``services.core.placing.SingleNode``), or None if it makes none."""

    def __init__(self, *, backfill: bool = False) -> None:
        self.backfill = backfill

    def place(
        self, ranking: Ranking, jobs: Mapping[str, JobState], cluster: ClusterState, now: float
    ) -> Placement:
        return place_in_order(ranking, jobs, cluster, self.fit, backfill=self.backfill, single_node=self.single_node)
