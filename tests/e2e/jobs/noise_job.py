"""A plain-Python training job (no torch) that estimates its gradient noise scale and reports it.

Each iteration draws a small-batch and a big-batch gradient of a synthetic problem whose true
gradient ``G`` and per-example gradient variance ``tr(S)`` are known: coordinate ``k`` of a batch
of ``b`` examples' mean gradient is ``G_k + N(0, s^2 / b)``, so ``tr(S) = d s^2`` and the exact
noise scale is ``d s^2 / |G|^2``. ``roundhouse.train.GradientNoiseScale`` estimates it from the two
squared norms, as a real job would from its local and all-reduced gradients, and ``Job.report``
sends it with the batch size to the worker agent (channel slot ``noise``; the agent publishes
``JobMetrics.grad_noise_scale``). Every report is logged to ``--log`` (``{"noise": ..., "batch":
...}``), so a test can find the reported values downstream.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from roundhouse import train

DIMENSIONS = 16
SIGMA = 2.0
GRADIENT = [0.5] * DIMENSIONS
EXACT = DIMENSIONS * SIGMA**2 / sum(g * g for g in GRADIENT)
"""16 * 4 / (16 * 0.25) = 16 examples."""


def batch_gradient_sqr(rng: random.Random, batch: int) -> float:
    spread = SIGMA / batch**0.5
    return sum((g + rng.gauss(0.0, spread)) ** 2 for g in GRADIENT)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, required=True)
    parser.add_argument("--sleep", type=float, default=0.02, help="seconds per iteration")
    parser.add_argument("--small", type=int, default=8, help="examples in the small batch (one replica's)")
    parser.add_argument("--big", type=int, default=64, help="examples in the big batch (all replicas')")
    parser.add_argument("--log", type=Path, required=True)
    args = parser.parse_args()

    job = train.attach()
    rng = random.Random(0)
    estimator = train.GradientNoiseScale(smoothing=0.99)
    with args.log.open("a", buffering=1) as log:
        for _ in job.iterate(range(args.iterations), max_iterations=args.iterations):
            small, big = batch_gradient_sqr(rng, args.small), batch_gradient_sqr(rng, args.big)
            estimator.update(small, args.small, big, args.big)
            noise = estimator.noise_scale
            job.report(batch_size=args.big, grad_noise_scale=noise)
            log.write(json.dumps({"i": job.iteration, "noise": noise, "batch": args.big, "exact": EXACT}) + "\n")
            time.sleep(args.sleep)


if __name__ == "__main__":
    main()
