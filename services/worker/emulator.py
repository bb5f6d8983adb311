"""Emulated jobs: progress on a clock ``speedup`` times faster than real time; nothing is launched.

``roundhouse up --emulate --speedup X`` runs the real control plane (scheduler, placement, leases,
facts) over jobs that only pretend to train, so a trace can be replayed live in minutes. A job with
``expected_iterations`` N runs N iterations of ``expected_duration_s / N`` seconds each (or of the
worker's ``emulate_iteration_s`` when no duration is given); a job with only ``expected_duration_s``
D runs D seconds; both divided by X. A revoke stops at the next iteration boundary and then takes the
model's checkpoint cost (``services.core.costs``, the simulator's own numbers) divided by X. The
facts (``job.started/suspended/completed``) are the ones real jobs produce.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field

from schemas.leases import LeaseGrant
from services.core.costs import CostModel
from services.worker.config import WorkerConfig

__all__ = ["EmulatedRun", "Emulator", "Outcome"]


@dataclass(eq=False)
class EmulatedRun:
    """One emulated lease: where it started, how fast it goes, and whether it was told to stop."""

    grant: LeaseGrant
    start_iteration: int
    total_iterations: int | None
    """None: runs until revoked."""
    iteration_s: float
    """Real seconds per iteration (already divided by the speed-up)."""
    checkpoint_s: float
    """Real seconds a checkpoint takes (already divided by the speed-up)."""
    started: float = field(default_factory=time.monotonic)
    stop_requested: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: bool = False

    def iteration(self) -> int:
        done = self.start_iteration + int((time.monotonic() - self.started) / self.iteration_s)
        return done if self.total_iterations is None else min(done, self.total_iterations)


@dataclass(frozen=True, slots=True)
class Outcome:
    completed: bool
    iteration: int
    checkpoint_path: str | None


class Emulator:
    """Creates and runs :class:`EmulatedRun` s for the worker service."""

    def __init__(self, config: WorkerConfig, costs: CostModel | None = None) -> None:
        self.speedup = config.speedup
        self.iteration_s = config.emulate_iteration_s
        self.default_checkpoint_s = config.emulate_checkpoint_s
        self.costs = costs or CostModel()

    def begin(self, grant: LeaseGrant) -> EmulatedRun:
        spec = grant.spec
        iteration_s = self.iteration_s
        total: int | None = spec.expected_iterations
        if spec.expected_duration_s is not None:
            if total is not None:
                iteration_s = spec.expected_duration_s / total
            else:
                total = max(1, math.ceil(spec.expected_duration_s / iteration_s))
                iteration_s = spec.expected_duration_s / total
        checkpoint_s = self.costs.for_model(spec.model).checkpoint_s if spec.model else self.default_checkpoint_s
        start = grant.resume_iteration or 0
        if total is not None:
            start = min(start, total)
        return EmulatedRun(grant=grant, start_iteration=start, total_iterations=total,
                           iteration_s=iteration_s / self.speedup, checkpoint_s=checkpoint_s / self.speedup)

    async def wait(self, run: EmulatedRun) -> Outcome:
        """Until the run completes or a stop is requested (then: next boundary plus the checkpoint cost)."""
        remaining = None
        if run.total_iterations is not None:
            remaining = max(0.0, run.started + (run.total_iterations - run.start_iteration) * run.iteration_s
                            - time.monotonic())
        try:
            await asyncio.wait_for(run.stop_requested.wait(), remaining)
        except TimeoutError:
            return Outcome(completed=True, iteration=run.total_iterations or run.iteration(), checkpoint_path=None)
        if run.cancelled:
            return Outcome(completed=False, iteration=run.iteration(), checkpoint_path=None)
        elapsed = time.monotonic() - run.started
        stop_at = run.start_iteration + math.floor(elapsed / run.iteration_s) + 1
        if run.total_iterations is not None:
            stop_at = min(stop_at, run.total_iterations)
        boundary = run.started + (stop_at - run.start_iteration) * run.iteration_s
        await asyncio.sleep(max(0.0, boundary - time.monotonic()) + run.checkpoint_s)
        if run.total_iterations is not None and stop_at >= run.total_iterations:
            return Outcome(completed=True, iteration=stop_at, checkpoint_path=None)
        return Outcome(completed=False, iteration=stop_at,
                       checkpoint_path=f"emulated://{run.grant.job_id}/{stop_at}")

    async def stop(self, run: EmulatedRun) -> None:
        run.stop_requested.set()

    def cancel(self, run: EmulatedRun) -> None:
        run.cancelled = True
        run.stop_requested.set()
