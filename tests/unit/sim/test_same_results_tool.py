"""``benchmarks/simulator.py --reports/--compare``: the check that speed work leaves results unchanged."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.simulator import SAME_RESULTS, compare_reports, report_text
from roundhouse.sim.case import Case

TINY = Case(scheduler="las", cluster="4x2", jobs_per_hour=4.0, num_jobs=40, seed=7)


def test_report_text_is_deterministic_and_leaves_out_wall_time() -> None:
    first = report_text(TINY)
    assert first == report_text(TINY)
    payload = json.loads(first)
    assert "wall_s" not in payload["report"]
    assert payload["report"]["jobs"] == 40
    assert len(payload["jct"]) == 40


def test_compare_reports_names_the_cases_that_differ(tmp_path: Path) -> None:
    before, after = tmp_path / "before", tmp_path / "after"
    before.mkdir()
    after.mkdir()
    for folder in (before, after):
        (folder / "same.json").write_text("{}", encoding="utf-8")
    (before / "changed.json").write_text('{"x": 1}', encoding="utf-8")
    (after / "changed.json").write_text('{"x": 2}', encoding="utf-8")
    (after / "new.json").write_text("{}", encoding="utf-8")
    assert compare_reports(before, after) == ["changed", "new"]
    assert compare_reports(before, before) == []


def test_the_blox_case_is_checked() -> None:
    assert "a" in SAME_RESULTS
    assert any(case.debug for case in SAME_RESULTS.values())
