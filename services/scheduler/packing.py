"""Packing in the live scheduler (issue 17; Gandiva, seed 001): how many leases each GPU holds.

Without packing a launch onto a GPU that a lease holds is dropped (``rounds.validate_plan``) and
never granted (``execution.Execution._grant``): the placement service is outside the scheduler's
trust, so its plan is checked against the book. With ``SchedulerConfig.packing`` a GPU may hold up
to ``MAX_JOBS_PER_GPU`` leases (Gandiva packs pairs: its success test compares two jobs' packed
throughput with time-slicing them); the grants then say ``shared=True`` so that the worker, which
refuses a busy GPU otherwise (``gpu_busy``), runs them side by side. Whether a pair is worth
packing (memory, utilization, measured throughput) is the placement policy's call; the scheduler
only bounds how many jobs a GPU takes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from services.core.packing import MAX_JOBS_PER_GPU
from services.scheduler.book import JobBook

__all__ = ["MAX_JOBS_PER_GPU", "GpuLoad"]


class GpuLoad:
    """Leases per local GPU of each node, looked up per node on first use, plus this round's claims."""

    def __init__(
        self, book: JobBook, *, skip: Iterable[str] = (), skip_stopped: bool = False, limit: int = MAX_JOBS_PER_GPU
    ) -> None:
        self._book = book
        self._skip = frozenset(skip)
        self._skip_stopped = skip_stopped
        self.limit = limit
        self._on: dict[str, Counter[int]] = {}

    def on(self, node_id: str) -> Counter[int]:
        """Leases holding each GPU of ``node_id`` (except skipped ones), with this round's claims."""
        found = self._on.get(node_id)
        if found is None:
            found = self._on[node_id] = Counter()
            for lease in self._book.leases_on(node_id):
                if lease.lease_id in self._skip or (self._skip_stopped and lease.stopped):
                    continue
                for node, gpus in lease.parts:
                    if node == node_id:
                        found.update(gpus)
        return found

    def full(self, node_id: str, gpus: Iterable[int]) -> bool:
        """Whether one more lease on ``gpus`` would put more than ``limit`` on any of them."""
        load = self.on(node_id)
        return any(load[g] >= self.limit for g in gpus)

    def claim(self, node_id: str, gpus: Iterable[int]) -> None:
        self.on(node_id).update(gpus)
