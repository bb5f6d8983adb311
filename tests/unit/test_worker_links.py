"""What the agent registers about its GPUs' links: the setting for fake GPUs, NVML's NVLink topology."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from services.worker.config import WorkerConfig
from services.worker.links import LinkSpecError, check_link_spec, links_from_spec, nvml_link_matrix
from services.worker.service import WorkerService


def test_a_profile_name_gives_that_servers_pairs() -> None:
    m = links_from_spec("p3.8xlarge", [0, 1, 2, 3])
    assert m[0][3] == m[3][0] == 400.0
    assert m[0][1] == 200.0
    assert all(m[i][i] == 0.0 for i in range(4))


def test_a_profile_of_a_bigger_server_keeps_the_pairs_this_node_has() -> None:
    assert links_from_spec("dgx-a100", [0, 1]) == [[0.0, 2400.0], [2400.0, 0.0]]


def test_explicit_pairs_follow_the_registered_indices_and_leave_the_rest_unknown() -> None:
    m = links_from_spec("3-5=300, 5-7=100", [3, 5, 7])
    assert m == [[0.0, 300.0, 0.0], [300.0, 0.0, 100.0], [0.0, 100.0, 0.0]]


@pytest.mark.parametrize("spec", ["0-1", "0-0=10", "0-1=0", "0-1=1e9", "a-b=3", "0-1=nan", "nvlink"])
def test_malformed_settings_are_refused_with_the_expected_form(spec: str) -> None:
    with pytest.raises(LinkSpecError, match="link"):
        check_link_spec(spec)


def test_a_pair_naming_a_missing_gpu_is_refused() -> None:
    with pytest.raises(LinkSpecError, match="this node has GPUs"):
        links_from_spec("0-4=100", [0, 1, 2, 3])


def test_the_config_validates_the_setting_and_bounds_the_uplink() -> None:
    assert WorkerConfig(node_id="n", link_bandwidth_gbps=" p3.8xlarge ").link_bandwidth_gbps == "p3.8xlarge"
    with pytest.raises(ValidationError):
        WorkerConfig(node_id="n", link_bandwidth_gbps="0-1")
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1e9):
        with pytest.raises(ValidationError):
            WorkerConfig(node_id="n", network_gbps=bad)


def test_the_register_reports_the_setting_and_the_uplink(tmp_path: Path) -> None:
    cfg = WorkerConfig(node_id="node-a", fake_gpus=4, work_dir=str(tmp_path / "w"),
                       link_bandwidth_gbps="0-3=400,1-2=400", network_gbps=25.0)  # fmt: skip
    register = WorkerService(cfg)._register()
    assert register.link_bandwidth_gbps is not None
    assert register.link_bandwidth_gbps[0][3] == 400.0
    assert register.link_bandwidth_gbps[0][1] == 0.0
    assert register.network_gbps == 25.0


def test_fake_gpus_without_a_setting_report_no_links(tmp_path: Path) -> None:
    register = WorkerService(WorkerConfig(node_id="node-a", fake_gpus=2, work_dir=str(tmp_path / "w")))._register()
    assert register.link_bandwidth_gbps is None
    assert register.network_gbps is None


class _NvmlError(Exception):
    pass


def fake_nvml(links: dict[int, list[tuple[str, int]]], version: int = 2) -> Any:
    """An NVML stand-in: GPU ``i``'s active links, each ``(remote bus id or 'switch', device type)``."""

    def remote(handle: int, link: int) -> tuple[str, int]:
        if link >= len(links[handle]):
            raise _NvmlError("no such link")
        return links[handle][link]

    return SimpleNamespace(
        NVML_NVLINK_MAX_LINKS=18, NVML_FEATURE_ENABLED=1, NVML_NVLINK_DEVICE_TYPE_GPU=0,
        NVML_NVLINK_DEVICE_TYPE_SWITCH=2, NVMLError=_NvmlError,
        nvmlDeviceGetNvLinkState=lambda h, link: (remote(h, link), 1)[1],
        nvmlDeviceGetNvLinkVersion=lambda h, link: version,
        nvmlDeviceGetNvLinkRemoteDeviceType=lambda h, link: remote(h, link)[1],
        nvmlDeviceGetNvLinkRemotePciInfo=lambda h, link: SimpleNamespace(busId=remote(h, link)[0].encode()),
    )  # fmt: skip


BUS = ["00000000:1A:00.0", "00000000:1B:00.0", "00000000:3D:00.0", "00000000:3E:00.0"]


def test_nvml_direct_nvlinks_are_counted_per_peer() -> None:
    # a DGX-1V quad: 0-3 and 1-2 two links, every other pair one (V100: NVLink 2, 200 Gb/s per link)
    def peers(i: int) -> list[tuple[str, int]]:
        double = {0: 3, 3: 0, 1: 2, 2: 1}[i]
        out = [(BUS[j].lower(), 0) for j in range(4) if j != i]
        return [*out, (BUS[double], 0)]

    m = nvml_link_matrix(fake_nvml({i: peers(i) for i in range(4)}), [0, 1, 2, 3], BUS)
    assert m is not None
    assert m[0][3] == m[3][0] == m[1][2] == 400.0
    assert m[0][1] == m[2][3] == 200.0


def test_nvml_switch_links_connect_every_gpu_on_the_fabric() -> None:
    # an HGX H100: 18 NVLink-4 links per GPU, all to NVSwitches
    nv = fake_nvml({i: [("switch", 2)] * 18 for i in range(2)}, version=4)
    assert nvml_link_matrix(nv, [0, 1], BUS[:2]) == [[0.0, 3600.0], [3600.0, 0.0]]


def test_no_active_nvlink_reports_nothing() -> None:
    assert nvml_link_matrix(fake_nvml({0: [], 1: []}), [0, 1], BUS[:2]) is None
