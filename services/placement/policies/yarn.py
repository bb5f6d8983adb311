"""``yarn``: the Tiresias simulator's default placement (its ``ms_yarn_placement``), so that FIFO and
the other policies can be compared with that simulator like for like (docs/simulator.md,
"Cross-check against the Tiresias simulator").

All of a job's GPUs come from one switch, the switches tried in cluster order. Within a switch, with
G the GPUs of the largest node:

* a job of ``need`` <= G GPUs takes the lowest ``need`` free GPUs of the *first* node, in cluster
  order, that has that many free (``consolidated`` takes the best-fitting node instead);
* a wider job takes ``need // G`` whole idle nodes, the first ones in order, and the remaining
  ``need % G`` GPUs from the first other node that has them free; it never spreads over partly used
  nodes, as ``consolidated`` may.

The reference also counts CPUs and memory per node; Roundhouse's placement rules place GPUs only
(with the Tiresias cluster specs those never bind). The walk over the ranking is
``services.core.placing.place_in_order``. The rule makes no ``single_node`` promise (a wide job's
fit is neither kind the promise knows), so preemption tries victims one at a time: fine for the
clusters that simulator models, slower than ``consolidated`` on thousands of nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import ClassVar

from services.core.placing import FreeIndex, FreeMap
from services.core.registry import PLACEMENT
from services.core.state import ClusterState, JobState
from services.placement.policies.fitting import FittingPolicy


@lru_cache(maxsize=8)
def switches_in_order(cluster: ClusterState) -> tuple[tuple[int, ...], ...]:
    """Node positions grouped by switch, switches in order of their first node (nodes never change)."""
    groups: dict[str, list[int]] = {}
    for position, node_id in enumerate(cluster.node_ids):
        groups.setdefault(cluster.nodes[node_id].switch, []).append(position)
    return tuple(tuple(positions) for positions in groups.values())


def yarn_fit(job: JobState, need: int, free: FreeMap, cluster: ClusterState) -> tuple[int, ...] | None:
    """The GPUs ``ms_yarn_placement`` would give a job of ``need`` GPUs (module docstring)."""
    total = free.total if isinstance(free, FreeIndex) else sum(len(gpus) for gpus in free.values())
    if need > total:
        return None
    width = cluster.largest_node_gpus
    for positions in switches_in_order(cluster):
        gpus = _fit_in_switch(need, width, positions, free)
        if gpus is not None:
            return gpus
    return None


def _fit_in_switch(need: int, width: int, positions: Sequence[int], free: FreeMap) -> tuple[int, ...] | None:
    if need <= width:
        return _first_node_with(need, positions, free, skip=())
    whole, rest = divmod(need, width)
    idle: list[int] = []
    for position in positions:
        if len(free.get(position, ())) == width:  # all GPUs of a largest node free
            idle.append(position)
            if len(idle) == whole:
                break
    else:
        return None
    chosen = [gpu for position in idle for gpu in sorted(free[position])]
    if rest:
        last = _first_node_with(rest, positions, free, skip=idle)
        if last is None:
            return None
        chosen.extend(last)
    return tuple(chosen)


def _first_node_with(
    need: int, positions: Sequence[int], free: FreeMap, *, skip: Sequence[int]
) -> tuple[int, ...] | None:
    """The lowest ``need`` free GPUs of the first node (not in ``skip``) with that many free."""
    for position in positions:
        gpus = free.get(position)
        if gpus is not None and len(gpus) >= need and position not in skip:
            return tuple(sorted(gpus)[:need])
    return None


@PLACEMENT.register("yarn")
class YarnPlacement(FittingPolicy):
    """The Tiresias simulator's ``ms_yarn``: one switch; first node that fits, else whole idle nodes."""

    name: ClassVar[str] = "yarn"
    fit = staticmethod(yarn_fit)
    single_node = None
