"""Report statistics: percentiles as numpy's default, JSON shape, table."""

from __future__ import annotations

import math
from array import array

import pytest

from roundhouse.sim.report import format_table, summarize
from services.core.simulation.engine import Outcome
from services.core.simulation.stats import percentile


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [([1.0, 2.0, 3.0, 4.0], 50, 2.5), ([1.0, 2.0, 3.0, 4.0], 95, 3.85), ([5.0], 99, 5.0), ([0.0, 10.0], 25, 2.5)],
)
def test_percentile_interpolates_linearly(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == pytest.approx(expected)


def test_percentile_of_nothing_is_nan() -> None:
    assert math.isnan(percentile([], 50))


def test_summary_keys_and_nulls() -> None:
    out = Outcome(total_gpus=4, end_time=100.0, busy_gpu_s=200.0, productive_gpu_s=180.0)
    out.jct = array("d", [10.0, 30.0])
    out.responsiveness = array("d", [0.0, 20.0])
    out.run = array("d", [10.0, 10.0])
    out.preemptions = array("q", [0, 2])
    out.lost_gpu_s = array("d", [0.0, 40.0])
    out.job_class = ["BE", "BE"]
    out.first_submit, out.last_finish = 0.0, 50.0
    report = summarize(out, wall_s=1.5, config={"scheduler": "las"})
    for key in ("avg_jct_s", "median_jct_s", "p95_jct_s", "avg_responsiveness_s", "preemptions", "utilization",
                "jobs", "wall_s", "slowdown"):
        assert key in report
    assert report["avg_jct_s"] == 20.0
    assert report["preemptions"] == 2
    assert report["lost_work_gpu_s"] == 40.0
    assert report["utilization"] == 0.5
    assert report["slowdown"]["BE"]["p99"] == pytest.approx(1 + 20 / 10 * 0.99)
    empty = summarize(Outcome(total_gpus=4), wall_s=0.0, config={})
    assert empty["avg_jct_s"] is None
    assert empty["jobs"] == 0
    table = format_table([({"scheduler": "las"}, report)])
    assert "las" in table.splitlines()[2]
