"""``first-free``: the first free GPUs in cluster order (Blox's "First-Free GPU" placement, §7).

A job takes the lowest-numbered free GPUs, node after node in cluster order, and may therefore be
split across nodes even when one node could hold it (Blox ``_scattered_placement``). The walk over
the ranking (keep running jobs, preempt from the bottom of the ranking, stop at the first job that
does not fit) is ``services.core.placing.place_in_order``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from services.core.placing import FreeIndex, FreeMap
from services.core.registry import PLACEMENT
from services.core.state import ClusterState, JobState
from services.placement.policies.fitting import FittingPolicy


def first_free_fit(job: JobState, need: int, free: FreeMap, cluster: ClusterState) -> tuple[int, ...] | None:
    """The ``need`` lowest free GPU ids, taken node by node in cluster order."""
    chosen: list[int] = []
    if isinstance(free, FreeIndex):  # the walk's index: nodes already in order, total known
        if need > free.total:
            return None
        nodes: Sequence[int] = free.in_order()
    else:
        nodes = sorted(free)
    for node in nodes:
        for gpu in sorted(free[node]):
            chosen.append(gpu)
            if len(chosen) == need:
                return tuple(chosen)
    return None


def first_free_single_node(job: JobState, need: int, cluster: ClusterState) -> bool:
    """``first_free_fit``'s ``services.core.placing.SingleNode`` promise: it may split any job, and
    finds GPUs whenever ``need`` are free in all."""
    return False


@PLACEMENT.register("first-free")
class FirstFree(FittingPolicy):
    """Lowest free GPU ids first; jobs may span nodes."""

    name: ClassVar[str] = "first-free"
    fit = staticmethod(first_free_fit)
    single_node = staticmethod(first_free_single_node)
