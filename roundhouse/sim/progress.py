"""A one-line progress bar for a simulation on a terminal stream (``Simulator(progress=...)``), drawn by rich.

rich is imported when a bar is made (only ``simulate`` on a terminal makes one), not with this module.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

REDRAW_S = 0.25
"""The simulator reports every ~1,024 events; redrawing more often than this would cost simulation time."""


class ProgressBar:
    """Jobs measured so far (of ``total``, when known) and the simulated and wall time, redrawn at
    most four times a second (no refresh thread: the simulator's own calls redraw it)."""

    def __init__(self, total: int | None, stream: TextIO | None = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.total = total
        self.last = 0.0
        console = Console(file=stream or sys.stderr, highlight=False)
        self._progress = Progress(
            BarColumn(bar_width=30),
            MofNCompleteColumn(),
            TextColumn("jobs  sim {task.fields[sim_h]:.1f} h  wall"),
            TimeElapsedColumn(),
            console=console,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._task = self._progress.add_task("simulate", total=total, sim_h=0.0)
        self._progress.start()

    def update(self, done: int, sim_t: float, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < REDRAW_S:
            return
        self.last = now
        self._progress.update(self._task, completed=done, sim_h=sim_t / 3600, refresh=True)

    def close(self, done: int, sim_t: float) -> None:
        self.update(done, sim_t, force=True)
        self._progress.stop()

    def stop(self) -> None:
        """Take the bar off the terminal (and give the cursor back) without a last update: for a run
        that ended in an error; a no-op after :meth:`close`."""
        self._progress.stop()
