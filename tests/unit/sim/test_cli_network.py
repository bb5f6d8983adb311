"""`roundhouse simulate --links PROFILE [--uplink-gbps X] --network-model`: the network model from the CLI."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from roundhouse.commands import simulate
from roundhouse.sim.case import Case, build_cluster


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="roundhouse")
    simulate.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


BASE = ["simulate", "--workload", "philly-synthetic", "--gpus", "gavel", "--jobs-per-hour", "0.5", "--cluster",
        "4x4", "--track", "20:79", "--placement", "first-free", "--free-preemption", "--no-progress"]  # fmt: skip


def _avg_jct(tmp_path: Path, name: str, *extra: str) -> float:
    out = tmp_path / name
    assert main([*BASE, "--json", str(out), *extra]) == 0
    return float(json.loads(out.read_text(encoding="utf-8"))["avg_jct_s"])


def test_links_give_every_node_the_profile_and_the_uplink_override() -> None:
    cluster = build_cluster(Case(cluster="2x4", links="p3.8xlarge", uplink_gbps=40.0))
    node = cluster.nodes["node-1"]
    assert node.link_bandwidth_gbps[(0, 3)] == 400.0
    assert node.network_gbps == 40.0
    assert build_cluster(Case(cluster="2x4")).nodes["node-1"].link_bandwidth_gbps == {}


def test_the_network_model_slows_spread_jobs_more_on_a_slower_uplink(tmp_path: Path) -> None:
    # first-free spreads multi-GPU jobs over nodes; the free cost model has no fixed spread penalty
    plain = _avg_jct(tmp_path, "plain.json")
    fast = _avg_jct(tmp_path, "fast.json", "--links", "p3.8xlarge", "--uplink-gbps", "400", "--network-model")
    slow = _avg_jct(tmp_path, "slow.json", "--links", "p3.8xlarge", "--network-model")
    assert plain <= fast < slow
    # links alone change nothing: the model is off
    assert _avg_jct(tmp_path, "links.json", "--links", "p3.8xlarge") == plain


def test_an_unknown_profile_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([*BASE, "--links", "no-such-server"])
    assert "--links" in capsys.readouterr().err
