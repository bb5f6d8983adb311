"""`roundhouse reproduce`: the registry, the table and the JSON shape (with a toy reproduction)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from roundhouse.cli import main
from roundhouse.reproduce import REPRODUCTIONS, Metric, Options, ReproResult, get, relative_change_pct, reproduction
from roundhouse.reproduce.base import ReproductionError


@pytest.fixture
def toy() -> Iterator[str]:
    name = "toy-paper"

    @reproduction(name, title="a toy experiment")
    def run(options: Options) -> ReproResult:
        return ReproResult(
            name=name,
            title="a toy experiment",
            source="Toy (2026), Fig. 1",
            command=f"roundhouse reproduce {name}" + (" --quick" if options.quick else ""),
            options=options,
            metrics={
                "speedup": Metric(ours=2.0 + options.seed, paper=2.08, unit="x", description="speedup over FIFO"),
                "claim": Metric(ours=float("nan"), paper=None, unit="s", description="qualitative", note="why"),
            },
            details={"seed": options.seed},
        )

    yield name
    del REPRODUCTIONS[name]


def test_json_has_paper_and_ours_per_metric(toy: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    assert main(["reproduce", toy, "--quick", "--seed", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["name"] == toy
    assert report["quick"] is True
    assert report["seed"] == 1
    assert report["metrics"]["speedup"]["paper"] == 2.08
    assert report["metrics"]["speedup"]["ours"] == 3.0
    assert report["metrics"]["claim"] == {
        "paper": None, "ours": None, "unit": "s", "description": "qualitative", "note": "why"
    }
    printed = capsys.readouterr().out
    assert "speedup over FIFO" in printed
    assert "2.08" in printed
    assert "[quick]" in printed
    assert "note (qualitative): why" in printed


def test_unknown_name_lists_the_valid_ones(toy: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reproduce", "no-such-paper"]) == 2
    assert toy in capsys.readouterr().err
    with pytest.raises(ReproductionError, match=r"valid:.*toy-paper"):
        get("no-such-paper")


def test_list_names_every_registered_reproduction(toy: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reproduce", "--list"]) == 0
    assert "toy-paper" in capsys.readouterr().out


def test_registering_a_name_twice_is_an_error(toy: str) -> None:
    with pytest.raises(ValueError, match="twice"):
        reproduction(toy, title="again")(REPRODUCTIONS[toy].run)


def test_relative_change_is_the_papers_percent_convention() -> None:
    assert relative_change_pct(85.0, 100.0) == pytest.approx(-15.0)
    assert relative_change_pct(1.0, 0.0) != relative_change_pct(1.0, 0.0)  # NaN: no baseline


def test_command_line_names_only_the_options_that_differ_from_the_defaults() -> None:
    assert Options().command_line("hermes") == "roundhouse reproduce hermes"
    assert Options(quick=True, seed=3, workers=2).command_line("gandiva") == (
        "roundhouse reproduce gandiva --quick --seed 3 --workers 2"
    )
