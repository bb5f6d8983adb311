"""CDF plots of JCT and responsiveness (``roundhouse simulate --plot FILE.png``).

matplotlib is an optional dependency (the ``plot`` extra); without it ``--plot`` fails with a
message saying how to install it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from roundhouse.sim.case import CaseResult


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed."""


def plot_cdfs(results: Sequence[tuple[str, CaseResult]], path: Path) -> None:
    """Two panels (JCT, responsiveness), one CDF line per labelled case, hours on a log axis."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailableError(
            "--plot needs matplotlib: pip install 'roundhouse[plot]' (or pip install matplotlib)"
        ) from None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, title, attr in ((axes[0], "JCT", "jct_s"), (axes[1], "Responsiveness", "responsiveness_s")):
        for label, result in results:
            values = [max(v, 1.0) / 3600.0 for v in getattr(result, attr)]
            if not values:
                continue
            n = len(values)
            ax.step(values, [(i + 1) / n for i in range(n)], where="post", label=label)
        ax.set_xscale("log")
        ax.set_xlabel("hours (log)")
        ax.set_ylabel("fraction of jobs")
        ax.set_title(f"{title} CDF")
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
