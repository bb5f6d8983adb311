"""``consolidated``: fewest nodes; never split a job that fits on one node (Blox §4.2-4.3).

Blox uses consolidated placement for all its policy comparisons (§4.2) and shows it wins on
10 Gbps V100 clusters (§4.3, Figure 10). Rules, after Blox ``_consolidated_placement``:

* a job that fits on one node goes to a node with exactly as many free GPUs as it needs, else to
  the node with the fewest free GPUs that is still enough (best fit, which limits fragmentation);
  ties go to the node first in cluster order. If no single node has room, the job waits, even when
  enough GPUs are free across nodes.
* a job larger than the largest node takes whole nodes, most free GPUs first (so the fewest nodes),
  and the remainder from the best-fitting node.

Within a node the lowest-numbered free GPUs are used. The walk over the ranking is
``services.core.placing.place_in_order``.
"""

from __future__ import annotations

from typing import ClassVar

from services.core.placing import FreeIndex, FreeMap
from services.core.registry import PLACEMENT
from services.core.state import ClusterState, JobState
from services.placement.policies.fitting import FittingPolicy


def consolidated_fit(job: JobState, need: int, free: FreeMap, cluster: ClusterState) -> tuple[int, ...] | None:
    """GPUs on the fewest nodes; a job that fits on one node is never split."""
    if isinstance(free, FreeIndex):
        return _indexed_fit(need, free, cluster)
    best = _best_fit(free, need)
    if best is not None:
        return tuple(sorted(free[best])[:need])
    if need <= cluster.largest_node_gpus:
        return None  # fits on one node, but no node has room now: wait rather than split
    chosen: list[int] = []
    remaining = need
    unused = dict(free)
    while remaining > 0 and unused:
        node = _best_fit(unused, remaining)
        if node is not None:  # the rest fits on one node
            chosen.extend(sorted(unused[node])[:remaining])
            return tuple(chosen)
        node = min(unused, key=lambda n: (-len(unused[n]), n))  # else the fullest free node, whole
        gpus = unused.pop(node)
        chosen.extend(sorted(gpus))
        remaining -= len(gpus)
    return tuple(chosen) if remaining == 0 else None


def consolidated_single_node(job: JobState, need: int, cluster: ClusterState) -> bool:
    """``consolidated_fit``'s ``services.core.placing.SingleNode`` promise: a job that fits on one
    node goes on the best-fitting node with ``need`` free GPUs; a wider one needs ``need`` in all."""
    return need <= cluster.largest_node_gpus


def _indexed_fit(need: int, free: FreeIndex, cluster: ClusterState) -> tuple[int, ...] | None:
    """``consolidated_fit`` answered from the walk's index (same result, no scan over nodes)."""
    best = free.best_fit(need)
    if best is not None:
        return tuple(sorted(free[best])[:need])
    if need <= cluster.largest_node_gpus or need > free.total:
        return None
    chosen: list[int] = []
    remaining = need
    used: set[int] = set()
    while remaining > 0:
        node = free.best_fit(remaining, used)
        if node is not None:  # the rest fits on one node
            chosen.extend(sorted(free[node])[:remaining])
            return tuple(chosen)
        node = next((n for n in free.most_first() if n not in used), None)  # the fullest node, whole
        if node is None:
            break
        used.add(node)
        gpus = free[node]
        chosen.extend(sorted(gpus))
        remaining -= len(gpus)
    return tuple(chosen) if remaining == 0 else None


def _best_fit(free: FreeMap, need: int) -> int | None:
    """The node with the fewest free GPUs that are still >= ``need`` (ties: first in cluster order)."""
    best: int | None = None
    best_free = 0
    for node, gpus in free.items():
        count = len(gpus)
        if count < need:
            continue
        if count == need:
            if best is None or best_free != need or node < best:
                best, best_free = node, count
            continue
        if best is None or count < best_free or (count == best_free and node < best):
            best, best_free = node, count
    return best


@PLACEMENT.register("consolidated")
class Consolidated(FittingPolicy):
    """Fewest nodes per job; best-fit node choice."""

    name: ClassVar[str] = "consolidated"
    fit = staticmethod(consolidated_fit)
    single_node = staticmethod(consolidated_single_node)
