"""Per-job results of a simulation (``roundhouse simulate --jobs-csv FILE``): one row per measured
job that finished, to compare runs job by job (e.g. against another simulator) rather than by
averages only."""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from services.core.simulation.engine import Outcome


class JobRecord(NamedTuple):
    """One measured, finished job. Times in simulated seconds from the start of the run."""

    job: int
    """The job's index in the workload (its position in arrival order, the unit of ``--track``)."""
    arrival_s: float
    gpus: int
    """GPUs it asked for."""
    job_class: str
    first_start_s: float
    """When it first started (its finish time if it never started, e.g. terminated while waiting)."""
    finish_s: float
    jct_s: float
    responsiveness_s: float
    run_s: float
    """Productive wall seconds (the execution time of slowdown)."""
    preemptions: int
    lost_gpu_s: float


COLUMNS: tuple[str, ...] = JobRecord._fields


def job_records(outcome: Outcome) -> tuple[JobRecord, ...]:
    """The records of an outcome run with ``SimConfig.record_jobs``, by job index."""
    rows = [
        JobRecord(
            job=outcome.job_index[i],
            arrival_s=outcome.submit[i],
            gpus=outcome.gpus[i],
            job_class=outcome.job_class[i],
            first_start_s=outcome.first_start[i],
            finish_s=outcome.submit[i] + outcome.jct[i],
            jct_s=outcome.jct[i],
            responsiveness_s=outcome.responsiveness[i],
            run_s=outcome.run[i],
            preemptions=outcome.preemptions[i],
            lost_gpu_s=outcome.lost_gpu_s[i],
        )
        for i in range(len(outcome.job_index))
    ]
    rows.sort(key=lambda record: record.job)
    return tuple(rows)


def write_jobs_csv(path: Path, cases: Sequence[tuple[Mapping[str, str], Sequence[JobRecord]]]) -> None:
    """One CSV for every case: the case's labels (scheduler, admission, ...) then the job's columns."""
    label_names: list[str] = []
    for labels, _ in cases:
        label_names.extend(name for name in labels if name not in label_names)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow([*label_names, *COLUMNS])
        for labels, records in cases:
            head = [labels.get(name, "") for name in label_names]
            for record in records:
                writer.writerow([*head, *(_cell(value) for value in record)])


def _cell(value: object) -> object:
    """Floats as repr (shortest round-trip form), so a reader gets back the simulator's exact value."""
    return repr(value) if isinstance(value, float) else value
