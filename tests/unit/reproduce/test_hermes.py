"""``roundhouse reproduce hermes --quick``: the JSON shape, the workload's bins and sane results."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from roundhouse.cli import main
from roundhouse.reproduce import Options, get
from roundhouse.reproduce.hermes import GOOD_PER_BIN, JOBS_PER_BIN, MODELS, POLICIES, bin_workload, cost_model


def test_bins_have_the_papers_mix_and_one_goal() -> None:
    model = MODELS[0]
    for bin_type, good in GOOD_PER_BIN.items():
        jobs, kinds = bin_workload(model, bin_type, 0, 0)
        assert len(jobs) == JOBS_PER_BIN
        assert sum(kind != "slow" for kind in kinds) == good
        targets = {job.loss_target for job in jobs if job.loss_target is not None}
        assert len(targets) == 1  # every good job chases the same goal: 90% of the optimal loss
        (goal,) = targets
        for job, kind in zip(jobs, kinds, strict=True):
            assert job.loss_curve is not None
            assert job.duration_s == model.duration_s
            reach = job.loss_curve.progress_at(goal)
            assert (reach <= 1.0) == (kind != "slow")
    assert bin_workload(model, 1, 0, 0) == bin_workload(model, 1, 0, 0)
    assert bin_workload(model, 1, 0, 0) != bin_workload(model, 1, 1, 0)
    costs = cost_model(model).for_model(model.name)
    assert (costs.checkpoint_s, costs.restore_s, costs.relaunch_s) == (0.24, 0.43, 0.0)


def test_quick_run(tmp_path: Path) -> None:
    out = tmp_path / "hermes.json"
    assert main(["reproduce", "hermes", "--quick", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["name"] == "hermes"
    assert report["quick"] is True
    metrics = report["metrics"]
    for model in MODELS:
        metric = metrics[f"speedup_{model.name}"]
        assert metric["paper"] == model.paper_speedup
        assert metric["unit"] == "x"
        assert metric["ours"] > 0
        detail = report["details"]["models"][model.name]
        for bin_type in GOOD_PER_BIN:
            times = detail[f"bin{bin_type}"]["time_to_goal_s"]
            assert set(times) == set(POLICIES)
            # a good job cannot reach its goal before it has done a fifth of its work alone
            assert all(t >= 0.2 * model.duration_s for t in times.values())
            assert set(detail[f"bin{bin_type}"]["first4_time_to_goal_s"]) == set(POLICIES)
    assert metrics["speedup_bin2"]["paper"] == 2.68
    assert metrics["speedup_bin1"]["paper"] is None
    runs = report["details"]["runs"]
    assert len(runs) == len(MODELS) * len(GOOD_PER_BIN) * len(POLICIES) * report["details"]["repetitions"]
    for r in runs:
        # bin type 1 averages all 4 good jobs, bin type 2 its 4 best; the first 4 to get there are never later
        assert r["time_to_goal_s"] == (r["all_good_mean_s"] if r["bin_type"] == 1 else r["top4_mean_s"])
        assert r["first4_mean_s"] <= r["top4_mean_s"] + 1e-9
    assert all(r["preemptions"] == 0 for r in runs if r["policy"] == "fifo")
    assert all(r["preemptions"] > 0 for r in runs if r["policy"] == "hermes")
    # what the quick seed honestly shows: Hermes wins clearly where few combinations are good (bin 1)
    assert metrics["speedup_bin1"]["ours"] > 1.0
    assert math.isfinite(metrics["speedup_mean"]["ours"])


def test_same_seed_same_numbers() -> None:
    runner = get("hermes").run
    first = runner(Options(quick=True, seed=3)).to_json()
    second = runner(Options(quick=True, seed=3)).to_json()
    assert first["metrics"] == second["metrics"]
    assert first["details"]["runs"] == second["details"]["runs"]
    assert first["command"] == "roundhouse reproduce hermes --quick --seed 3"


@pytest.mark.parametrize("workers", [2])
def test_workers_give_the_same_result(workers: int) -> None:
    runner = get("hermes").run
    assert runner(Options(quick=True, workers=workers)).to_json()["metrics"] == \
        runner(Options(quick=True)).to_json()["metrics"]
