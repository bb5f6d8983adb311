"""``roundhouse reproduce blox-gavel``: Gavel's heterogeneity-aware LAS beats its agnostic twin (quick run)."""

from __future__ import annotations

import json
from functools import cache

from roundhouse.reproduce import Options, ReproResult, get
from roundhouse.reproduce.blox_gavel import Case, simulate


@cache
def _quick() -> ReproResult:
    return get("blox-gavel").run(Options(quick=True, seed=0, workers=1))


def test_result_shape() -> None:
    data = json.loads(json.dumps(_quick().to_json()))
    assert data["name"] == "blox-gavel"
    assert data["command"] == "roundhouse reproduce blox-gavel --quick"
    assert data["metrics"]["avg_jct_speedup_vs_agnostic"]["paper"] == 3.5
    assert all(m["ours"] is not None for m in data["metrics"].values())
    assert set(data["details"]["avg_jct_h"]) == {"gavel", "gavel-agnostic", "las"}


def test_heterogeneity_aware_beats_agnostic_on_average_jct() -> None:
    # The paper's direction: knowing each model's speed on each type lowers the average JCT.
    assert _quick().metrics["avg_jct_speedup_vs_agnostic"].ours > 1.1
    assert _quick().metrics["avg_jct_speedup_vs_las"].ours > 1.1


def test_every_tracked_job_finishes_and_runs_are_deterministic() -> None:
    case = Case(policy="gavel", jobs_per_hour=0.8, track=(10, 29), seed=3)
    first, second = simulate(case), simulate(case)
    assert first["jobs"] == 20
    assert {k: v for k, v in first.items() if k != "wall_s"} == {k: v for k, v in second.items() if k != "wall_s"}
