"""CDF plots of JCT and responsiveness (``roundhouse simulate --plot FILE.png``).

matplotlib is an optional dependency (the ``plot`` extra); without it ``--plot`` fails with a
message saying how to install it.

What the figure says, so a reader needs nothing else:

* the title names the workload (generator or trace file) and the cluster (shape or spec, total GPUs);
* every case has its own legend entry naming its policies (scheduler / admission / placement), its
  load and its seed, one colour per case in both panels; identical entries (a case given twice) are
  numbered rather than repeated;
* hours on a *symmetric log* axis: logarithmic above :data:`LINEAR_BELOW_H`, linear below it down
  to 0, so a job that waited not at all (responsiveness 0, common on an idle cluster) is drawn at
  0, where it is, and not at an invented small value; each case with such jobs also gets a marker
  at 0 whose height is their share.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from roundhouse.sim.case import Case, CaseResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LineStyle = Literal["-", "--", ":", "-."]

LINEAR_BELOW_H = 0.01
"""The symlog axis is linear from 0 to 36 s: below the shortest round (and any real JCT) yet
above 0, so zeros sit at 0 and everything from a minute up is spread logarithmically."""

PANELS: tuple[tuple[str, str, str], ...] = (
    ("jct_s", "Job completion time", "JCT = finish - submit (hours)"),
    ("responsiveness_s", "Responsiveness", "first start - submit (hours)"),
)


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed."""


def case_label(case: Case) -> str:
    """A case's policies, load and seed: ``las / accept-all / consolidated, load 8/h, seed 0``."""
    labels = case.labels()
    return (
        f"{labels['scheduler']} / {labels['admission']} / {labels['placement']}, "
        f"load {labels['load']}, seed {labels['seed']}"
    )


def legend_labels(cases: Sequence[Case]) -> list[str]:
    """One label per case, in order, none repeated: a label shared by several cases (the same case
    run twice) gets ``(#k)``."""
    plain = [case_label(case) for case in cases]
    repeated = Counter(plain)
    seen: Counter[str] = Counter()
    labels = []
    for label in plain:
        seen[label] += 1
        labels.append(f"{label} (#{seen[label]})" if repeated[label] > 1 else label)
    return labels


def _workload(case: Case) -> str:
    if case.trace is not None:
        return f"trace {Path(case.trace).name} ({case.format})"
    return str(case.workload)


def _cluster(case: Case) -> str:
    if case.cluster_spec is not None:
        return f"cluster {Path(case.cluster_spec).name}"
    nodes, _, gpus = case.cluster.partition("x")
    return f"cluster {nodes} nodes x {gpus} GPUs"


def figure_title(cases: Sequence[Case], results: Sequence[CaseResult]) -> str:
    """``philly-synthetic on cluster 32 nodes x 4 GPUs (128 GPUs)``, the measured jobs on a
    second line; several workloads or clusters (not a ``simulate`` sweep, which varies neither) are
    all named."""
    workloads = dict.fromkeys(_workload(case) for case in cases)
    clusters = dict.fromkeys(_cluster(case) for case in cases)
    gpus = dict.fromkeys(str(r.report.get("cluster", {}).get("gpus", "?")) for r in results)
    first = f"{', '.join(workloads)} on {', '.join(clusters)} ({'/'.join(gpus)} GPUs)"
    track = dict.fromkeys(case.track for case in cases)
    if len(track) == 1 and (window := next(iter(track))) is not None:
        measured = f"jobs {window[0]}-{window[1]} measured"
    else:
        counts = dict.fromkeys(str(r.report.get("jobs")) for r in results)
        measured = f"{'/'.join(counts)} finished jobs measured"
    return f"{first}\n{measured}; CDFs over measured jobs"


def _import_pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailableError(
            "--plot needs matplotlib: pip install 'roundhouse[plot]' (or pip install matplotlib)"
        ) from None
    return plt


def build_figure(cases: Sequence[Case], results: Sequence[CaseResult]) -> Figure:
    """The two-panel figure (JCT, responsiveness), one CDF line per case, legend below the panels."""
    if len(cases) != len(results):
        raise ValueError(f"{len(cases)} cases but {len(results)} results")
    plt = _import_pyplot()
    from matplotlib.lines import Line2D

    labels = legend_labels(cases)
    colours = [f"C{i % 10}" for i in range(len(cases))]
    styles: list[LineStyle] = ["-", "--", ":", "-."]
    columns = 1 if len(cases) > 6 else 2
    legend_rows = -(-(len(cases) + 1) // columns)  # + the zero marker's entry
    legend_in = 0.2 * legend_rows + 0.1
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8 + legend_in))
    any_zero = False
    for ax, (attr, title, xlabel) in zip(axes, PANELS, strict=True):
        at_zero: list[str] = []
        for index, result in enumerate(results):
            hours = sorted(v / 3600.0 for v in getattr(result, attr))
            if not hours:
                continue
            n = len(hours)
            style = {"color": colours[index], "linestyle": styles[(index // 10) % len(styles)]}
            # from (first value, 0): the CDF's rise at its first value is drawn too
            ax.step([hours[0], *hours], [0.0, *((i + 1) / n for i in range(n))], where="post", **style)
            zeros = sum(1 for h in hours if h == 0.0)
            at_zero.append(f"{zeros}/{n}")
            if zeros:
                any_zero = True
                ax.plot([0.0], [zeros / n], marker="o", markersize=7, color=colours[index], linestyle="none",
                        clip_on=False, zorder=3)  # fmt: skip
        if any(not count.startswith("0/") for count in at_zero):
            ax.text(0.98, 0.04, "jobs at exactly 0 h (legend order): " + ", ".join(at_zero), transform=ax.transAxes,
                    ha="right", va="bottom", fontsize="small", wrap=True)  # fmt: skip
        ax.set_xscale("symlog", linthresh=LINEAR_BELOW_H)
        ax.set_xlim(left=0.0)
        ax.set_ylim(0.0, 1.02)
        ax.set_xlabel(f"{xlabel}; symlog: linear below {LINEAR_BELOW_H:g} h")
        ax.set_ylabel("fraction of measured jobs (CDF)")
        ax.set_title(f"{title} CDF")
        ax.grid(True, alpha=0.3)
    handles = [
        Line2D([], [], color=colours[i], linestyle=styles[(i // 10) % len(styles)],
               label=labels[i] + ("" if results[i].jct_s else " (no finished jobs)"))
        for i in range(len(cases))
    ]  # fmt: skip
    if any_zero:
        handles.append(Line2D([], [], marker="o", color="grey", linestyle="none", label="share of jobs at exactly 0 h"))
    fig.suptitle(figure_title(cases, results))
    fig.legend(handles=handles, loc="lower center", ncol=columns, fontsize="small", frameon=False)
    fig.tight_layout(rect=(0.0, legend_in / (4.8 + legend_in), 1.0, 1.0))
    figure: Figure = fig
    return figure


def plot_cdfs(cases: Sequence[Case], results: Sequence[CaseResult], path: Path) -> None:
    """Draw :func:`build_figure` into ``path`` (PNG, or any format matplotlib knows by its suffix)."""
    fig = build_figure(cases, results)
    try:
        fig.savefig(path, dpi=120)
    finally:
        _import_pyplot().close(fig)
