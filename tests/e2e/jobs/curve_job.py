"""A tiny plain-Python training job (no torch) for live-cluster tests: a loss curve, checkpoints, a log.

It runs under ``roundhouse.train`` exactly as a real job does: ``Job.iterate`` checks the lease
before every iteration, checkpoints the "model" when the lease stops it, and ``Job.report`` hands
the loss to the worker agent (which publishes ``metrics.job.<id>``; the metrics service folds it
into the ``job-metrics`` bucket the scheduler reads). The loss of global iteration ``i`` is

    loss(i) = floor + (start - floor) * exp(-rate * min(i, plateau_at))

so a job's convergence speed is its ``--rate``, ``--plateau-at`` is where it has converged (the loss
stays flat from there on), and a resumed run continues the same curve.

Every finished iteration appends ``{"i": i, "t": wall time, "pid": pid}`` to ``--log`` (one JSON
object a line), and every process start and lease stop a line with ``"event"``, so a test can check
that no iteration was lost or run twice and when each process held its GPU. ``--checkpoint-s``
makes the checkpoint written on a lease stop take that long (a large model's write), which is time
the job keeps its GPU within its grace period; ``--restore-s`` makes loading a checkpoint on a
resume take that long (a large model's restore), before the run's first iteration.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from roundhouse import train


class Curve:
    """The "model": what a checkpoint holds (state_dict / load_state_dict, like a torch module)."""

    def __init__(self, job: train.Job, checkpoint_s: float, restore_s: float = 0.0) -> None:
        self.job = job
        self.checkpoint_s = checkpoint_s
        self.restore_s = restore_s
        self.restored_at: int | None = None

    def state_dict(self) -> dict[str, Any]:
        if self.job.stopping and self.checkpoint_s:
            time.sleep(self.checkpoint_s)  # a slow checkpoint write, inside the grace period
        return {"iteration": self.job.iteration}

    def load_state_dict(self, state: dict[str, Any], /) -> None:
        time.sleep(self.restore_s)  # a slow checkpoint read, before any progress
        self.restored_at = int(state["iteration"])


def loss_at(i: int, start: float, floor: float, rate: float, plateau_at: int | None) -> float:
    if plateau_at is not None:
        i = min(i, plateau_at)
    return floor + (start - floor) * math.exp(-rate * i)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, required=True)
    parser.add_argument("--sleep", type=float, default=0.05, help="seconds per iteration")
    parser.add_argument("--start", type=float, default=2.0, help="loss at iteration 0")
    parser.add_argument("--floor", type=float, default=0.1, help="loss the curve converges to")
    parser.add_argument("--rate", type=float, default=0.01, help="convergence rate per iteration")
    parser.add_argument("--plateau-at", type=int, help="iteration from which the loss stays flat (converged)")
    parser.add_argument("--checkpoint-s", type=float, default=0.0, help="extra seconds a lease-stop checkpoint takes")
    parser.add_argument("--restore-s", type=float, default=0.0, help="seconds a checkpoint restore takes")
    parser.add_argument("--log", type=Path, required=True)
    args = parser.parse_args()

    job = train.attach()
    curve = Curve(job, args.checkpoint_s, args.restore_s)
    job.restore(curve)
    pid = os.getpid()
    with args.log.open("a", buffering=1) as log:
        log.write(json.dumps({"event": "start", "t": time.time(), "pid": pid, "from": job.iteration}) + "\n")
        for _ in job.iterate(range(args.iterations), model=curve, max_iterations=args.iterations):
            i = job.iteration
            time.sleep(args.sleep)
            job.report(loss=loss_at(i, args.start, args.floor, args.rate, args.plateau_at))
            log.write(json.dumps({"i": i, "t": time.time(), "pid": pid}) + "\n")
        event = "stopped" if job.stopping else "finished"
        log.write(json.dumps({"event": event, "t": time.time(), "pid": pid, "at": job.iteration}) + "\n")
    job.close()


if __name__ == "__main__":
    main()
