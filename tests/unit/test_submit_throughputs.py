"""``roundhouse submit --throughputs``: a job's own per-GPU-type speeds reach its spec, checked."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from roundhouse.cli import build_parser
from roundhouse.commands.submit import SpecError, build_spec


def _spec_args(*argv: str) -> argparse.Namespace:
    args = build_parser(["submit", *argv]).parse_args(["submit", *argv])
    args.trailing = ["python", "train.py"]
    return args


def test_throughputs_reach_the_spec_normalised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = build_spec(_spec_args("--throughputs", "K80=0.25;v100=1", "--model", "resnet50"))
    assert spec.gpu_throughputs == {"k80": 0.25, "v100": 1.0}
    assert build_spec(_spec_args("--model", "resnet50")).gpu_throughputs is None
    (tmp_path / "job.yaml").write_text("command: [python, t.py]\ngpu_throughputs: {p100: 0.7}\n")
    args = _spec_args(str(tmp_path / "job.yaml"))
    args.trailing = []
    assert build_spec(args).gpu_throughputs == {"p100": 0.7}


def test_bad_throughputs_are_refused_with_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError, match="--throughputs: throughput of 'k80' must be a positive number"):
        build_spec(_spec_args("--throughputs", "k80=0"))
