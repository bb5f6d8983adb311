"""Fit the goodput profiles of ``services.core.goodput`` from Pollux's simulator traces.

Source: petuum/adaptdl, branch ``osdi21-artifact``, ``simulator/traces/<model>/`` (Apache-2.0):
``placements.csv`` and ``scalability.csv`` (measured step and sync times per placement and local
batch size) and ``validation-<batch>.csv`` (progress, gradient square norm and variance per epoch).
This script reduces them to a few constants per model, which ``services/core/goodput.py`` keeps
inline (the traces themselves are not copied into Roundhouse):

* the throughput model of adaptdl's ``goodput.py`` (``PerfParams``): compute time
  ``alpha_c + beta_c * atomic_bsz`` fitted by least squares to ``step_time - sync_time``; network
  time ``alpha + beta * max(replicas - 2, 0)`` (intra-node ``_r``, inter-node ``_n``) and the overlap
  exponent ``gamma`` fitted to ``step_time = (compute^gamma + network^gamma)^(1/gamma)`` by a grid over
  ``gamma`` with least squares for the alphas and betas (adaptdl fits all seven jointly with SciPy;
  Roundhouse has no SciPy, and the grid gives the same shape of curve);
* the batch-size limits of adaptdl's ``simulator/applications.py`` (init and max batch size from the
  validation runs, local batch size range from the placements, ``max_local_bsz=8`` for yolov3);
* the job's total progress (in iterations at the initial batch size) after ``max_epochs`` epochs;
* the gradient noise scale ``init_batch_size * grad_var / grad_sqr`` of the initial-batch-size run at
  five evenly spaced fractions of that progress (log-linear interpolation between epochs).

Run: ``python benchmarks/fit_pollux_profiles.py PATH/TO/adaptdl/simulator/traces``; it prints the
``GoodputProfile(...)`` literals. Needs numpy only.
"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

import numpy as np

MAX_EPOCHS = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80, "yolov3": 50}
"""adaptdl ``simulator/applications.py``: ``APPLICATIONS``."""
MAX_LOCAL_BSZ = {"yolov3": 8}
KNOTS = 5


def _rows(path: Path) -> list[dict[str, float]]:
    with path.open() as handle:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(handle)]


def _placement_rows(folder: Path) -> list[tuple[int, int, float, float, float]]:
    """(nodes, replicas, local_bsz, step_time, sync_time) from both throughput files."""
    out = []
    with (folder / "placements.csv").open() as handle:
        for row in csv.DictReader(handle):
            digits = [int(c) for c in row["placement"] if c != "0"]
            out.append(
                (len(digits), sum(digits), float(row["local_bsz"]), float(row["step_time"]), float(row["sync_time"]))
            )
    for measured in _rows(folder / "scalability.csv"):
        out.append(
            (
                int(measured["num_nodes"]),
                int(measured["num_replicas"]),
                measured["local_bsz"],
                measured["step_time"],
                measured["sync_time"],
            )
        )
    return out


def fit_perf(rows: list[tuple[int, int, float, float, float]]) -> tuple[float, ...]:
    data = np.array(rows)
    nodes, replicas, bsz, step, sync = data.T
    compute = np.maximum(step - sync, 1e-6)
    single = replicas == 1
    a = np.column_stack([np.ones(single.sum()), bsz[single]])
    alpha_c, beta_c = np.linalg.lstsq(a, compute[single], rcond=None)[0]
    alpha_c, beta_c = max(alpha_c, 1e-4), max(beta_c, 1e-8)
    predicted_compute = alpha_c + beta_c * bsz
    best: tuple[float, tuple[float, ...]] | None = None
    for gamma in np.linspace(1.0, 10.0, 91):
        params: list[float] = []
        for group in (nodes > 1, (nodes == 1) & (replicas > 1)):
            implied = np.maximum(step[group] ** gamma - predicted_compute[group] ** gamma, 1e-12) ** (1 / gamma)
            a = np.column_stack([np.ones(group.sum()), np.maximum(replicas[group] - 2, 0)])
            alpha, beta = np.linalg.lstsq(a, implied, rcond=None)[0]
            params += [max(alpha, 1e-6), max(beta, 0.0)]
        alpha_n, beta_n, alpha_r, beta_r = params
        network = np.where(
            nodes > 1,
            alpha_n + beta_n * np.maximum(replicas - 2, 0),
            np.where(replicas > 1, alpha_r + beta_r * np.maximum(replicas - 2, 0), 0.0),
        )
        predicted = (predicted_compute**gamma + network**gamma) ** (1 / gamma)
        error = float(np.sqrt(np.mean((np.log(predicted) - np.log(step)) ** 2)))
        if best is None or error < best[0]:
            best = (error, (alpha_c, beta_c, alpha_n, beta_n, alpha_r, beta_r, float(gamma)))
    assert best is not None
    print(f"#   log RMSE of step time: {best[0]:.3f}", file=sys.stderr)
    return best[1]


def noise_knots(validation: list[dict[str, float]], init_bsz: int, total: float) -> list[float]:
    usable = [r for r in validation if r["grad_sqr"] > 0 and r["grad_var"] > 0]  # deepspeech2 logs zeros
    progress = np.array([r["progress"] for r in usable])
    pgns = np.array([init_bsz * r["grad_var"] / r["grad_sqr"] for r in usable])
    fractions = np.linspace(0.0, 1.0, KNOTS)
    logs = np.interp(fractions * total, progress, np.log(np.maximum(pgns, 1e-6)))
    return [float(math.exp(x)) for x in logs]


def main(traces: Path) -> None:
    for model, epochs in MAX_EPOCHS.items():
        folder = traces / model
        validations = {int(p.stem.split("-")[-1]): _rows(p) for p in folder.glob("validation-*.csv")}
        init_bsz, max_bsz = min(validations), max(validations)
        rows = _placement_rows(folder)
        min_local = int(min(r[2] for r in rows if r[1] > 0))
        max_local = MAX_LOCAL_BSZ.get(model, int(max(r[2] for r in rows)))
        total = min(v[epochs - 1]["progress"] for v in validations.values())
        perf = fit_perf(rows)
        knots = noise_knots(validations[init_bsz], init_bsz, total)
        print(f'    "{model}": GoodputProfile(')
        print("        perf=PerfParams(" + ", ".join(f"{x:.4g}" for x in perf) + "),")
        print(f"        init_batch_size={init_bsz}, max_batch_size={max_bsz}, local_bsz=({min_local}, {max_local}),")
        print(f"        total_progress={total:.6g},")
        print("        noise_scale=(" + ", ".join(f"{x:.4g}" for x in knots) + "),")
        print("    ),")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
