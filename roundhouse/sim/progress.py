"""A one-line progress bar for a simulation on a terminal stream (``Simulator(progress=...)``)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    """Jobs measured so far (of ``total``, when known) and the simulated and wall time, redrawn at
    most four times a second."""

    def __init__(self, total: int | None, stream: TextIO | None = None) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.start = time.monotonic()
        self.last = 0.0

    def update(self, done: int, sim_t: float, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < 0.25:
            return
        self.last = now
        if self.total:
            width = 30
            filled = min(width, int(width * done / self.total))
            head = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} jobs"
        else:
            head = f"{done} jobs"
        self.stream.write(f"\r{head}  sim {sim_t / 3600:.1f} h  wall {now - self.start:.1f} s ")
        self.stream.flush()

    def close(self, done: int, sim_t: float) -> None:
        self.update(done, sim_t, force=True)
        self.stream.write("\n")
        self.stream.flush()
