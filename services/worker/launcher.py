"""Start a lease's training processes (argv, no shell) and stop them (SIGTERM, then SIGKILL).

One process per node for a single-node job (``world`` is None: rank 0 of 1, every granted GPU
visible); one process per granted GPU for a job with a :class:`~schemas.leases.WorldInfo` (global
rank = ``rank_offset`` + local index, one GPU visible each), which is what torch.distributed expects.
Each process gets its own channel file and log file and its own session, so a signal reaches the
whole process group (a DataLoader's workers included).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from schemas.leases import LeaseGrant
from services.worker.channel import Channel

__all__ = [
    "LaunchError", "RankPlan", "RankProcess", "job_environment", "launch", "plan_ranks", "stderr_tail",
]


class LaunchError(RuntimeError):
    """The processes could not be started (program not found, bad working directory)."""


@dataclass(frozen=True, slots=True)
class RankPlan:
    """One process to start: its global and local rank, world size and visible GPUs."""

    rank: int
    local_rank: int
    world_size: int
    gpus: tuple[int, ...]


def plan_ranks(grant: LeaseGrant) -> list[RankPlan]:
    """The processes this node runs for ``grant`` (see the module doc)."""
    world = grant.world
    if world is None:
        return [RankPlan(0, 0, 1, tuple(grant.gpus))]
    return [
        RankPlan(world.rank_offset + i, i, world.world_size, (gpu,)) for i, gpu in enumerate(grant.gpus)
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class LeasePaths:
    """Where a lease's files live on this node."""

    lease_dir: Path
    checkpoint_dir: Path

    def channel(self, local_rank: int) -> Path:
        return self.lease_dir / f"rank-{local_rank}.chan"

    def log(self, local_rank: int) -> Path:
        return self.lease_dir / f"rank-{local_rank}.log"


AGENT_SECRETS: Final = ("ROUNDHOUSE_CREDS",)
"""Variables of the agent's environment that never reach a job."""


def job_environment(
    grant: LeaseGrant,
    plan: RankPlan,
    *,
    channel: Path,
    checkpoint_dir: Path,
    nats: str,
    namespace: str,
    base: Mapping[str, str],
    agent_pid: int | None = None,
) -> dict[str, str]:
    """The environment of one rank: the agent's, then the spec's, then Roundhouse's (which win).

    ``ROUNDHOUSE_AGENT_PID`` (``agent_pid``) lets ``roundhouse.train`` notice on its own that the
    agent is gone, should the lease's watchdog be gone too."""
    env = dict(base)
    # The agent's own credentials are the node's identity on the bus: a job's code must not inherit
    # them (it could then speak as the node). Jobs should also run as another OS user than the
    # agent, so they cannot read the creds file itself (docs/security.md).
    for key in AGENT_SECRETS:
        env.pop(key, None)
    env.update(grant.spec.env)
    env.update({
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in plan.gpus),
        "ROUNDHOUSE_JOB_ID": grant.job_id,
        "ROUNDHOUSE_LEASE_ID": grant.lease_id,
        "ROUNDHOUSE_RANK": str(plan.rank),
        "ROUNDHOUSE_LOCAL_RANK": str(plan.local_rank),
        "ROUNDHOUSE_WORLD_SIZE": str(plan.world_size),
        "ROUNDHOUSE_CHECKPOINT_DIR": str(checkpoint_dir),
        "ROUNDHOUSE_CHANNEL": str(channel),
        "ROUNDHOUSE_NATS": nats,
        "ROUNDHOUSE_NAMESPACE": namespace,
        "ROUNDHOUSE_ATTEMPT": str(grant.attempt),
    })  # fmt: skip
    for key in ("ROUNDHOUSE_RESUME_FROM", "ROUNDHOUSE_RESUME_ITERATION", "ROUNDHOUSE_AGENT_PID"):
        env.pop(key, None)
    if agent_pid is not None:
        env["ROUNDHOUSE_AGENT_PID"] = str(agent_pid)
    if grant.resume_from is not None:
        env["ROUNDHOUSE_RESUME_FROM"] = grant.resume_from
    if grant.resume_iteration is not None:
        env["ROUNDHOUSE_RESUME_ITERATION"] = str(grant.resume_iteration)
    if grant.world is not None:
        env.update({
            "MASTER_ADDR": grant.world.coordinator_host,
            "MASTER_PORT": str(grant.world.coordinator_port),
            "RANK": str(plan.rank),
            "WORLD_SIZE": str(plan.world_size),
            "LOCAL_RANK": str(plan.local_rank),
        })  # fmt: skip
    else:
        env.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
    return env


@dataclass(eq=False)
class RankProcess:
    """One running training process of a lease."""

    plan: RankPlan
    channel: Channel
    log_path: Path
    process: asyncio.subprocess.Process

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the process's group (it leads its own session); a no-op once it has exited."""
        if self.process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)


async def launch(
    grant: LeaseGrant,
    paths: LeasePaths,
    *,
    nats: str,
    namespace: str,
    base_env: Mapping[str, str] | None = None,
    watch: Callable[[int], None] | None = None,
) -> list[RankProcess]:
    """Start every local rank of ``grant``; on any failure stop those already started and raise.

    ``watch`` is told each rank's process group as soon as it exists (the lease's watchdog)."""
    paths.lease_dir.mkdir(parents=True, exist_ok=True)
    paths.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    cwd = grant.spec.workdir
    _check_workdir(cwd)
    started: list[RankProcess] = []
    try:
        for plan in plan_ranks(grant):
            channel_path = paths.channel(plan.local_rank)
            channel = Channel.create(channel_path)
            env = job_environment(
                grant, plan, channel=channel_path, checkpoint_dir=paths.checkpoint_dir,
                nats=nats, namespace=namespace, base=os.environ if base_env is None else base_env,
                agent_pid=os.getpid(),
            )  # fmt: skip
            log_path = paths.log(plan.local_rank)
            with log_path.open("ab") as log_file:
                try:
                    process = await asyncio.create_subprocess_exec(
                        *grant.spec.command, env=env, cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
                        stdout=log_file, stderr=log_file, start_new_session=True,
                    )  # fmt: skip
                except OSError as exc:
                    channel.close()
                    raise LaunchError(f"cannot start {grant.spec.command[0]!r}: {exc.strerror or exc}") from exc
            channel.set_group(process.pid)
            if watch is not None:
                watch(process.pid)
            started.append(RankProcess(plan, channel, log_path, process))
    except BaseException:
        for rank in started:
            rank.signal(signal.SIGKILL)
            await rank.process.wait()
            rank.channel.close()
        raise
    return started


def _check_workdir(cwd: str | None) -> None:
    if cwd is not None and not os.path.isdir(cwd):
        raise LaunchError(f"workdir {cwd} does not exist on this node")


def stderr_tail(path: Path, limit: int = 2000) -> str:
    """The last ``limit`` characters of a rank's log, for ``JobFailed.message``."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return text.replace("\x00", "")[-limit:]
