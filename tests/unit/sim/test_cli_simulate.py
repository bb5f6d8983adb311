"""`roundhouse simulate`: JSON keys, same seed -> byte-identical JSON, errors, sweeps, plots."""

from __future__ import annotations

import argparse
import csv
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from roundhouse.commands import simulate


def main(argv: Sequence[str]) -> int:
    """The `roundhouse` entry point with only this sub-command (other commands are not under test)."""
    parser = argparse.ArgumentParser(prog="roundhouse")
    simulate.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code

BASE = ["simulate", "--workload", "philly-synthetic", "--jobs-per-hour", "0.5", "--cluster", "4x4", "--track",
        "20:60", "--round", "300", "--admission", "accept-all", "--placement", "consolidated", "--no-progress"]


def _run(tmp_path: Path, name: str, *extra: str) -> dict[str, object]:
    out = tmp_path / name
    assert main([*BASE, "--json", str(out), *extra]) == 0
    report: dict[str, object] = json.loads(out.read_text(encoding="utf-8"))
    return report


def test_json_has_the_contract_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _run(tmp_path, "a.json", "--scheduler", "las", "--seed", "0")
    for key in ("avg_jct_s", "median_jct_s", "p95_jct_s", "avg_responsiveness_s", "preemptions", "utilization",
                "jobs", "wall_s", "slowdown"):
        assert key in report, key
    assert report["jobs"] == 41
    slowdown = report["slowdown"]
    assert isinstance(slowdown, dict)
    assert set(slowdown["BE"]) >= {"p50", "p95", "p99"}
    assert "las" in capsys.readouterr().out


def test_same_seed_same_bytes_except_wall_time(tmp_path: Path) -> None:
    first = _run(tmp_path, "1.json", "--scheduler", "las", "--seed", "4", "--gpus", "gavel")
    second = _run(tmp_path, "2.json", "--scheduler", "las", "--seed", "4", "--gpus", "gavel")
    other = _run(tmp_path, "3.json", "--scheduler", "las", "--seed", "5", "--gpus", "gavel")
    for report in (first, second, other):
        report.pop("wall_s")
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    assert first["avg_jct_s"] != other["avg_jct_s"]


def test_unknown_policy_lists_the_valid_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--scheduler", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown scheduling policy 'nope'" in err
    assert "fifo" in err
    assert "las" in err


def test_trace_needs_a_format(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["simulate", "--trace", str(tmp_path / "t.csv"), "--no-progress"]) == 2
    assert "--format" in capsys.readouterr().err


def test_sweep_prints_one_row_per_case(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep.json"
    code = main([*BASE, "--scheduler", "fifo,las", "--jobs-per-hour", "0.4,0.6", "--workers", "2",
                 "--json", str(out)])
    assert code == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(lines) == 2 + 4
    cases = json.loads(out.read_text(encoding="utf-8"))["cases"]
    assert [(c["config"]["scheduler"], c["config"]["jobs_per_hour"]) for c in cases] == [
        ("fifo", 0.4), ("fifo", 0.6), ("las", 0.4), ("las", 0.6)
    ]


def test_roundhouse_trace_end_to_end(tmp_path: Path) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text("arrival_s,gpus,duration_s,class\n0,2,100,TE\n0,4,50,BE\n10,1,10,TE\n", encoding="utf-8")
    out = tmp_path / "r.json"
    assert main(["simulate", "--trace", str(trace), "--format", "roundhouse", "--cluster", "1x4",
                 "--scheduler", "fifo", "--round", "10", "--no-progress", "--json", str(out)]) == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    # Round 0: job 0 (2 GPUs) starts; job 1 (4 GPUs) cannot and blocks job 2 (strict FIFO).
    # Job 0 ends at 100; round 100: job 1 runs 100..150; round 150: job 2 runs 150..160.
    assert report["jobs"] == 3
    assert report["avg_jct_s"] == pytest.approx((100 + 150 + 150) / 3)
    assert set(report["slowdown"]) == {"BE", "TE"}


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="--plot needs the optional matplotlib dependency")
    png = tmp_path / "cdf.png"
    assert main([*BASE, "--scheduler", "fifo", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fitgpp_arrivals_reading_is_a_flag(tmp_path: Path) -> None:
    reports = {}
    for arrivals in ("offered", "fifo"):
        out = tmp_path / f"{arrivals}.json"
        assert main(["simulate", "--workload", "fitgpp-synthetic", "--arrivals", arrivals, "--cluster", "2x8",
                     "--num-jobs", "120", "--scheduler", "fitgpp", "--placement", "preempting",
                     "--no-progress", "--json", str(out)]) == 0
        reports[arrivals] = json.loads(out.read_text(encoding="utf-8"))
    assert reports["fifo"]["config"]["arrivals"] == "fifo"
    assert reports["offered"]["config"]["arrivals"] == "offered"
    assert reports["fifo"]["avg_jct_s"] != reports["offered"]["avg_jct_s"]  # other arrival times


def test_unknown_arrivals_reading_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--workload", "fitgpp-synthetic", "--arrivals", "poisson"])
    assert "invalid choice: 'poisson'" in capsys.readouterr().err


def test_the_report_names_the_round_triggers(tmp_path: Path) -> None:
    timer_only = _run(tmp_path, "t.json", "--scheduler", "las")
    churned = _run(tmp_path, "c.json", "--scheduler", "las", "--round-on", "churn")
    srtf = _run(tmp_path, "s.json", "--scheduler", "srtf")
    assert timer_only["round_triggers"] == ["timer"]
    assert churned["round_triggers"] == ["timer", "arrival", "completion"]
    assert srtf["round_triggers"] == ["timer", "arrival", "completion"]  # srtf declares churn itself


def test_unfinished_measured_jobs_are_warned_about(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capped = _run(tmp_path, "m.json", "--scheduler", "las", "--max-time", "300000")
    assert isinstance(capped["unfinished"], int)
    assert capped["unfinished"] > 0
    err = capsys.readouterr().err
    assert f"{capped['unfinished']} measured job(s) unfinished (the run hit --max-time)" in err
    assert f"cover the {capped['jobs']} finished job(s) only" in err
    _run(tmp_path, "f.json", "--scheduler", "las")
    assert "unfinished" not in capsys.readouterr().err


def test_fill_between_rounds_is_a_flag_and_only_shortens_waits(tmp_path: Path) -> None:
    plain = _run(tmp_path, "p.json", "--scheduler", "las")
    filled = _run(tmp_path, "f.json", "--scheduler", "las", "--fill-between-rounds")
    config = filled["config"]
    assert isinstance(config, dict)
    assert config["fill_between_rounds"] is True
    assert isinstance(plain["avg_responsiveness_s"], float)
    assert isinstance(filled["avg_responsiveness_s"], float)
    assert filled["avg_responsiveness_s"] < plain["avg_responsiveness_s"]
    assert filled["round_triggers"] == plain["round_triggers"] == ["timer"]


def test_policy_options_reach_the_policy(tmp_path: Path) -> None:
    # Load-threshold admission holding jobs above 0.3 x the cluster's GPUs (instead of its default
    # 1.2 x) keeps jobs waiting that the default admits: the option must reach the policy object.
    admission = ["--scheduler", "fifo", "--admission", "load-threshold"]
    default = _run(tmp_path, "default.json", *admission)
    strict = _run(tmp_path, "strict.json", *admission, "--admission-options", '{"factor": 0.3}')
    config = strict["config"]
    assert isinstance(config, dict)
    assert config["admission_options"] == {"factor": 0.3}
    assert isinstance(default["avg_responsiveness_s"], float)
    assert isinstance(strict["avg_responsiveness_s"], float)
    assert strict["avg_responsiveness_s"] > default["avg_responsiveness_s"] + 3600


def test_bad_policy_options_are_refused_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--scheduler", "las", "--scheduler-options", '{"nope": 1}']) == 2
    err = capsys.readouterr().err
    assert "scheduling policy 'las' rejects options {'nope': 1}" in err
    assert "unexpected keyword argument 'nope'" in err
    with pytest.raises(SystemExit):
        main([*BASE, "--scheduler", "las", "--scheduler-options", "[1]"])
    assert "must be a JSON object" in capsys.readouterr().err


def test_jobs_csv_has_one_row_per_measured_job_matching_the_report(tmp_path: Path) -> None:
    rows_path = tmp_path / "jobs.csv"
    report = _run(tmp_path, "r.json", "--scheduler", "las", "--gpus", "gavel", "--jobs-csv", str(rows_path))
    with rows_path.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == report["jobs"] == 41
    assert [int(r["job"]) for r in rows] == list(range(20, 61))  # the --track window, by job index
    assert {r["scheduler"] for r in rows} == {"las"}
    jct = [float(r["jct_s"]) for r in rows]
    assert sum(jct) / len(jct) == pytest.approx(report["avg_jct_s"], rel=1e-12)
    assert sum(int(r["preemptions"]) for r in rows) <= int(report["preemptions"])  # the report counts all jobs
    for r in rows:
        arrival, start, finish = float(r["arrival_s"]), float(r["first_start_s"]), float(r["finish_s"])
        assert arrival <= start <= finish
        assert finish - arrival == pytest.approx(float(r["jct_s"]))
        assert float(r["responsiveness_s"]) == pytest.approx(start - arrival)
        assert float(r["run_s"]) <= float(r["jct_s"]) + 1e-9
        assert int(r["gpus"]) >= 1


def test_jobs_csv_of_a_sweep_labels_each_case(tmp_path: Path) -> None:
    rows_path = tmp_path / "jobs.csv"
    assert main([*BASE, "--scheduler", "fifo,las", "--workers", "1", "--jobs-csv", str(rows_path)]) == 0
    with rows_path.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    by_case = {name: [r for r in rows if r["scheduler"] == name] for name in ("fifo", "las")}
    assert [len(v) for v in by_case.values()] == [41, 41]
    # The same jobs arrive at the same times in both cases; only the policy differs.
    assert [r["arrival_s"] for r in by_case["fifo"]] == [r["arrival_s"] for r in by_case["las"]]


def test_max_gpus_makes_philly_jobs_elastic_and_only_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rigid = _run(tmp_path, "rigid.json", "--scheduler", "optimus", "--free-preemption")
    elastic = _run(tmp_path, "elastic.json", "--scheduler", "optimus", "--free-preemption", "--max-gpus", "4")
    # 0.5 jobs/h on 16 GPUs: an idle cluster, where Optimus gives each job a whole node
    assert float(elastic["avg_jct_s"]) < 0.6 * float(rigid["avg_jct_s"])  # type: ignore[arg-type]
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,gpus,duration_s\n0,1,60\n", encoding="utf-8")
    assert main(["simulate", "--trace", str(trace), "--format", "roundhouse", "--max-gpus", "4", "--no-progress"]) == 2
    assert "--max-gpus applies to philly-synthetic only" in capsys.readouterr().err
