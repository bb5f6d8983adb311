"""`roundhouse reproduce blox-synthesizer`: the synthesizer vs the nine static combinations (Blox §5.2)."""

from __future__ import annotations

import json
import math
from itertools import islice
from pathlib import Path

import pytest

from roundhouse.cli import main
from roundhouse.reproduce.synthesizer import (
    QUICK,
    SYNTHESIZER,
    Run,
    Scale,
    bursty_spikes,
    rank_statics,
    run_one,
    workload,
)
from services.scheduler.policies.synthesizer import CANDIDATES


def test_bursts_are_short_jobs_at_twice_the_rate_for_two_hours_every_six() -> None:
    spikes = bursty_spikes(8.0)
    assert (spikes.period_s, spikes.window_s, spikes.offset_s) == (6 * 3600, 2 * 3600, 4 * 3600)
    assert spikes.rate_per_hour == 16.0
    assert spikes.duration_range_s == (600.0, 3600.0)
    base = list(islice(workload("philly", QUICK, 0), 200))
    bursty = list(islice(workload("bursty", QUICK, 0), 300))
    base_set = {(j.arrival_s, j.duration_s) for j in base}
    extra = [j for j in bursty if (j.arrival_s, j.duration_s) not in base_set]
    assert extra
    assert all(600 <= j.duration_s <= 3600 for j in extra)
    assert all(4 * 3600 <= j.arrival_s % (6 * 3600) < 6 * 3600 for j in extra)
    assert [j.index for j in bursty] == list(range(300))


def test_unknown_workload() -> None:
    with pytest.raises(ValueError, match="bursty"):
        workload("steady", QUICK, 0)


@pytest.mark.parametrize("policy", [SYNTHESIZER, "srtf+accept-1.2x"])
def test_one_run_tracks_the_window(policy: str) -> None:
    result = run_one(Run("bursty", policy, QUICK, 1))
    assert result["jobs"] == QUICK.track[1] - QUICK.track[0] + 1
    assert result["unfinished"] == 0
    assert math.isfinite(result["avg_jct_s"])
    if policy == SYNTHESIZER:
        assert result["syntheses"] > 1
        assert sum(result["time_share"].values()) == pytest.approx(1.0)
        assert set(result["time_share"]) <= {str(c) for c in CANDIDATES}


def test_quick_run_reports_paper_and_ours(tmp_path: Path) -> None:
    out = tmp_path / "synthesizer.json"
    assert main(["reproduce", "blox-synthesizer", "--quick", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["name"] == "blox-synthesizer"
    metrics = report["metrics"]
    assert set(metrics) == {
        "philly_vs_best_static_pct",
        "philly_best_static_is_fifo",
        "bursty_vs_best_static_pct",
        "bursty_best_static_is_srtf",
    }
    for kind in ("philly", "bursty"):
        gap = metrics[f"{kind}_vs_best_static_pct"]
        assert gap["paper"] is None  # Fig. 14: "closely matches", no number
        assert report["details"][f"{kind}_best_static"] in {str(c) for c in CANDIDATES}
        runs = [r for r in report["details"]["runs"] if r["workload"] == kind]
        assert len(runs) == 10
        best = min(r["avg_jct_s"] for r in runs if r["policy"] != SYNTHESIZER)
        synth = next(r for r in runs if r["policy"] == SYNTHESIZER)
        assert gap["ours"] == pytest.approx(100.0 * (synth["avg_jct_s"] - best) / best)
    # "ours" says whether the best static policy found is the paper's (its scheduling half).
    for kind, paper_best in (("philly", "fifo"), ("bursty", "srtf")):
        metric = metrics[f"{kind}_best_static_is_{paper_best}"]
        assert metric["paper"] == 1.0
        found = report["details"][f"{kind}_best_static"].split("+", 1)[0]
        assert metric["ours"] == (1.0 if found == paper_best else 0.0)


def test_a_starving_run_stops_at_the_cap_with_its_tracked_jobs_unfinished() -> None:
    # one GPU at 0.5 jobs/h (offered load ~8): SRTF never runs the long tracked job, FIFO does
    scale = Scale(nodes=1, gpus_per_node=1, jobs_per_hour=0.5, track=(0, 3))
    srtf = run_one(Run("philly", "srtf+accept-all", scale, 0))
    fifo = run_one(Run("philly", "fifo+accept-all", scale, 0))
    assert srtf["unfinished"] >= 1
    assert srtf["simulated_h"] <= scale.max_time_s / 3600
    assert fifo["unfinished"] == 0


def stat(avg_h: float, unfinished: int = 0) -> dict[str, float]:
    return {"avg_jct_s": avg_h * 3600, "unfinished": unfinished}


RANKING = [
    (
        "lowest average JCT",
        {"fifo+accept-all": stat(20), "srtf+accept-all": stat(10)},
        ("srtf+accept-all", "fifo+accept-all", []),
    ),
    (
        "a starved run is not ranked, however low the average of its finished jobs",
        {"fifo+accept-all": stat(20), "srtf+accept-all": stat(5, unfinished=2), "las+accept-all": stat(30)},
        ("fifo+accept-all", "las+accept-all", ["srtf+accept-all"]),
    ),
    (
        "a tie goes to the canonical order",
        {"las+accept-all": stat(7), "fifo+accept-1.4x": stat(7)},
        ("fifo+accept-1.4x", "las+accept-all", []),
    ),
]


@pytest.mark.parametrize(("statics", "expected"), [c[1:] for c in RANKING], ids=[c[0] for c in RANKING])
def test_rank_statics(statics: dict[str, dict[str, float]], expected: tuple[str, str, list[str]]) -> None:
    assert rank_statics(statics) == expected
