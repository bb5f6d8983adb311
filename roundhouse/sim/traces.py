"""Readers for real traces and for Roundhouse's own CSV schema.

Formats (``roundhouse simulate --trace FILE --format NAME``):

``philly``
    ``philly-pollux.csv`` from the Pollux artifact (derived from Microsoft's Philly trace, Jeon et
    al., ATC '19): ``timestamp,duration,num_gpus,gpu_time,cluster``. Replayed with its real
    timestamps (seconds after the earliest one), GPU counts and durations; the virtual cluster id
    becomes the job's user.
``pollux``
    Files of the Pollux artifact: ``philly-pollux.csv`` (as ``philly``) or a
    ``pollux-workload-N.csv`` (``name,time,application,num_replicas,batch_size``). The latter has
    no durations (Pollux derives them from per-application profiles), so each application gets the
    isolated run time in ``POLLUX_DURATIONS_S`` (Roundhouse's approximation, see there).
``pollux-goodput``, ``pollux-tuned``
    A ``pollux-workload-N.csv`` with run times from the goodput model: adaptive elastic jobs for the
    Pollux policy, or rigid jobs at the trace's replicas and batch size for the baselines
    (``roundhouse.sim.pollux_workload``).
``tiresias``
    Tiresias' simulator trace (``job_id,num_gpu,submit_time,iterations,model_name,duration,
    interval``), with a cluster spec file (``num_switch,num_node_p_switch,num_gpu_p_node,
    num_cpu_p_node,mem_p_node``) read by ``roundhouse.sim.cluster``.
``roundhouse``
    Our documented schema (docs/simulator.md): a header row, then one job per row. Columns:
    ``arrival_s`` (required), ``gpus`` (required), ``duration_s`` or ``iterations`` with
    ``iteration_s`` (one of the two is required), and optional ``class`` (TE|BE), ``user``,
    ``model``, ``checkpoint_s``, ``max_gpus`` (an elastic job's cap), ``throughputs`` (relative speed
    per GPU type, ``k80=0.2;v100=1``: ``services.core.heterogeneity``; empty: from the model).
    Unknown columns are an error (a typo must not be ignored).

Rows are sorted by arrival (stable, so equal arrivals keep file order) and re-indexed from 0.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType

from roundhouse.sim import pollux_workload
from schemas.job import JobClass
from services.core.heterogeneity import parse_throughputs
from services.core.simulation.workload import TraceJob, WorkloadError

FORMATS: tuple[str, ...] = ("philly", "pollux", "pollux-goodput", "pollux-tuned", "roundhouse", "tiresias")

POLLUX_DURATIONS_S: Mapping[str, float] = MappingProxyType(
    {
        # Roundhouse's approximation of each Pollux application's isolated run time at the
        # requested replicas (order of magnitude of the Pollux paper's Table 1 workloads).
        "cifar10": 2.0 * 3600,
        "ncf": 0.5 * 3600,
        "yolov3": 8.0 * 3600,
        "deepspeech2": 6.0 * 3600,
        "bert": 1.0 * 3600,
        "imagenet": 24.0 * 3600,
    }
)

ROUNDHOUSE_COLUMNS = frozenset(
    {"arrival_s", "gpus", "duration_s", "iterations", "iteration_s", "class", "user", "model", "checkpoint_s",
     "max_gpus", "throughputs"}
)


def _open_rows(path: Path) -> tuple[list[str], Iterator[tuple[int, dict[str, str]]]]:
    if not path.is_file():
        raise WorkloadError(f"trace file {path} does not exist")
    handle = path.open(newline="", encoding="utf-8")
    reader = csv.DictReader(handle)
    header = [h.strip() for h in (reader.fieldnames or [])]
    if not header:
        handle.close()
        raise WorkloadError(f"{path}: empty file, expected a CSV header row")
    reader.fieldnames = header

    def rows() -> Iterator[tuple[int, dict[str, str]]]:
        with handle:
            for line, row in enumerate(reader, start=2):
                yield line, {k: (v or "").strip() for k, v in row.items() if k is not None}

    return header, rows()


def _num(path: Path, line: int, row: Mapping[str, str], column: str, kind: Callable[[str], float]) -> float:
    try:
        value = kind(row[column])
    except (KeyError, ValueError):
        raise WorkloadError(f"{path}:{line}: column {column!r} must be a number, got {row.get(column)!r}") from None
    if not math.isfinite(value):
        raise WorkloadError(f"{path}:{line}: column {column!r} must be finite")
    return value


def _require(path: Path, header: list[str], columns: set[str]) -> None:
    missing = sorted(columns - set(header))
    if missing:
        raise WorkloadError(f"{path}: missing column(s) {', '.join(missing)}; header is {','.join(header)}")


def _reindexed(jobs: list[TraceJob]) -> list[TraceJob]:
    jobs.sort(key=lambda j: j.arrival_s)
    return [
        TraceJob(
            index=i,
            arrival_s=j.arrival_s,
            gpus=j.gpus,
            duration_s=j.duration_s,
            job_class=j.job_class,
            user=j.user,
            model=j.model,
            iterations=j.iterations,
            checkpoint_s=j.checkpoint_s,
            max_gpus=j.max_gpus,
            gpu_throughputs=j.gpu_throughputs,
        )
        for i, j in enumerate(jobs)
    ]


def read_philly(path: Path) -> list[TraceJob]:
    header, rows = _open_rows(path)
    _require(path, header, {"timestamp", "duration", "num_gpus"})
    parsed: list[tuple[float, int, float, str]] = []
    for line, row in rows:
        try:
            stamp = datetime.fromisoformat(row["timestamp"]).replace(tzinfo=UTC).timestamp()
        except ValueError:
            raise WorkloadError(f"{path}:{line}: bad timestamp {row['timestamp']!r}") from None
        gpus = int(_num(path, line, row, "num_gpus", float))
        duration = _num(path, line, row, "duration", float)
        parsed.append((stamp, gpus, duration, row.get("cluster") or "default"))
    if not parsed:
        raise WorkloadError(f"{path}: no jobs")
    start = min(p[0] for p in parsed)
    jobs = [
        TraceJob(index=i, arrival_s=stamp - start, gpus=gpus, duration_s=duration, user=user)
        for i, (stamp, gpus, duration, user) in enumerate(parsed)
    ]
    return _reindexed(jobs)


def read_philly_gpu_counts(path: Path) -> list[int]:
    """Just the ``num_gpus`` column of ``philly-pollux.csv`` (for philly-synthetic GPU counts)."""
    header, rows = _open_rows(path)
    _require(path, header, {"num_gpus"})
    return [int(_num(path, line, row, "num_gpus", float)) for line, row in rows]


def read_pollux(path: Path) -> list[TraceJob]:
    header, rows = _open_rows(path)
    if "timestamp" in header:
        for _ in rows:  # close the handle
            break
        return read_philly(path)
    _require(path, header, {"time", "application", "num_replicas"})
    jobs: list[TraceJob] = []
    for line, row in rows:
        app = row["application"].lower()
        if app not in POLLUX_DURATIONS_S:
            known = ", ".join(sorted(POLLUX_DURATIONS_S))
            raise WorkloadError(f"{path}:{line}: unknown application {app!r}; known: {known}")
        jobs.append(
            TraceJob(
                index=len(jobs),
                arrival_s=_num(path, line, row, "time", float),
                gpus=int(_num(path, line, row, "num_replicas", float)),
                duration_s=POLLUX_DURATIONS_S[app],
                model=app,
            )
        )
    return _reindexed(jobs)


def read_tiresias(path: Path) -> list[TraceJob]:
    header, rows = _open_rows(path)
    _require(path, header, {"num_gpu", "submit_time", "duration"})
    jobs: list[TraceJob] = []
    for line, row in rows:
        iterations = row.get("iterations")
        jobs.append(
            TraceJob(
                index=len(jobs),
                arrival_s=_num(path, line, row, "submit_time", float),
                gpus=int(_num(path, line, row, "num_gpu", float)),
                duration_s=_num(path, line, row, "duration", float),
                model=row.get("model_name") or None,
                iterations=int(float(iterations)) if iterations else None,
            )
        )
    return _reindexed(jobs)


def read_roundhouse(path: Path) -> list[TraceJob]:
    header, rows = _open_rows(path)
    unknown = sorted(set(header) - ROUNDHOUSE_COLUMNS)
    if unknown:
        raise WorkloadError(
            f"{path}: unknown column(s) {', '.join(unknown)}; allowed: {', '.join(sorted(ROUNDHOUSE_COLUMNS))}"
        )
    _require(path, header, {"arrival_s", "gpus"})
    if "duration_s" not in header and not {"iterations", "iteration_s"} <= set(header):
        raise WorkloadError(f"{path}: needs a duration_s column, or iterations and iteration_s")
    jobs: list[TraceJob] = []
    for line, row in rows:
        iterations = int(_num(path, line, row, "iterations", float)) if row.get("iterations") else None
        if row.get("duration_s"):
            duration = _num(path, line, row, "duration_s", float)
        elif iterations is not None and row.get("iteration_s"):
            duration = iterations * _num(path, line, row, "iteration_s", float)
        else:
            raise WorkloadError(f"{path}:{line}: give duration_s, or iterations and iteration_s")
        label = (row.get("class") or "BE").upper()
        if label not in JobClass.__members__:
            raise WorkloadError(f"{path}:{line}: class must be TE or BE, got {label!r}")
        checkpoint = _num(path, line, row, "checkpoint_s", float) if row.get("checkpoint_s") else None
        max_gpus = int(_num(path, line, row, "max_gpus", float)) if row.get("max_gpus") else None
        try:
            throughputs = parse_throughputs(row["throughputs"]) if row.get("throughputs") else None
        except ValueError as exc:
            raise WorkloadError(f"{path}:{line}: {exc}") from None
        jobs.append(
            TraceJob(
                index=len(jobs),
                arrival_s=_num(path, line, row, "arrival_s", float),
                gpus=int(_num(path, line, row, "gpus", float)),
                duration_s=duration,
                job_class=JobClass(label),
                user=row.get("user") or "default",
                model=row.get("model") or None,
                iterations=iterations,
                checkpoint_s=checkpoint,
                max_gpus=max_gpus,
                gpu_throughputs=throughputs,
            )
        )
    return _reindexed(jobs)


READERS: Mapping[str, Callable[[Path], list[TraceJob]]] = MappingProxyType(
    {
        "philly": read_philly,
        "pollux": read_pollux,
        "roundhouse": read_roundhouse,
        "tiresias": read_tiresias,
        "pollux-goodput": pollux_workload.read_goodput,
        "pollux-tuned": pollux_workload.read_tuned,
    }
)


def read_trace(path: Path, fmt: str) -> list[TraceJob]:
    """Read ``path`` in format ``fmt`` (one of ``FORMATS``)."""
    try:
        reader = READERS[fmt]
    except KeyError:
        raise WorkloadError(f"unknown trace format {fmt!r}; valid: {', '.join(FORMATS)}") from None
    return reader(path)
