"""Pollux's workloads (``pollux-workload-N.csv``: ``name,time,application,num_replicas,batch_size``)
with run times from the goodput model (``services.core.goodput``), in the two forms Pollux's
evaluation runs them (Qiao et al., OSDI '21, §5.3; adaptdl ``simulator/simulator.py``):

``pollux-goodput``
    Adaptive jobs for Pollux: each asks for 1 GPU and may use up to ``MAX_REPLICAS`` (adaptdl's
    simulator caps a job at 64 replicas, and at the model's batch-size limit); its progress is
    goodput (``TraceJob.goodput``), and its ``duration_s`` its run time alone on one GPU at the
    best batch size. The trace's ``num_replicas`` and ``batch_size`` are not used, as in Pollux.
``pollux-tuned``
    The same jobs as the baselines get them (Pollux's "+TunedJobs"): rigid, on the trace's
    ``num_replicas`` GPUs at its ``batch_size``; ``duration_s`` is the run time alone there,
    packed on the fewest ``NODE_GPUS``-GPU nodes, from the same profile (the noise scale grows with
    progress, so the fixed batch size's efficiency does too).

Both give a job the same amount of training (the profile's ``total_progress``), so their JCTs
compare. Unlike the older ``pollux`` format (``roundhouse.sim.traces``: fixed per-application
guesses), these need no constants beyond the profiles.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from services.core.goodput import GoodputProfile, profile_for
from services.core.simulation.workload import TraceJob, WorkloadError

NODE_GPUS = 4
"""GPUs per node of Pollux's simulated cluster (16 nodes x 4 GPUs)."""
MAX_REPLICAS = 64
"""adaptdl's simulator: ``max_replicas = min(..., 64, ...)``."""

_COLUMNS = ("time", "application", "num_replicas", "batch_size")


def _rows(path: Path) -> list[tuple[int, float, str, int, int]]:
    if not path.is_file():
        raise WorkloadError(f"trace file {path} does not exist")
    out: list[tuple[int, float, str, int, int]] = []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in _COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise WorkloadError(f"{path}: missing column(s) {', '.join(missing)}")
        for line, row in enumerate(reader, start=2):
            try:
                arrival = float(row["time"])
                replicas = int(row["num_replicas"])
                batch = int(row["batch_size"])
            except ValueError:
                raise WorkloadError(f"{path}:{line}: time, num_replicas and batch_size must be numbers") from None
            if not (math.isfinite(arrival) and arrival >= 0 and replicas >= 1 and batch >= 1):
                raise WorkloadError(f"{path}:{line}: need time >= 0, num_replicas >= 1, batch_size >= 1")
            out.append((line, arrival, row["application"].strip().lower(), replicas, batch))
    if not out:
        raise WorkloadError(f"{path}: no jobs")
    out.sort(key=lambda r: r[1])  # stable: equal arrivals keep file order
    return out


def _profile(path: Path, line: int, app: str) -> GoodputProfile:
    profile = profile_for(app)
    if profile is None:
        raise WorkloadError(f"{path}:{line}: no goodput profile for application {app!r}")
    return profile


def read_goodput(path: Path) -> list[TraceJob]:
    """Adaptive, elastic jobs whose progress is goodput (Pollux's own runs)."""
    jobs: list[TraceJob] = []
    for line, arrival, app, _replicas, _batch in _rows(path):
        profile = _profile(path, line, app)
        cap = min(MAX_REPLICAS, profile.max_replicas)
        jobs.append(
            TraceJob(
                index=len(jobs),
                arrival_s=arrival,
                gpus=1,
                duration_s=profile.seconds(1, 1),
                model=app,
                max_gpus=cap if cap > 1 else None,
                goodput=True,
            )
        )
    return jobs


def read_tuned(path: Path) -> list[TraceJob]:
    """Rigid jobs at the trace's replicas and batch size (the baselines' "TunedJobs")."""
    jobs: list[TraceJob] = []
    for line, arrival, app, replicas, batch in _rows(path):
        profile = _profile(path, line, app)
        nodes = -(-replicas // NODE_GPUS)
        jobs.append(
            TraceJob(
                index=len(jobs),
                arrival_s=arrival,
                gpus=replicas,
                duration_s=profile.seconds(nodes, replicas, batch),
                model=app,
            )
        )
    return jobs
