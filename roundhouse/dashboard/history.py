"""Queue length and GPU utilization over time: a small ring buffer of samples, kept in memory.

One per signed-in identity (what a user's samples count are their own jobs, so one visitor's history
must not be shown to another); it lives as long as that identity's session and is lost on restart,
which is what "over time" on a live page needs. Prometheus (``/metrics``) is the durable record.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from roundhouse.dashboard.snapshot import Snapshot

__all__ = ["History", "Sample"]

DEFAULT_SAMPLES = 720
"""Kept samples: an hour at the default 5 s between samples."""


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    waiting: int
    running: int
    gpus_allocated: int
    gpus_total: int | None

    @property
    def utilization(self) -> float | None:
        if not self.gpus_total:
            return None
        return min(1.0, self.gpus_allocated / self.gpus_total)


class History:
    def __init__(self, size: int = DEFAULT_SAMPLES) -> None:
        self._samples: deque[Sample] = deque(maxlen=size)

    def add(self, snapshot: Snapshot) -> Sample:
        allocated, total = snapshot.gpu_totals
        sample = Sample(snapshot.taken_at, len(snapshot.waiting), len(snapshot.running), allocated, total)
        self._samples.append(sample)
        return sample

    def samples(self) -> list[Sample]:
        return list(self._samples)

    def __len__(self) -> int:
        return len(self._samples)
