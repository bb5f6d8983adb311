"""`roundhouse simulate --ray ADDRESS`: a sweep on a real, separate Ray head (started here, in its own
process group, and always killed) gives the same JSON as the local run; errors without ray, with an
unreachable address, or from a case, are clean exits in bounded time."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from roundhouse.commands import simulate
from roundhouse.sim import ray_runner
from roundhouse.sim.ray_runner import RayUnavailableError, check_reachable, host_port

HEAD_START_TIMEOUT_S = 180.0
"""A loaded 2-core machine can take a while to start a head (GCS, raylet, agents)."""

BASE = ["simulate", "--workload", "philly-synthetic", "--jobs-per-hour", "0.5", "--cluster", "4x4", "--track",
        "20:60", "--no-progress"]  # fmt: skip


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="roundhouse")
    simulate.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _without_wall_time(payload: dict[str, object]) -> list[dict[str, object]]:
    cases = payload["cases"]
    assert isinstance(cases, list)
    for case in cases:
        assert isinstance(case, dict)
        assert isinstance(case.pop("wall_s"), float)
    return cases


@pytest.fixture(scope="module")
def ray_head() -> Iterator[str]:
    """A Ray head in its own session (``ray start --head --block``): its address, then it and every
    process it started are killed by process group and its temp dir removed."""
    pytest.importorskip("ray", reason="--ray needs the optional ray dependency (pip install 'roundhouse[ray]')")
    ray_cli = Path(sys.executable).with_name("ray")
    port = _free_port()
    # Short path: Ray puts Unix sockets under it (a ~100-byte limit).
    temp_dir = tempfile.mkdtemp(prefix="rh-ray-", dir="/tmp")
    log = Path(temp_dir) / "head.log"
    with log.open("wb") as out:
        head = subprocess.Popen(
            [str(ray_cli), "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
             "--object-store-memory=100000000", "--include-dashboard=false", f"--dashboard-port={_free_port()}",
             f"--dashboard-agent-listen-port={_free_port()}", "--disable-usage-stats", f"--temp-dir={temp_dir}"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + HEAD_START_TIMEOUT_S
        cpus = 0
        while cpus < 1:  # the fact waited on: a driver connects and sees the node's CPUs
            assert head.poll() is None, f"ray start exited {head.returncode}: {log.read_text(errors='replace')}"
            left = deadline - time.monotonic()
            assert left > 0, f"no Ray head answering within {HEAD_START_TIMEOUT_S} s: {log.read_text(errors='replace')}"
            try:
                cpus = check_reachable(address, timeout_s=min(left, 60.0))
            except RayUnavailableError:
                with socket.socket() as wait:  # a refused connection returns at once: pace the retries on one
                    wait.settimeout(min(1.0, max(0.01, left)))
                    wait.connect_ex(("127.0.0.1", port))
                    time.sleep(0.2)
        yield address
    finally:
        os.killpg(head.pid, signal.SIGKILL)  # the session: GCS, raylet, agents and workers
        head.wait(timeout=60)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.timeout(600)
def test_a_sweep_on_ray_gives_the_local_json(ray_head: str, tmp_path: Path) -> None:
    sweep = [*BASE, "--scheduler", "fifo,las", "--seed", "0,1"]
    local, remote = tmp_path / "local.json", tmp_path / "ray.json"
    assert main([*sweep, "--workers", "2", "--json", str(local)]) == 0
    assert main([*sweep, "--ray", ray_head, "--json", str(remote)]) == 0
    local_cases = _without_wall_time(json.loads(local.read_text(encoding="utf-8")))
    ray_cases = _without_wall_time(json.loads(remote.read_text(encoding="utf-8")))
    assert len(ray_cases) == 4
    assert [(c["config"]["scheduler"], c["config"]["seed"]) for c in ray_cases] == [  # type: ignore[index]
        ("fifo", 0), ("fifo", 1), ("las", 0), ("las", 1)
    ]
    assert json.dumps(ray_cases, sort_keys=True) == json.dumps(local_cases, sort_keys=True)
    assert ray_cases[0]["avg_jct_s"] != ray_cases[1]["avg_jct_s"]  # the seeds did reach the cases


@pytest.mark.timeout(600)
def test_a_single_case_on_ray_gives_the_local_report(ray_head: str, tmp_path: Path) -> None:
    local, remote = tmp_path / "local.json", tmp_path / "ray.json"
    assert main([*BASE, "--scheduler", "las", "--json", str(local)]) == 0
    assert main([*BASE, "--scheduler", "las", "--ray", ray_head, "--json", str(remote)]) == 0
    reports = [json.loads(path.read_text(encoding="utf-8")) for path in (local, remote)]
    for report in reports:
        report.pop("wall_s")
    assert reports[0] == reports[1]
    assert reports[0]["jobs"] == 41


@pytest.mark.timeout(600)
def test_a_case_error_on_ray_is_the_same_clean_error(ray_head: str, capsys: pytest.CaptureFixture[str]) -> None:
    # --max-gpus with fitgpp-synthetic is refused inside run_case, i.e. on a Ray worker here
    argv = ["simulate", "--workload", "fitgpp-synthetic", "--max-gpus", "2", "--cluster", "2x8", "--num-jobs", "10",
            "--scheduler", "fifo,las", "--no-progress", "--ray", ray_head]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("roundhouse simulate: --max-gpus applies to philly-synthetic only")
    assert "Traceback" not in err


@pytest.mark.timeout(120)
def test_an_address_where_nothing_listens_is_refused_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ray", reason="--ray needs the optional ray dependency")
    address = f"127.0.0.1:{_free_port()}"  # bound then closed: refused
    assert main([*BASE, "--scheduler", "fifo,las", "--ray", address]) == 2
    err = capsys.readouterr().err
    assert f"roundhouse simulate: no Ray cluster at {address}" in err


@pytest.mark.timeout(120)
def test_an_address_that_is_not_ray_gives_up_in_the_time_given() -> None:
    pytest.importorskip("ray", reason="--ray needs the optional ray dependency")
    with socket.socket() as listener:  # accepts TCP connections and never speaks Ray's protocol
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(RayUnavailableError, match=rf"no Ray cluster answered at {address} within 3 s"):
            check_reachable(address, timeout_s=3.0)


def test_without_ray_installed_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    assert main([*BASE, "--scheduler", "fifo,las", "--ray", "127.0.0.1:6379"]) == 2
    assert "--ray needs ray: pip install 'roundhouse[ray]'" in capsys.readouterr().err
    with pytest.raises(RayUnavailableError, match="pip install"):
        ray_runner.RayExecutor("127.0.0.1:6379")


@pytest.mark.parametrize(
    ("address", "expected"),
    [("10.0.0.5:6379", ("10.0.0.5", 6379)), ("ray://head:10001", ("head", 10001)), ("auto", None)],
)
def test_address_forms(address: str, expected: tuple[str, int] | None) -> None:
    assert host_port(address) == expected


@pytest.mark.parametrize("address", ["head", "http://head:80", "head:port", ":6379"])
def test_bad_addresses_are_refused_with_the_valid_forms(address: str) -> None:
    with pytest.raises(RayUnavailableError, match=r"HOST:PORT|no port"):
        host_port(address)


@pytest.mark.timeout(600)
def test_a_worker_that_cannot_import_the_case_code_is_a_cluster_error(
    ray_head: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A module only this process can import (as Roundhouse would be, were it missing on the nodes):
    # the task's function is pickled by reference, so the worker fails to import it.
    (tmp_path / "only_here_module.py").write_text("def double(x: int) -> int:\n    return 2 * x\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    import only_here_module  # type: ignore[import-not-found]

    assert only_here_module.double(2) == 4
    with ray_runner.RayExecutor(ray_head) as executor:
        assert executor.cpus >= 1
        future = executor.submit(only_here_module.double, 21)
        with pytest.raises(RayUnavailableError, match=r"cannot import .*only_here_module.*install this Roundhouse"):
            future.result(timeout=300)
