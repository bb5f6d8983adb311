"""`simulate --plot`: the figure's title, legend and axes read back from matplotlib (Agg), and zeros
drawn at 0 on the symlog axis instead of at an invented small value."""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from roundhouse.commands import simulate
from roundhouse.sim import plot
from roundhouse.sim.case import Case, CaseResult
from roundhouse.sim.plot import build_figure, case_label, legend_labels

pytest.importorskip("matplotlib", reason="--plot needs the optional matplotlib dependency")

BASE = Case(workload="philly-synthetic", cluster="4x4", jobs_per_hour=0.5, track=(20, 60))


@pytest.fixture
def figures() -> Iterator[list[Any]]:
    """Figures a test built, closed after it (pyplot keeps every open figure alive)."""
    import matplotlib.pyplot as plt

    made: list[Any] = []
    yield made
    for fig in made:
        plt.close(fig)


def _result(jct_s: Sequence[float], responsiveness_s: Sequence[float], gpus: int = 16) -> CaseResult:
    return CaseResult(report={"cluster": {"gpus": gpus}, "jobs": len(jct_s)}, jct_s=sorted(jct_s),
                      responsiveness_s=sorted(responsiveness_s))  # fmt: skip


def _build(figures: list[Any], cases: Sequence[Case], results: Sequence[CaseResult]) -> Any:
    """The figure, typed loosely (the tests read matplotlib's artists back) and closed after the test."""
    fig: Any = build_figure(cases, results)
    figures.append(fig)
    return fig


def _legend(fig: Any) -> list[str]:
    assert len(fig.legends) == 1
    return [text.get_text() for text in fig.legends[0].get_texts()]


def test_legend_names_each_cases_policies_and_seed_once(figures: list[Any]) -> None:
    cases = [replace(BASE, scheduler=s, seed=seed) for s in ("fifo", "las") for seed in (0, 1)]
    results = [_result([3600.0 * (i + 1), 7200.0], [600.0, 1200.0]) for i in range(4)]
    fig = _build(figures, cases, results)
    legend = _legend(fig)
    assert legend == [
        "fifo / accept-all / consolidated, load 0.5/h, seed 0",
        "fifo / accept-all / consolidated, load 0.5/h, seed 1",
        "las / accept-all / consolidated, load 0.5/h, seed 0",
        "las / accept-all / consolidated, load 0.5/h, seed 1",
    ]
    assert len(set(legend)) == len(legend)
    # one colour per case, the same in both panels
    for ax in fig.axes:
        colours = [line.get_color() for line in ax.get_lines()]
        assert colours == [handle.get_color() for handle in fig.legends[0].legend_handles]


def test_title_names_the_workload_and_the_cluster(figures: list[Any]) -> None:
    fig = _build(figures, [BASE], [_result([3600.0], [300.0])])
    title = fig.get_suptitle()
    assert title.startswith("philly-synthetic on cluster 4 nodes x 4 GPUs (16 GPUs)")
    assert "jobs 20-60 measured" in title
    traced = replace(BASE, workload=None, trace="/data/philly.csv", format="philly", cluster_spec="/x/spec.csv")
    fig = _build(figures, [traced], [_result([3600.0], [300.0], gpus=2474)])
    assert fig.get_suptitle().startswith("trace philly.csv (philly) on cluster spec.csv (2474 GPUs)")


def test_axes_carry_units(figures: list[Any]) -> None:
    fig = _build(figures, [BASE], [_result([3600.0], [300.0])])
    jct, responsiveness = fig.axes
    assert jct.get_title() == "Job completion time CDF"
    assert responsiveness.get_title() == "Responsiveness CDF"
    for ax in (jct, responsiveness):
        assert "(hours)" in ax.get_xlabel()
        assert ax.get_ylabel() == "fraction of measured jobs (CDF)"
        assert ax.get_xscale() == "symlog"


def test_zeros_are_drawn_at_zero_and_counted(figures: list[Any]) -> None:
    # three of four jobs started at once: responsiveness 0 (a log axis cannot show them)
    fig = _build(figures, [BASE], [_result([60.0, 3600.0, 7200.0, 9000.0], [0.0, 0.0, 0.0, 1800.0])])
    _, responsiveness = fig.axes
    cdf, marker = responsiveness.get_lines()
    xs, ys = list(cdf.get_xdata()), list(cdf.get_ydata())
    assert xs[0] == 0.0  # at 0, not at an invented 1 s = 2.8e-4 h
    assert min(x for x in xs if x > 0) == 0.5  # the one positive value, 1800 s, untouched
    assert ys[xs.index(0.0, 1)] == 0.25  # the CDF steps through 1/4, 2/4, 3/4 at x = 0
    assert list(marker.get_xdata()) == [0.0]
    assert list(marker.get_ydata()) == [0.75]
    assert marker.get_marker() == "o"
    assert responsiveness.get_xlim()[0] == 0.0
    notes = [text.get_text() for text in responsiveness.texts]
    assert notes == ["jobs at exactly 0 h (legend order): 3/4"]
    assert "share of jobs at exactly 0 h" in _legend(fig)
    jct, _ = fig.axes
    assert len(jct.get_lines()) == 1  # no zero JCT: no marker, no note
    assert list(jct.texts) == []


def test_a_case_given_twice_is_numbered_not_repeated() -> None:
    cases = [replace(BASE, scheduler="las"), replace(BASE, scheduler="las"), replace(BASE, scheduler="fifo")]
    labels = legend_labels(cases)
    assert labels == [f"{case_label(cases[0])} (#1)", f"{case_label(cases[0])} (#2)", case_label(cases[2])]


def test_a_case_without_finished_jobs_is_still_in_the_legend(figures: list[Any]) -> None:
    fig = _build(figures, [BASE, replace(BASE, seed=1)], [_result([3600.0], [0.0]), _result([], [])])
    assert _legend(fig)[1].endswith("seed 1 (no finished jobs)")


def test_the_command_draws_the_sweeps_figure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    drawn: list[Any] = []
    real = plot.build_figure

    def keep(cases: Sequence[Case], results: Sequence[CaseResult]) -> Any:
        fig = real(cases, results)
        drawn.append(fig)
        return fig

    monkeypatch.setattr(plot, "build_figure", keep)
    parser = argparse.ArgumentParser(prog="roundhouse")
    simulate.register(parser.add_subparsers(dest="command"))
    png = tmp_path / "cdf.png"
    args = parser.parse_args(["simulate", "--jobs-per-hour", "0.5", "--cluster", "4x4", "--track", "20:60",
                              "--scheduler", "fifo,las", "--seed", "0,1", "--workers", "1", "--no-progress",
                              "--fill-between-rounds", "--plot", str(png)])  # fmt: skip
    assert args.handler(args) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (fig,) = drawn
    legend = _legend(fig)
    assert sum("seed 0" in label for label in legend) == 2
    assert sum("seed 1" in label for label in legend) == 2
    assert fig.get_suptitle().startswith("philly-synthetic on cluster 4 nodes x 4 GPUs (16 GPUs)")
    # an idle cluster filled between rounds: every job starts at once, responsiveness 0 for all 41
    notes = [t.get_text() for t in fig.axes[1].texts]
    assert notes == ["jobs at exactly 0 h (legend order): 41/41, 41/41, 41/41, 41/41"]
