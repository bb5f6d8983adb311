"""roundhouse.train without a worker: environment, atomic checkpoints, loader position and resume."""

from __future__ import annotations

import itertools
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roundhouse import train
from roundhouse.train import CheckpointError, EnvError, Job, JobEnv, Position, load_checkpoint, save_checkpoint
from roundhouse.train._agent import AgentWatch
from services.worker.channel import Channel, ClientStatus


def test_exports() -> None:
    assert set(train.__all__) == {name for name in dir(train) if not name.startswith("_")} - {"annotations"}


def test_env_defaults_outside_a_worker() -> None:
    env = JobEnv.from_environ({})
    assert (env.job_id, env.rank, env.world_size, env.channel, env.resume_from) == ("local", 0, 1, None, None)
    assert env.checkpoint_dir == Path("checkpoints")


def test_env_under_a_worker_and_torchrun_fallbacks() -> None:
    env = JobEnv.from_environ({
        "ROUNDHOUSE_JOB_ID": "j1", "ROUNDHOUSE_RANK": "1", "ROUNDHOUSE_WORLD_SIZE": "2",
        "ROUNDHOUSE_CHECKPOINT_DIR": "/ck", "ROUNDHOUSE_CHANNEL": "/c.chan",
        "ROUNDHOUSE_RESUME_FROM": "/ck/checkpoint.pt", "ROUNDHOUSE_RESUME_ITERATION": "7",
    })  # fmt: skip
    assert (env.job_id, env.rank, env.world_size, env.resume_iteration) == ("j1", 1, 2, 7)
    assert env.channel == Path("/c.chan")
    assert JobEnv.from_environ({"RANK": "3", "WORLD_SIZE": "4"}).rank == 3


@pytest.mark.parametrize(
    "environ",
    [{"ROUNDHOUSE_RANK": "x"}, {"ROUNDHOUSE_RANK": "2", "ROUNDHOUSE_WORLD_SIZE": "2"}, {"WORLD_SIZE": "0"}],
    ids=["not-an-int", "rank-outside-world", "empty-world"],
)
def test_env_errors_name_the_variable(environ: dict[str, str]) -> None:
    with pytest.raises(EnvError):
        JobEnv.from_environ(environ)


def test_checkpoint_round_trip_without_torch_leaves_no_temp_file(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path / "c.pt", {"iteration": 3, "epoch": 0, "batch_index": 3, "extra": [1, 2]})
    assert load_checkpoint(path)["extra"] == [1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]


def test_a_failed_checkpoint_keeps_the_previous_one(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path / "c.pt", {"iteration": 1, "epoch": 0, "batch_index": 1, "extra": "old"})
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        save_checkpoint(path, {"iteration": 2, "epoch": 0, "batch_index": 2, "extra": lambda: None})
    assert load_checkpoint(path)["extra"] == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]


def test_load_refuses_foreign_or_missing_files(tmp_path: Path) -> None:
    (tmp_path / "foreign.pt").write_bytes(pickle.dumps({"weights": 1}))
    with pytest.raises(CheckpointError, match=r"not a roundhouse\.train checkpoint"):
        load_checkpoint(tmp_path / "foreign.pt")
    (tmp_path / "torn.pt").write_bytes(b"\x80\x05garbage")
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_checkpoint(tmp_path / "torn.pt")
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nothing.pt")


class Sampler:
    """Records set_epoch calls, like DistributedSampler."""

    def __init__(self) -> None:
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


class Data:
    """Ten batches per epoch, each naming its (epoch, index)."""

    def __init__(self) -> None:
        self.sampler = Sampler()

    def __iter__(self):  # type: ignore[no-untyped-def]
        epoch = self.sampler.epochs[-1]
        return iter([(epoch, i) for i in range(10)])


def run(tmp_path: Path, *, stop_at: int | None, total: int = 25) -> tuple[list[tuple[int, int]], Job]:
    chan = tmp_path / "rank.chan"
    agent = Channel.create(chan)
    if stop_at is not None:
        agent.set_stop_at(stop_at)
    job = Job(JobEnv(checkpoint_dir=tmp_path / "ck", channel=chan,
                     resume_from=tmp_path / "ck" / "checkpoint.pt" if (tmp_path / "ck").exists() else None))
    job.restore()
    seen = [batch for batch in job.iterate(Data(), max_iterations=total, extra={"k": 1}, model=None)]
    job.checkpoint(extra={"k": 1})
    agent.close()
    return seen, job


@pytest.mark.parametrize("stop_at", [0, 1, 7, 10, 19, 24], ids=lambda s: f"stop-at-{s}")
def test_a_stopped_and_resumed_run_sees_every_batch_exactly_once(tmp_path: Path, stop_at: int) -> None:
    first, job = run(tmp_path, stop_at=stop_at)
    assert job.stopping
    assert job.iteration == stop_at
    assert load_checkpoint(job.checkpoint_path)["iteration"] == stop_at
    second, resumed = run(tmp_path, stop_at=None)
    assert not resumed.stopping
    assert resumed.iteration == 25
    expected = [(e, i) for e in range(3) for i in range(10)][:25]
    assert first + second == expected


def test_iterate_calls_set_epoch_and_reports_finished(tmp_path: Path) -> None:
    data = Data()
    chan = tmp_path / "c.chan"
    agent = Channel.create(chan)
    job = Job(JobEnv(checkpoint_dir=tmp_path / "ck", channel=chan))
    assert len(list(job.iterate(data, epochs=2))) == 20
    assert data.sampler.epochs == [0, 1]
    assert agent.status is ClientStatus.FINISHED
    assert agent.iteration == 20


def test_iterate_refuses_data_without_batches(tmp_path: Path) -> None:
    job = Job(JobEnv(checkpoint_dir=tmp_path))
    with pytest.raises(ValueError, match="no batch"):
        list(job.iterate([], max_iterations=5))


def test_only_rank_zero_writes_checkpoints(tmp_path: Path) -> None:
    job = Job(JobEnv(rank=1, world_size=2, checkpoint_dir=tmp_path))
    assert job.checkpoint(extra=1) is None
    assert not list(tmp_path.iterdir())


def test_a_standalone_run_resumes_from_its_own_checkpoint_dir(tmp_path: Path) -> None:
    job = Job(JobEnv(checkpoint_dir=tmp_path))
    list(job.iterate(range(4), max_iterations=3))
    job.checkpoint(extra="x")
    again = Job(JobEnv(checkpoint_dir=tmp_path))
    restored = again.restore()
    assert restored is not None
    assert (restored.iteration, restored.extra, restored.position) == (3, "x", Position(3, 0, 3))


def test_model_and_optimizer_state_survive_a_checkpoint(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    job = Job(JobEnv(checkpoint_dir=tmp_path))
    for batch in job.iterate([torch.randn(8, 4)] * 3, model=model, optimizer=optimizer, max_iterations=5):
        optimizer.zero_grad()
        model(batch).pow(2).mean().backward()
        optimizer.step()
    fresh = torch.nn.Linear(4, 2)
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.1)
    restored = Job(JobEnv(checkpoint_dir=tmp_path)).restore(fresh, fresh_opt)
    assert restored is not None
    assert restored.iteration == 5
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)
    assert fresh_opt.state_dict()["state"][0]["step"] == optimizer.state_dict()["state"][0]["step"]


def test_the_agent_watch_sees_the_agent_process_end() -> None:
    agent = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        watch = AgentWatch(agent.pid)
        assert watch.watching
        assert not watch.gone()
        assert agent.stdin is not None
        agent.stdin.close()
        agent.wait(10)
        assert watch.gone()  # the process ended (pidfd), though nobody reaped it here before
        assert watch.gone()
        watch.close()
    finally:
        agent.kill()
        agent.wait()


def test_a_job_stops_on_its_own_when_its_agent_process_ends(tmp_path: Path) -> None:
    """No watchdog said so (the channel still says run): the client's own check stops it."""
    agent = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    chan = tmp_path / "rank.chan"
    channel = Channel.create(chan)
    job = Job(JobEnv(channel=chan, checkpoint_dir=tmp_path, agent_pid=agent.pid))
    deadline = time.monotonic() + 10
    assert agent.stdin is not None
    try:
        for i in job.iterate(itertools.count(), model=_Counter()):
            if i == 3:
                agent.stdin.close()
                agent.wait(10)
            time.sleep(0.01)
            assert time.monotonic() < deadline, "the job did not notice"
    finally:
        agent.kill()
        agent.wait()
    assert (job.stopping, job.orphaned) == (True, True)
    assert channel.checkpoint_iteration == job.iteration
    assert load_checkpoint(job.checkpoint_path)["iteration"] == job.iteration
    job.close()


class _Counter:
    def state_dict(self) -> dict[str, int]:
        return {}

    def load_state_dict(self, state: dict[str, int]) -> None:
        pass
