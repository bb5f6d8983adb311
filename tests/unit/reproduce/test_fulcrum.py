"""`roundhouse reproduce fulcrum`: balls and bins with the fulcrum policy's own balancer."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from roundhouse.cli import main
from roundhouse.reproduce import Options, get
from roundhouse.reproduce.fulcrum import max_load_fulcrum, max_load_two_choices, max_load_uniform


def test_fresh_loads_put_one_task_on_each_worker() -> None:
    # weight maxLoad - load is 0 for a worker at the maximum, so n tasks on n idle workers never collide
    assert all(max_load_fulcrum(64, seed) == 1 for seed in range(20))


def test_blind_fulcrum_is_uniform_random_and_staleness_sits_between() -> None:
    n, seeds = 200, range(30)
    blind = sum(max_load_fulcrum(n, s, batch=n) for s in seeds)
    stale = sum(max_load_fulcrum(n, s, batch=20) for s in seeds)
    uniform = sum(max_load_uniform(n, random.Random(s)) for s in seeds)
    assert blind / uniform == pytest.approx(1.0, abs=0.15)
    assert 30 < stale < blind  # some information beats none, and a late view still collides


def test_two_choices_beats_uniform() -> None:
    seeds = range(30)
    two = sum(max_load_two_choices(500, random.Random(s)) for s in seeds)
    uniform = sum(max_load_uniform(500, random.Random(s)) for s in seeds)
    assert two < uniform


def test_batch_must_be_positive() -> None:
    with pytest.raises(ValueError, match="batch"):
        max_load_fulcrum(10, 0, batch=0)


def test_quick_run_reports_paper_and_ours(tmp_path: Path) -> None:
    out = tmp_path / "fulcrum.json"
    assert main(["reproduce", "fulcrum", "--quick", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["name"] == "fulcrum"
    metrics = report["metrics"]
    assert set(metrics) == {
        "uniform_max_load", "two_choices_max_load", "fulcrum_fresh_vs_uniform",
        "fulcrum_stale_vs_uniform", "fulcrum_blind_vs_uniform",
    }
    assert all(m["paper"] is None for m in metrics.values())  # Fig. 5 prints no number
    assert metrics["two_choices_max_load"]["ours"] < metrics["uniform_max_load"]["ours"]
    assert metrics["fulcrum_fresh_vs_uniform"]["ours"] < metrics["fulcrum_stale_vs_uniform"]["ours"] <= 1.0
    sizes = {row["n"] for row in report["details"]["table"]}
    assert sizes == {100, 1000}


def test_seed_changes_the_draws() -> None:
    reproduction = get("fulcrum")
    a = reproduction.run(Options(quick=True, seed=0)).details["table"]
    b = reproduction.run(Options(quick=True, seed=1)).details["table"]
    assert a != b
    assert reproduction.run(Options(quick=True, seed=0)).details["table"] == a
