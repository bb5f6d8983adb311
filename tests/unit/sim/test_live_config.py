"""The simulation derived from a live cluster's settings (``roundhouse.sim.live_config``, issue 18):
parsed from the very flags ``LocalCluster`` starts its services and workers with."""

from __future__ import annotations

from pathlib import Path

import pytest

from roundhouse.endpoint import Endpoint
from roundhouse.local import LocalCluster, LocalClusterConfig
from roundhouse.sim.live_config import (
    emulated_costs,
    local_cluster_settings,
    parse_service_args,
    scaled_options,
    simulation_from_live,
)
from services.core.packing import PackingModel
from services.core.registry import SCHEDULING
from services.core.simulation.packing import PackingSimulator
from services.core.state import ClusterState
from services.scheduler.config import SchedulerConfig
from services.worker.config import WorkerConfig


def settings_of(tmp_path: Path, **config: object) -> LocalCluster:
    cluster = LocalCluster(LocalClusterConfig(state_dir=tmp_path, **config))  # type: ignore[arg-type]
    cluster.endpoint = Endpoint("nats://127.0.0.1:1", "rhtest")  # its flags need one; nothing is started
    return cluster


def test_an_emulated_cluster_s_settings_become_the_simulation(tmp_path: Path) -> None:
    cluster = settings_of(
        tmp_path, scheduler="tiresias", scheduler_options={"queue_thresholds_gpu_s": [100.0, 400.0]},
        placement="consolidated", placement_options={"backfill": True}, admission="load-threshold",
        admission_options={"factor": 1.5}, round_s=300.0, emulate=True, speedup=20.0,
        extra_args={"scheduler": ["--no-fill-between-rounds", "--lease-ttl-s", "6"]},
    )  # fmt: skip
    settings = local_cluster_settings(cluster)
    assert settings.scheduler.round_s == 15.0  # the live round: 300 simulated seconds at 20x
    assert settings.worker.emulate
    live = simulation_from_live(settings, start_latency_s=[0.5, 1.0], stop_latency_s=0.1)
    assert live.time_scale == 20.0
    assert live.config.round_s == pytest.approx(300.0)
    assert live.config.fill_between_rounds is False
    assert live.lease_ttl_s == pytest.approx(120.0)
    assert live.config.start_latency_s == (10.0, 20.0)
    assert live.config.stop_latency_s == pytest.approx(2.0)
    assert live.scheduler == "tiresias"
    # The live thresholds are real GPU-seconds: 20x more simulated service.
    assert live.scheduler_options == {"queue_thresholds_gpu_s": [2000.0, 8000.0]}
    assert (live.placement, dict(live.placement_options)) == ("consolidated", {"backfill": True})
    assert (live.admission, dict(live.admission_options)) == ("load-threshold", {"factor": 1.5})
    # The emulator's costs: checkpoint per model, nothing on resume, no spread penalty.
    vgg = live.config.costs.for_model("vgg19")
    assert (vgg.checkpoint_s, vgg.restore_s, vgg.relaunch_s, vgg.spread_slowdown) == (20.0, 0.0, 0.0, 1.0)
    assert live.config.costs.for_model(None).checkpoint_s == settings.worker.emulate_checkpoint_s
    assert live.describe()["scheduler"] == "tiresias"


def test_a_live_default_changes_the_simulation(tmp_path: Path) -> None:
    # Fill rounds are the live scheduler's default, so the derived simulation has them (the
    # benchmark's old simulation did not: -39%).
    live = simulation_from_live(local_cluster_settings(settings_of(tmp_path, round_s=30.0)))
    assert live.config.fill_between_rounds is SchedulerConfig().fill_between_rounds is True
    assert live.config.round_s == 30.0
    assert live.time_scale == 1.0
    assert live.config.start_latency_s == 0.0
    assert live.scheduler_options == {}  # real time: nothing to scale


def test_defaults_of_duration_options_are_scaled_too() -> None:
    options = scaled_options(SCHEDULING, "las", {}, 10.0)
    assert options == {"starvation_s": 36_000_000.0}
    assert scaled_options(SCHEDULING, "las", {"starvation_s": None}, 10.0) == {"starvation_s": None}
    assert scaled_options(SCHEDULING, "fifo", {}, 10.0) == {}


def test_service_flags_parse_as_the_service_does() -> None:
    config = parse_service_args("scheduler", SchedulerConfig, ["service", "scheduler", "--round-s", "7"], environ={})
    assert config.round_s == 7.0
    env = {"ROUNDHOUSE_ROUND_S": "9"}
    assert parse_service_args("scheduler", SchedulerConfig, [], environ=env).round_s == 9.0
    worker = parse_service_args("worker", WorkerConfig, ["--emulate", "--speedup", "4"], environ={})
    assert (worker.emulate, worker.speedup) == (True, 4.0)
    costs = emulated_costs(worker)
    assert costs.for_model("resnet50").restore_s == 0.0


def test_a_packing_cluster_is_simulated_with_packing(tmp_path: Path) -> None:
    # `up --packing` passes the scheduler --packing; the simulation of that cluster must pack as it
    # does (a plain simulator refuses a packed plan: "GPU ... is not free").
    profiles = PackingModel().policy_profiles()
    packing = settings_of(tmp_path, scheduler="rr", placement="gandiva", placement_options={"profiles": profiles},
                          packing=True)  # fmt: skip
    assert "--packing" in packing.service_args("scheduler")
    live = simulation_from_live(local_cluster_settings(packing))
    assert live.packing
    assert live.describe()["packing"] is True
    cluster = ClusterState.uniform(1, 1)
    assert isinstance(live.simulator([], cluster), PackingSimulator)
    plain = simulation_from_live(local_cluster_settings(settings_of(tmp_path / "plain")))
    assert not plain.packing
    assert "--packing" not in settings_of(tmp_path / "plain").service_args("scheduler")
    assert not isinstance(plain.simulator([], ClusterState.uniform(1, 1)), PackingSimulator)
