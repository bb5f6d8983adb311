"""How many processes a grant gets and their torch.distributed environment on one node, and the job's
working directory from `submit` to the launch (issue 14, items 3-4; no NATS, no processes but one)."""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from pathlib import Path

import pytest

from roundhouse.cli import build_parser
from roundhouse.commands.submit import build_spec
from schemas.job import JobSpec
from schemas.leases import LeaseGrant, WorldInfo
from services.worker.launcher import (
    LaunchError,
    LeasePaths,
    RankPlan,
    free_port,
    job_environment,
    launch,
    plan_ranks,
)


def grant(gpus: tuple[int, ...], *, distributed: bool = False, world: WorldInfo | None = None,
          workdir: str | None = None, command: tuple[str, ...] = ("python", "t.py")) -> LeaseGrant:
    spec = JobSpec(name="j", command=list(command), gpus=len(gpus), distributed=distributed, workdir=workdir)
    return LeaseGrant(epoch=1, lease_id="l1", job_id="j1", node_id="n1", gpus=list(gpus), spec=spec, world=world)


def env_of(g: LeaseGrant, local: int, master_port: int | None = 40123) -> dict[str, str]:
    plans = plan_ranks(g)
    return job_environment(g, plans[local], channel=Path("/c"), checkpoint_dir=Path("/ck"), nats="n", namespace="",
                           base={"MASTER_ADDR": "agent-host", "MASTER_PORT": "1"}, local_world_size=len(plans),
                           master_port=master_port)  # fmt: skip


def test_a_plain_job_with_several_gpus_is_one_process_seeing_them_all() -> None:
    g = grant((0, 1, 2, 3, 4, 5, 6, 7))
    assert plan_ranks(g) == [RankPlan(0, 0, 1, (0, 1, 2, 3, 4, 5, 6, 7))]
    env = env_of(g, 0)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("0", "0", "1", "1")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "40123")  # a world of one may init too


def test_a_distributed_job_on_one_node_is_a_rank_per_gpu_with_a_local_rendezvous() -> None:
    g = grant((2, 5), distributed=True)
    assert plan_ranks(g) == [RankPlan(0, 0, 2, (2,)), RankPlan(1, 1, 2, (5,))]
    for local in (0, 1):
        env = env_of(g, local)
        assert env["CUDA_VISIBLE_DEVICES"] == ("2", "5")[local]
        assert env["RANK"] == env["LOCAL_RANK"] == env["ROUNDHOUSE_RANK"] == str(local)
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["NODE_RANK"]) == ("2", "2", "0")
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "40123")  # never the agent's


def test_a_multi_node_grant_keeps_the_coordinators_rendezvous() -> None:
    world = WorldInfo(num_nodes=2, node_rank=1, world_size=4, rank_offset=2, coordinator_node="n0",
                      coordinator_host="10.0.0.1", coordinator_port=29500)  # fmt: skip
    g = grant((4, 5), world=world)
    assert plan_ranks(g) == [RankPlan(2, 0, 4, (4,)), RankPlan(3, 1, 4, (5,))]
    env = env_of(g, 1, master_port=None)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("3", "1", "4", "2")
    assert (env["NODE_RANK"], env["MASTER_ADDR"], env["MASTER_PORT"]) == ("1", "10.0.0.1", "29500")


def test_a_free_port_can_be_bound_on_the_loopback() -> None:
    port = free_port()
    assert 0 < port < 65536
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def submit_args(*argv: str, trailing: tuple[str, ...] = ("python", "train.py")) -> argparse.Namespace:
    args = build_parser(["submit", *argv]).parse_args(["submit", *argv])
    args.trailing = list(trailing)
    return args


def test_submit_runs_the_job_where_it_was_submitted_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = build_spec(submit_args("--gpus", "2"))
    assert spec.workdir == str(tmp_path)
    assert not spec.distributed
    assert build_spec(submit_args("--workdir", "sub", "--distributed")).workdir == str(tmp_path / "sub")
    assert build_spec(submit_args("--distributed")).distributed
    file_spec = tmp_path / "job.yaml"
    file_spec.write_text("command: [python, t.py]\nworkdir: /data/project\n")
    assert build_spec(submit_args(str(file_spec), trailing=())).workdir == "/data/project"
    file_spec.write_text("command: [python, t.py]\n")
    assert build_spec(submit_args(str(file_spec), trailing=())).workdir == str(tmp_path)


def test_the_launch_starts_in_the_workdir_or_fails_with_a_launch_error(tmp_path: Path) -> None:
    paths = LeasePaths(lease_dir=tmp_path / "agent" / "leases" / "l1", checkpoint_dir=tmp_path / "agent" / "ck")
    missing = tmp_path / "elsewhere"
    with pytest.raises(LaunchError, match=f"workdir {missing} .*does not exist on this node"):
        asyncio.run(launch(grant((0,), workdir=str(missing)), paths, nats="n", namespace=""))
    assert not missing.exists()
    project = tmp_path / "project"
    project.mkdir()
    (project / "job.py").write_text("import os; open('cwd.txt', 'w').write(os.getcwd())\n")

    async def run() -> None:
        ranks = await launch(grant((0,), workdir=str(project), command=(sys.executable, "job.py")), paths,
                             nats="n", namespace="")  # fmt: skip
        for rank in ranks:
            assert await rank.process.wait() == 0
            rank.channel.close()

    asyncio.run(run())
    assert (project / "cwd.txt").read_text() == str(project)
    assert (paths.lease_dir / "rank-0.log").exists()  # the agent's files stay in the agent's dirs
