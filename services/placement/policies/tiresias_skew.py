"""Tiresias placement: consolidate only placement-sensitive models (Gu et al., NSDI '19, §3.3; Blox §4.3).

Tiresias §3.3 observes that only models with a large *skew* (one huge tensor dominating the model,
so one parameter server carries most of the traffic: VGG, AlexNet) slow down when their workers
are spread over machines; other models (ResNet, Inception, ...) can be "safely fragmented". Its
placement therefore consolidates the skewed jobs and places the rest so as to minimize
fragmentation. Tiresias detects skew by profiling tensor sizes; Blox (§4.3, "Tiresias+") shows a
known list of sensitive models is the more robust stand-in, and that is what this policy takes:
``consolidate_models`` lists model-name prefixes (default ``vgg`` and ``alexnet``, the skewed
models of Tiresias Fig. 6). ``spec.model`` is matched case-insensitively with ``-``/``_``/spaces
removed, so ``VGG-16`` and ``vgg16`` both match ``vgg``. A job without a model is not sensitive.

Rules:

* **Sensitive job**: exactly the project's ``consolidated`` rule
  (:func:`services.placement.policies.consolidated.consolidated_fit`, after Blox
  ``_consolidated_placement``): a job that fits on one node goes to the best-fitting node or, if no
  node has room, gets no place this round (consolidation is a requirement for these models); a
  wider job takes the fewest nodes. Sharing the rule makes Blox's §4.3 comparison (Tiresias
  placement vs. consolidating everything) differ only in which jobs are consolidated.
* **Other jobs**: spread over the nodes with the *fewest* free GPUs first, filling holes and
  keeping whole nodes free for sensitive jobs (Blox: "remaining jobs are placed to minimize
  fragmentation").
* The walk is the project's shared one (:func:`services.core.placing.place_in_order`): ranking
  order, running jobs keep their GPUs, preemption from the bottom of the ranking. ``backfill``
  (default True) lets lower-ranked jobs use GPUs a blocked job cannot, as the Tiresias simulator
  does (it scans every queue and starts any job that fits).

Ties between nodes go to the node listed first in the cluster; GPUs are taken lowest id first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

from services.core.decisions import Placement, Ranking
from services.core.placing import FreeIndex, FreeMap, place_in_order
from services.core.registry import PLACEMENT
from services.core.state import ClusterState, JobState
from services.placement.policies.consolidated import consolidated_fit

_SEPARATORS = re.compile(r"[-_\s]")


def normalize_model(name: str) -> str:
    """Lower-case, without ``-``, ``_`` or whitespace: ``VGG-16`` -> ``vgg16``."""
    return _SEPARATORS.sub("", name).lower()


def best_fit_node(free: FreeMap, need: int) -> int | None:
    """The node with the fewest free GPUs that still has ``need`` free (first node on ties)."""
    if isinstance(free, FreeIndex):
        return free.best_fit(need)
    best: tuple[int, int] | None = None
    for node, gpus in free.items():
        size = len(gpus)
        if size >= need and (best is None or (size, node) < best):
            best = (size, node)
    return None if best is None else best[1]


@PLACEMENT.register("tiresias-skew")
@dataclass(frozen=True, kw_only=True, slots=True)
class TiresiasSkewPlacement:
    """Consolidate skewed (placement-sensitive) models; spread the rest to limit fragmentation."""

    name: ClassVar[str] = "tiresias-skew"
    keeps_running: ClassVar[bool] = True

    consolidate_models: Sequence[str] = ("vgg", "alexnet")
    """Model-name prefixes (normalized) whose jobs must be consolidated."""
    backfill: bool = True
    """Let lower-ranked jobs take GPUs that a blocked higher-ranked job cannot use."""

    def __post_init__(self) -> None:
        prefixes = tuple(normalize_model(m) for m in self.consolidate_models)
        if any(not p for p in prefixes):
            raise ValueError(f"consolidate_models must not contain empty names: {self.consolidate_models}")
        object.__setattr__(self, "consolidate_models", prefixes)

    def is_sensitive(self, job: JobState) -> bool:
        """Whether the job's model is in the placement-sensitive (skewed) set."""
        model = job.spec.model
        if not model:
            return False
        return _matches(model, tuple(self.consolidate_models))

    def place(
        self, ranking: Ranking, jobs: Mapping[str, JobState], cluster: ClusterState, now: float
    ) -> Placement:
        def fit(job: JobState, need: int, free: FreeMap, state: ClusterState) -> tuple[int, ...] | None:
            if self.is_sensitive(job):
                return consolidated_fit(job, need, free, state)
            return spread(free, need)

        def single_node(job: JobState, need: int, state: ClusterState) -> bool:
            # consolidated_fit's promise for sensitive jobs; spread() may split any job.
            return need <= state.largest_node_gpus and self.is_sensitive(job)

        return place_in_order(ranking, jobs, cluster, fit, backfill=self.backfill, single_node=single_node)


@lru_cache(maxsize=4096)
def _matches(model: str, prefixes: tuple[str, ...]) -> bool:
    name = normalize_model(model)
    return any(name.startswith(prefix) for prefix in prefixes)


def spread(free: FreeMap, need: int) -> tuple[int, ...] | None:
    """Take GPUs from the nodes with the fewest free GPUs first (fills holes, keeps nodes whole)."""
    if need == 1:
        node = best_fit_node(free, 1)
        return None if node is None else (min(free[node]),)
    taken: list[int] = []
    if isinstance(free, FreeIndex):
        if need > free.total:
            return None
        nodes: Iterable[int] = free.fewest_first()
    else:
        nodes = sorted(free, key=lambda n: (len(free[n]), n))
    for node in nodes:
        taken.extend(sorted(free[node])[: need - len(taken)])
        if len(taken) == need:
            return tuple(taken)
    return None
