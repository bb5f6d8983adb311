"""Terminal tables and the progress bar drawn by rich: the rendered text, its alignment, and that
nothing wraps or is cut whatever the width; rich stays out of modules imported at start-up."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from roundhouse.commands.reproduce import format_result
from roundhouse.reproduce import Metric, Options, ReproResult
from roundhouse.sim.progress import ProgressBar
from roundhouse.sim.report import format_table
from roundhouse.text_table import render_table


def test_render_table_aligns_columns_under_a_rule() -> None:
    text = render_table(["policy", "avg JCT h"], [["las", "1.23"], ["fifo-long", "10.50"]], justify=["left", "right"])
    assert text.splitlines() == [
        "policy      avg JCT h",
        "─────────────────────",
        "las              1.23",
        "fifo-long       10.50",
    ]


def test_render_table_never_wraps_a_wide_row() -> None:
    wide = ["x" * 150, "y" * 150]
    lines = render_table(["a", "b"], [wide], indent=2).splitlines()
    assert len(lines) == 3  # header, rule, one row: no wrapping at a default 80 columns
    assert lines[2] == "  " + "x" * 150 + "   " + "y" * 150
    assert all(line.startswith("  ") and line == line.rstrip() for line in lines)


def test_render_table_refuses_ragged_rows() -> None:
    with pytest.raises(ValueError, match="one entry per header column"):
        render_table(["a", "b"], [["1"]])


def test_sweep_table_has_labels_left_and_metrics_right() -> None:
    report = {"avg_jct_s": 7200.0, "median_jct_s": 3600.0, "p95_jct_s": None, "avg_responsiveness_s": 0.0,
              "preemptions": 3, "utilization": 0.5, "jobs": 41, "wall_s": 1.234}  # fmt: skip
    rows = [({"scheduler": "las", "seed": "0"}, report), ({"scheduler": "tiresias", "seed": "1"}, report)]
    header, rule, first, second = format_table(rows).splitlines()
    assert header.split() == ["scheduler", "seed", "avg", "JCT", "h", "p50", "JCT", "h", "p95", "JCT", "h", "avg",
                              "resp", "h", "preempt", "util", "jobs", "wall", "s"]  # fmt: skip
    assert set(rule) == {"─"}
    assert first.split() == ["las", "0", "2.00", "1.00", "-", "0.00", "3", "0.50", "41", "1.23"]
    assert second.startswith("tiresias  ")
    assert first.startswith("las       ")  # labels left-aligned
    assert len(first) == len(second) == len(header)  # metrics right-aligned to the same edge
    assert format_table([]) == ""


def test_reproduce_result_table() -> None:
    result = ReproResult(
        name="toy", title="a toy", source="Toy (2026)", command="roundhouse reproduce toy", options=Options(),
        metrics={"speedup": Metric(ours=2.5, paper=2.08, unit="x", description="speedup over FIFO"),
                 "jct": Metric(ours=12345.0, paper=None, unit="s", description="avg JCT", note="no paper value")},
        wall_s=1.5,
    )  # fmt: skip
    lines = format_result(result).splitlines()
    assert lines[0] == "== toy: a toy"
    assert lines[2].split() == ["metric", "paper", "ours", "unit"]
    assert set(lines[3].strip()) == {"─"}
    assert lines[4].split() == ["speedup", "over", "FIFO", "2.08", "2.5", "x"]
    assert lines[5].split() == ["avg", "JCT", "-", "12,345", "s"]
    assert all(line.startswith("   ") for line in lines[2:6])
    assert lines[6] == "   note (avg JCT): no paper value"
    assert lines[7] == "   (1.5 s; roundhouse reproduce toy)"


def test_progress_bar_draws_done_of_total_and_simulated_hours() -> None:
    stream = io.StringIO()
    bar = ProgressBar(40, stream)
    bar.update(10, 3600.0)
    bar.close(40, 7200.0)
    final = stream.getvalue().splitlines()[-1]
    assert "40/40 jobs" in final
    assert "sim 2.0 h" in final
    bar.stop()  # after close: nothing more, no error
    unknown = io.StringIO()
    endless = ProgressBar(None, unknown)
    endless.close(7, 1800.0)
    assert "7/? jobs  sim 0.5 h" in unknown.getvalue()


def test_rich_is_not_imported_by_the_modules_start_up_loads() -> None:
    code = ("import sys, roundhouse.cli, roundhouse.commands.simulate, roundhouse.commands.reproduce, "
            "roundhouse.sim.report, roundhouse.sim.progress, roundhouse.sim.sweep; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('rich', 'ray', 'matplotlib')))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
