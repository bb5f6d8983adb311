"""The mmap channel between agent and training process, and the two-phase stop over it (no NATS)."""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from roundhouse.train import Job, JobEnv
from schemas.job import JobSpec
from schemas.leases import LeaseGrant
from services.worker import two_phase
from services.worker.channel import CHANNEL_SIZE, Channel, ChannelError, ClientStatus, LeaseSignal
from services.worker.leases import Lease


def test_a_new_channel_says_run_with_nothing_done(tmp_path: Path) -> None:
    agent = Channel.create(tmp_path / "c.chan")
    client = Channel.open(tmp_path / "c.chan")
    assert client.signal is LeaseSignal.RUN
    assert (client.iteration, client.paused_at, client.checkpoint_iteration) == (0, None, None)
    assert client.status is ClientStatus.RUNNING
    assert client.loss is None
    assert client.iteration_time_s is None
    assert client.stop_at is None
    assert (tmp_path / "c.chan").stat().st_size == CHANNEL_SIZE
    agent.close()
    client.close()
    client.close()  # idempotent


def test_writes_on_one_mapping_are_seen_on_the_other(tmp_path: Path) -> None:
    agent = Channel.create(tmp_path / "c.chan")
    client = Channel.open(tmp_path / "c.chan")
    client.set_iteration(41)
    client.report(loss=0.25, iteration_time_s=0.003)
    client.set_checkpoint_iteration(40)
    assert (agent.iteration, agent.loss, agent.iteration_time_s, agent.checkpoint_iteration) == (41, 0.25, 0.003, 40)
    assert agent.seq == 1
    agent.request_stop()
    assert client.raw_state() == LeaseSignal.STOP_REQUESTED
    client.pause(41)
    assert agent.paused_at == 41
    agent.set_stop_at(42)
    assert (client.signal, client.stop_at) == (LeaseSignal.STOP_AT, 42)
    agent.request_stop()  # a late phase-one request must not undo phase two
    assert client.signal is LeaseSignal.STOP_AT


def test_create_resets_a_reused_file(tmp_path: Path) -> None:
    first = Channel.create(tmp_path / "c.chan")
    first.set_iteration(9)
    first.set_stop_at(3)
    first.close()
    again = Channel.create(tmp_path / "c.chan")
    assert (again.iteration, again.signal) == (0, LeaseSignal.RUN)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(b"\x00" * 16, "has 16 bytes", id="too-small"),
        pytest.param(struct.pack("<II", 0xDEAD, 1) + b"\x00" * (CHANNEL_SIZE - 8), "magic 0xdead", id="bad-magic"),
        pytest.param(struct.pack("<II", 0x48434852, 9) + b"\x00" * (CHANNEL_SIZE - 8), "version 9", id="new-version"),
    ],
)
def test_open_refuses_what_is_not_a_channel(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.chan"
    path.write_bytes(content)
    with pytest.raises(ChannelError, match=message):
        Channel.open(path)


def test_open_names_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ChannelError, match="cannot open the lease channel"):
        Channel.open(tmp_path / "missing.chan")


def _client(path: Path, rank: int, world: int, stopped_at: dict[int, int], step_s: float) -> threading.Thread:
    """A rank's training loop in a thread: one 'iteration' is a short sleep."""

    def loop() -> None:
        job = Job(JobEnv(rank=rank, world_size=world, channel=path, checkpoint_dir=path.parent))
        while not job.should_stop():
            time.sleep(step_s)
            job.iteration_done()
        stopped_at[rank] = job.iteration
        job.close()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def _lease(channels: list[Channel]) -> Lease:
    grant = LeaseGrant(epoch=1, lease_id="l1", job_id="j1", node_id="n1", gpus=list(range(len(channels))),
                       spec=JobSpec(name="j", command=["x"]))  # fmt: skip
    lease = Lease(grant)
    # Ranks need only a channel and a returncode for the protocol.
    lease.ranks = [cast(Any, SimpleNamespace(channel=c, returncode=None)) for c in channels]
    return lease


async def test_two_phase_stop_makes_every_rank_stop_after_the_same_iteration(tmp_path: Path) -> None:
    paths = [tmp_path / f"rank-{r}.chan" for r in range(3)]
    channels = [Channel.create(p) for p in paths]
    stopped_at: dict[int, int] = {}
    # Rank 0 is the slowest: the others run ahead, as they would until a collective blocks them.
    threads = [_client(p, r, 3, stopped_at, 0.004 if r == 0 else 0.001) for r, p in enumerate(paths)]
    await asyncio.sleep(0.05)
    propagated: list[int] = []

    async def propagate(stop_at: int) -> None:
        assert channels[0].paused_at == stop_at - 1  # rank 0 waits while stop_at travels
        propagated.append(stop_at)

    lease = _lease(channels)
    stop_at = await two_phase.coordinate_stop(lease, time.monotonic() + 5, propagate)
    assert stop_at is not None
    assert propagated == [stop_at]
    for thread in threads:
        thread.join(5)
    # Rank 0 stops exactly at stop_at; ranks that ran ahead stop at their next boundary (here without a
    # collective to hold them back; with one they cannot pass stop_at, see docs/worker.md).
    assert stopped_at[0] == stop_at
    assert all(stopped_at[r] >= stop_at for r in (1, 2))
    assert await two_phase.wait_stopped(lease, time.monotonic() + 1) is False  # rank 0 has not checkpointed
    assert channels[1].status is ClientStatus.STOPPED


async def test_coordinate_stop_gives_up_at_the_deadline_when_the_leader_never_checks(tmp_path: Path) -> None:
    channel = Channel.create(tmp_path / "r.chan")
    lease = _lease([channel])
    started = time.monotonic()
    assert await two_phase.coordinate_stop(lease, started + 0.1, None) is None
    assert 0.1 <= time.monotonic() - started < 1.0
    assert channel.signal is LeaseSignal.STOP_REQUESTED


def test_orphaned_asks_for_a_stop_at_the_next_boundary_but_keeps_a_fixed_stop_at(tmp_path: Path) -> None:
    agent = Channel.create(tmp_path / "c.chan")
    client = Channel.open(tmp_path / "c.chan")
    agent.orphan()
    assert client.signal is LeaseSignal.ORPHANED
    assert client.stop_at is None
    agent.request_stop()  # nothing undoes it
    assert client.signal is LeaseSignal.ORPHANED
    other = Channel.create(tmp_path / "d.chan")
    other.set_stop_at(7)
    other.orphan()  # the two-phase stop already fixed where every rank stops: that stands
    assert (other.signal, other.stop_at) == (LeaseSignal.STOP_AT, 7)


@pytest.mark.parametrize("rank", [0, 1], ids=["leader", "follower"])
def test_an_orphaned_rank_stops_at_its_next_boundary_and_the_leader_checkpoints(tmp_path: Path, rank: int) -> None:
    path = tmp_path / "rank.chan"
    agent = Channel.create(path)
    job = Job(JobEnv(rank=rank, world_size=2, channel=path, checkpoint_dir=tmp_path / "ck"))
    seen = []
    for batch in job.iterate(range(100), max_iterations=100, model=_Counter()):
        seen.append(batch)
        if batch == 6:
            agent.orphan()  # the watchdog found the agent gone during iteration 7
    assert (seen, job.iteration, job.stopping, job.orphaned) == (list(range(7)), 7, True, True)
    assert agent.status is ClientStatus.STOPPED
    if rank == 0:
        assert agent.checkpoint_iteration == 7
        assert (tmp_path / "ck" / "checkpoint.pt").is_file()
    else:
        assert not (tmp_path / "ck").exists()


def test_an_orphan_paused_for_stop_at_stops_instead_of_waiting_forever(tmp_path: Path) -> None:
    path = tmp_path / "rank.chan"
    agent = Channel.create(path)
    job = Job(JobEnv(channel=path, checkpoint_dir=tmp_path))
    agent.request_stop()  # phase one, then the agent dies before phase two
    timer = threading.Timer(0.05, agent.orphan)
    timer.start()
    started = time.monotonic()
    assert job.should_stop()
    assert time.monotonic() - started < 5
    assert (agent.paused_at, job.orphaned) == (0, True)
    timer.join()


class _Counter:
    def state_dict(self) -> dict[str, int]:
        return {}

    def load_state_dict(self, state: dict[str, int]) -> None:
        pass
