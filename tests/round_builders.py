"""Builders for rounds with snapshots: a stand-in owner (the scheduler's side) of jobs, nodes and a
``SnapshotWriter``, for the snapshot unit tests and the placement service's integration tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from schemas.job import JobSpec
from schemas.rounds import RoundSnapshot, ScheduleRound
from services.core.snapshot import SnapshotWriter, advance_run
from services.core.state import ClusterState, Gpu, JobState, JobStatus, Node


@dataclasses.dataclass
class NodeInfo:
    node_id: str
    gpus: tuple[int, ...]
    gpu_type: str = "generic"
    cpus: float = 32.0
    memory_gb: float = 256.0
    links: tuple[tuple[int, int, float], ...] = ()
    network_gbps: float | None = None


NODES = [NodeInfo("node-a", (0, 1, 2, 3)), NodeInfo("node-b", (0, 1, 2, 3), gpu_type="a100")]
NOW = 1_000.0


def cluster_of(nodes: list[NodeInfo]) -> ClusterState:
    node_list: list[Node] = []
    gpu_list: list[Gpu] = []
    for info in nodes:
        start = len(gpu_list)
        ids = tuple(range(start, start + len(info.gpus)))
        node_list.append(Node(info.node_id, ids, cpus=info.cpus, memory_gb=info.memory_gb, gpu_type=info.gpu_type))
        gpu_list.extend(Gpu(g, info.node_id, local, info.gpu_type) for g, local in zip(ids, info.gpus, strict=True))
    return ClusterState(node_list, gpu_list)


def to_local(cluster: ClusterState) -> Callable[[Iterable[int]], list[tuple[str, tuple[int, ...]]]]:
    def convert(gpu_ids: Iterable[int]) -> list[tuple[str, tuple[int, ...]]]:
        parts: dict[str, list[int]] = {}
        for g in gpu_ids:
            parts.setdefault(cluster.gpus[g].node_id, []).append(cluster.gpus[g].local_index)
        return [(n, tuple(v)) for n, v in parts.items()]

    return convert


def job(job_id: str, *, gpus: int = 1, seq: int = 1, **fields: object) -> JobState:
    spec = JobSpec(name=job_id, command=["python", "train.py", "--secret"], gpus=gpus, env={"TOKEN": "s3cret"},
                   workdir="/home/alice", model="resnet50")  # fmt: skip
    state = JobState(job_id=job_id, spec=spec, submit_time=10.0 + seq, seq=seq, admit_time=11.0 + seq,
                     queued_since=12.0 + seq)  # fmt: skip
    for name, value in fields.items():
        setattr(state, name, value)
    return state


class Owner:
    """Stands in for the scheduler: jobs with run starts, a cluster, a writer."""

    def __init__(self, nodes: list[NodeInfo] | None = None) -> None:
        self.nodes = nodes if nodes is not None else NODES
        self.cluster = cluster_of(self.nodes)
        self.jobs: dict[str, JobState] = {}
        self.run_starts: dict[str, tuple[float, float]] = {}
        self.writer = SnapshotWriter()

    def run(self, state: JobState, gpus: tuple[int, ...], service0: float, executed0: float, start: float) -> None:
        state.status = JobStatus.RUNNING
        state.gpus = gpus
        state.last_start_time = start
        state.queued_since = None
        state.resumed_at = start + 5.0
        state.run_start_service = service0
        self.run_starts[state.job_id] = (service0, executed0)
        self.cluster.assign(state.job_id, gpus)

    def at(self, now: float) -> None:
        """Advance running jobs as the scheduler's book does at a round."""
        for job_id, state in self.jobs.items():
            if state.is_running:
                s0, e0 = self.run_starts[job_id]
                state.attained_service, state.executed_time = advance_run(s0, e0, len(state.gpus),
                                                                          state.last_start_time, now)  # fmt: skip

    def encode(self, now: float, **extra: object) -> RoundSnapshot:
        self.at(now)
        return self.writer.encode(now=now, jobs=self.jobs, run_start=lambda j: self.run_starts[j], nodes=self.nodes,
                                  to_local=to_local(self.cluster), **extra)  # type: ignore[arg-type]  # fmt: skip

    def round(self, number: int, ranked: list[str], now: float = NOW, **fields: object) -> ScheduleRound:
        """Round ``number`` ranking ``ranked``, with this owner's snapshot at ``now``."""
        snapshot = self.encode(now)
        return ScheduleRound(epoch=1, round=number, state_version=number, ranked=ranked, snapshot=snapshot,
                             to=self.writer.peer or "any", **fields)  # type: ignore[arg-type]  # fmt: skip
