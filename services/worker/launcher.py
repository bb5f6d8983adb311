"""Start a lease's training processes (argv, no shell) and stop them (SIGTERM, then SIGKILL).

How many processes a grant gets:

* ``spec.distributed`` false and one node (``world`` is None): ONE process, rank 0 of 1, seeing every
  granted GPU (``CUDA_VISIBLE_DEVICES``): a plain script with ``--gpus 8`` is one process with 8 GPUs,
  not 8 copies of itself.
* ``spec.distributed`` true on one node: one process per granted GPU (rank = local rank = its index,
  one GPU visible each), rendezvous on ``MASTER_ADDR=127.0.0.1`` and a ``MASTER_PORT`` free on this
  node, picked at launch.
* A grant with a :class:`~schemas.leases.WorldInfo` (the job spans several nodes): one process per
  granted GPU, global rank = ``rank_offset`` + local index, rendezvous at the coordinator node's host
  and port (the scheduler's).

Every process gets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT`` (what ``torch.distributed``'s ``env://`` init and ``torchrun``
scripts expect), so even a world of one may call ``init_process_group``. Each process gets its own
channel file and log file and its own session, so a signal reaches the whole process group (a
DataLoader's workers included).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from schemas.leases import LeaseGrant
from services.worker.channel import Channel
from services.worker.records import write_job_marker

__all__ = [
    "LaunchError", "RankPlan", "RankProcess", "free_port", "job_environment", "launch", "plan_ranks",
    "stderr_tail",
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
        if grant.spec.distributed:
            return [RankPlan(i, i, len(grant.gpus), (gpu,)) for i, gpu in enumerate(grant.gpus)]
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
    local_world_size: int = 1,
    master_port: int | None = None,
) -> dict[str, str]:
    """The environment of one rank: the agent's, then the spec's, then Roundhouse's (which win).

    ``ROUNDHOUSE_AGENT_PID`` (``agent_pid``) lets ``roundhouse.train`` notice on its own that the
    agent is gone, should the lease's watchdog be gone too. ``local_world_size`` is the number of
    processes this node runs for the grant; ``master_port`` the rendezvous port of a grant on one
    node (``world`` None: ``MASTER_ADDR`` is then 127.0.0.1); without it such a grant gets no
    ``MASTER_*``."""
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
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # never the agent's or another job's rendezvous
    env.update({
        "RANK": str(plan.rank),
        "WORLD_SIZE": str(plan.world_size),
        "LOCAL_RANK": str(plan.local_rank),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "NODE_RANK": str(grant.world.node_rank if grant.world is not None else 0),
    })  # fmt: skip
    if grant.world is not None:
        env["MASTER_ADDR"] = grant.world.coordinator_host
        env["MASTER_PORT"] = str(grant.world.coordinator_port)
    elif master_port is not None:
        env["MASTER_ADDR"] = LOCAL_MASTER_ADDR
        env["MASTER_PORT"] = str(master_port)
    return env


LOCAL_MASTER_ADDR: Final = "127.0.0.1"
"""Rendezvous address of a job on one node: its ranks all run here."""


def free_port(host: str = LOCAL_MASTER_ADDR) -> int:
    """A TCP port free on ``host`` now (the kernel's pick), for a one-node job's ``MASTER_PORT``.

    Rank 0's store binds it a moment later; another process could take it in between (rare: the
    kernel hands out ephemeral ports in turn), and the job then fails at ``init_process_group``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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
    write_job_marker(paths.lease_dir, grant.job_id)  # whose logs these are, for `roundhouse logs`
    # The workdir comes off the bus (issue 13: untrusted): it is only ever the cwd of the job's own
    # processes, which run the user's code as the agent's user anyway, so it gives them nothing they
    # could not do themselves. It is never joined to, or used to find, the agent's own files (lease
    # dir, channels, logs, checkpoint root, records): those paths come from the agent's config only.
    cwd = grant.spec.workdir
    _check_workdir(cwd)
    plans = plan_ranks(grant)
    master_port = free_port() if grant.world is None else None
    started: list[RankProcess] = []
    try:
        for plan in plans:
            channel_path = paths.channel(plan.local_rank)
            channel = Channel.create(channel_path)
            env = job_environment(
                grant, plan, channel=channel_path, checkpoint_dir=paths.checkpoint_dir,
                nats=nats, namespace=namespace, base=os.environ if base_env is None else base_env,
                agent_pid=os.getpid(), local_world_size=len(plans), master_port=master_port,
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
                    where = f" in {cwd}" if cwd is not None else ""
                    raise LaunchError(
                        f"cannot start {grant.spec.command[0]!r}{where}: {exc.strerror or exc}"
                    ) from exc
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
    """Refuse to start in another directory than the job's: a missing one is a launch error."""
    if cwd is None:
        return
    if not os.path.isdir(cwd):
        raise LaunchError(
            f"workdir {cwd} (the job's working directory: by default where it was submitted from) "
            "does not exist on this node; use a shared file system or submit with --workdir"
        )
    if not os.access(cwd, os.X_OK):
        raise LaunchError(f"workdir {cwd} is not accessible to the agent's user on this node")


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
