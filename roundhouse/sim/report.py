"""Metrics of a simulation, as a JSON-ready dict and as a table row.

Definitions (over the *measured* jobs: the ``--track`` window, else every job):

* JCT = finish - submit (Blox, Tiresias); average, median, p95, p99.
* responsiveness = first start - submit (Blox §4.2: "time elapsed between when the job was received
  by the scheduler and when the job was first scheduled").
* slowdown = 1 + wait / run (FitGpp §3), with run = the job's productive execution time and wait =
  JCT - run (queueing, preemption overheads and time suspended); p50/p95/p99 (and mean) per class.
* makespan = last finish - first submit of the measured jobs.
* utilization = GPU-seconds held by jobs (including checkpoint and restore time) / (GPUs x simulated
  time); productive utilization counts only GPU-seconds that advanced a job.
* preemptions = suspensions of measured jobs; lost work = GPU-seconds they spent checkpointing,
  restoring and relaunching (``services.core.costs``).

Percentiles interpolate linearly between order statistics (numpy's default, "type 7").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from roundhouse.text_table import Justify, render_table
from services.core.simulation.engine import Outcome
from services.core.simulation.stats import percentile


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan


def _clean(value: float) -> float | None:
    """JSON has no NaN: undefined statistics (no jobs) become null."""
    return None if math.isnan(value) else value


def summarize(out: Outcome, *, wall_s: float, config: Mapping[str, Any]) -> dict[str, Any]:
    """The report dict written by ``roundhouse simulate --json``."""
    jct = sorted(out.jct)
    resp = sorted(out.responsiveness)
    by_class: dict[str, list[float]] = {}
    for j, r, label in zip(out.jct, out.run, out.job_class, strict=True):
        wait = max(0.0, j - r)
        by_class.setdefault(label, []).append(1.0 + wait / r if r > 0 else math.inf)
    slowdown: dict[str, dict[str, float | None]] = {}
    for label in sorted(by_class):
        values = sorted(by_class[label])
        slowdown[label] = {
            "jobs": len(values),
            "mean": _clean(_mean(values)),
            "p50": _clean(percentile(values, 50)),
            "p95": _clean(percentile(values, 95)),
            "p99": _clean(percentile(values, 99)),
        }
    capacity = out.total_gpus * out.end_time
    makespan = out.last_finish - out.first_submit if jct else math.nan
    report: dict[str, Any] = {
        "jobs": len(jct),
        "unfinished": out.unfinished,
        "rejected": out.rejected,
        "avg_jct_s": _clean(_mean(jct)),
        "median_jct_s": _clean(percentile(jct, 50)),
        "p95_jct_s": _clean(percentile(jct, 95)),
        "p99_jct_s": _clean(percentile(jct, 99)),
        "avg_responsiveness_s": _clean(_mean(resp)),
        "median_responsiveness_s": _clean(percentile(resp, 50)),
        "p95_responsiveness_s": _clean(percentile(resp, 95)),
        "slowdown": slowdown,
        "makespan_s": _clean(makespan),
        "preemptions": int(sum(out.preemptions)),
        "lost_work_gpu_s": math.fsum(out.lost_gpu_s),
        "utilization": out.busy_gpu_s / capacity if capacity > 0 else None,
        "productive_utilization": out.productive_gpu_s / capacity if capacity > 0 else None,
        "cluster": {
            "gpus": out.total_gpus,
            "jobs_arrived": out.arrived,
            "jobs_completed": out.completed,
            "preemptions": out.all_preemptions,
            "lost_work_gpu_s": out.all_lost_gpu_s,
        },
        "simulated_s": out.end_time,
        "events": out.events,
        "rounds": out.rounds,
        "stalled": out.stalled,
        "config": dict(config),
        "wall_s": wall_s,
    }
    return report


TABLE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("avg JCT h", "avg_jct_s"),
    ("p50 JCT h", "median_jct_s"),
    ("p95 JCT h", "p95_jct_s"),
    ("avg resp h", "avg_responsiveness_s"),
    ("preempt", "preemptions"),
    ("util", "utilization"),
    ("jobs", "jobs"),
    ("wall s", "wall_s"),
)


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key.endswith("_s") and key != "wall_s":
        return f"{value / 3600:.2f}"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def format_table(rows: Sequence[tuple[Mapping[str, str], Mapping[str, Any]]]) -> str:
    """A plain-text table: one row per case (its labels, left-aligned, then the main metrics)."""
    if not rows:
        return ""
    label_keys = list(rows[0][0])
    header = [*label_keys, *(title for title, _ in TABLE_COLUMNS)]
    body = [
        [*(labels[k] for k in label_keys), *(_cell(key, report.get(key)) for _, key in TABLE_COLUMNS)]
        for labels, report in rows
    ]
    left: list[Justify] = ["left"] * len(label_keys)
    right: list[Justify] = ["right"] * len(TABLE_COLUMNS)
    justify = [*left, *right]
    return render_table(header, body, justify=justify)
