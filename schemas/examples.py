"""A valid example of every wire model, for docs, ``roundhouse schemas --example`` and tests.

Each model has at least two examples: the first is *full* (optional fields set, so a round trip
covers them), the last is *minimal* (only what is required), and any in between cover fields that
exclude each other (a failure by signal vs. by exit code). The full ones are deterministic (fixed
ids and timestamps) so printed examples are stable.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Final, TypeVar, cast

from schemas.base import WireModel
from schemas.control import (
    AdmissionJob,
    AdmissionNode,
    AdmissionQuery,
    AdmissionReply,
    JobsQuery,
    JobsReply,
    JobView,
    LeaseStopAt,
)
from schemas.job import JobClass, JobSpec
from schemas.jobs import (
    CompletionReason,
    FailureReason,
    JobAccepted,
    JobArrived,
    JobCancel,
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobHeld,
    JobRejected,
    JobStarted,
    JobSuspended,
    SuspendReason,
)
from schemas.leases import LeaseAck, LeaseAckError, LeaseGrant, LeaseRevoke, RevokeReason, WorldInfo
from schemas.logs import LogChunk, LogData, LogRead, LogRun, LogsQuery, LogsReply
from schemas.metrics import GpuSample, JobMetrics, NodeMetrics
from schemas.nodes import (
    GpuInventory,
    GpuLink,
    HeldLease,
    LeaseState,
    NodeHeartbeat,
    NodeRegister,
    NodeReregister,
    ReregisterReason,
)
from schemas.operations import (
    DrainReply,
    DrainRequest,
    InstanceView,
    NodesQuery,
    NodesReply,
    NodeState,
    NodeView,
    QueueDepth,
    RoundView,
    ServiceView,
    StatusQuery,
    StatusReply,
)
from schemas.rounds import (
    GpuPairLink,
    NodeGpus,
    PlacementPlan,
    PolicySpec,
    RoundSnapshot,
    RoundTrigger,
    ScheduleRound,
    SnapshotJob,
    SnapshotNode,
)

__all__ = ["EXAMPLE_TS", "example", "examples", "examples_by_model"]

EXAMPLE_TS: Final = 1_700_000_000.0
_NS: Final = uuid.UUID("6f1c1f0e-52b5-4c0b-9a53-7d1b0b0c0001")
_INCARNATION: Final = uuid.UUID("0b7d3c52-8f0e-4d1e-a2a5-2f3c4d5e6f70")

M = TypeVar("M", bound=WireModel)


def _eid(name: str) -> uuid.UUID:
    return uuid.uuid5(_NS, name)


def _policy_spec_full() -> PolicySpec:
    return PolicySpec(
        name="resnet-trial", user="alice", gpus=2, max_gpus=4, cpus=8.0, memory_gb=64.0, job_class=JobClass.TE,
        priority=5, grace_period_s=60.0, max_preemptions=3, model="resnet50", expected_iterations=10_000,
        expected_duration_s=600.0, loss_target=0.05, gpu_throughputs={"k80": 0.16, "p100": 0.66, "v100": 1.0},
    )  # fmt: skip


def _snapshot_job_full() -> SnapshotJob:
    return SnapshotJob(
        job_id="job-0002", spec=_policy_spec_full(), submit_time=EXAMPLE_TS - 900, seq=2, running=True,
        gpus=[NodeGpus(node_id="node-03", gpus=[0])], admit_time=EXAMPLE_TS - 899,
        first_start_time=EXAMPLE_TS - 890, last_start_time=EXAMPLE_TS - 600, resumed_at=EXAMPLE_TS - 590,
        last_preempt_time=EXAMPLE_TS - 700, longest_wait_s=9.0, service0=290.0, executed0=290.0,
        iterations_done=1200, preemptions=1, loss=0.42, loss_history=[(EXAMPLE_TS - 60, 0.42)], iteration_time_s=0.25,
        grad_noise_scale=1_850.0, batch_size=512,
    )  # fmt: skip


def _snapshot_full() -> RoundSnapshot:
    return RoundSnapshot(
        version=311, base=310, now=EXAMPLE_TS,
        nodes=[SnapshotNode(node_id="node-03", gpus=[0, 1, 2, 3], gpu_type="NVIDIA H100 80GB HBM3", cpus=64,
                            memory_gb=512)],
        jobs=[
            SnapshotJob(job_id="job-0003", submit_time=EXAMPLE_TS - 5, seq=3, admit_time=EXAMPLE_TS - 5,
                        queued_since=EXAMPLE_TS - 5),
            _snapshot_job_full(),
        ],
        removed=["job-0008"],
        held={"job-0009": [NodeGpus(node_id="node-03", gpus=[2, 3])]},
    )


def _spec_full() -> JobSpec:
    return JobSpec(
        name="resnet50-imagenet",
        user="alice",
        command=["python", "-m", "train", "--epochs", "90"],
        gpus=8,
        max_gpus=16,
        cpus=32.0,
        memory_gb=128.0,
        job_class=JobClass.TE,
        priority=10,
        grace_period_s=60.0,
        max_preemptions=3,
        model="resnet50",
        expected_iterations=450_000,
        expected_duration_s=36_000.0,
        gpu_throughputs={"k80": 0.16, "p100": 0.66, "v100": 1.0},
        loss_target=0.05,
        env={"NCCL_DEBUG": "WARN"},
        workdir="/home/alice/resnet",
        distributed=True,
    )


def _spec_min() -> JobSpec:
    return JobSpec(name="hello", command=["python", "train.py"])


def _gpu(i: int) -> GpuInventory:
    return GpuInventory(
        index=i,
        uuid=f"GPU-5f6c1d2e-0000-4000-8000-00000000000{i}",
        name="NVIDIA H100 80GB HBM3",
        memory_mib=81_559,
        compute_capability="9.0",
        pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
    )


def _job_view() -> JobView:
    return JobView(
        job_id="job-0001",
        name="resnet50-trial",
        user="alice",
        job_class=JobClass.TE,
        status="running",
        gpus=2,
        model="resnet50",
        placement={"node-01": [0, 1]},
        submit_time=EXAMPLE_TS,
        first_start_time=EXAMPLE_TS + 2.5,
        finish_time=None,
        attained_service_s=1200.0,
        runtime_s=600.0,
        iterations_done=2400,
        preemptions=1,
        reason=None,
    )


def _failed_job_view() -> JobView:
    return JobView(
        job_id="job-0002", name="train_mlp.py", user="alice", job_class=JobClass.BE, status="failed", gpus=1,
        submit_time=EXAMPLE_TS, first_start_time=EXAMPLE_TS + 1.0, finish_time=EXAMPLE_TS + 1.1,
        reason="exit code 2 on node-01: rank 0 exited with 2: python: can't open file 'train_mlp.py'",
        exit_code=2, signal=None,
    )  # fmt: skip


def _killed_job_view() -> JobView:
    return JobView(
        job_id="job-0003", name="big", user="alice", job_class=JobClass.BE, status="failed", gpus=1,
        submit_time=EXAMPLE_TS, reason="killed by signal 9 (SIGKILL) on node-01", signal=9, queue_position=None,
    )  # fmt: skip


def _queued_job_view() -> JobView:
    return JobView(
        job_id="job-0004", name="sweep-7", user="alice", job_class=JobClass.BE, status="queued", gpus=4,
        submit_time=EXAMPLE_TS, queue_position=2, reason="needs 4 GPUs, 2 of 8 free; #2 of 3 waiting in round 17",
        eta_s=1800.0, eta_time=EXAMPLE_TS + 1830.0, eta_quality="durations",
    )  # fmt: skip


def _queued_job_view_without_eta() -> JobView:
    return JobView(
        job_id="job-0005", name="sweep-8", user="alice", job_class=JobClass.BE, status="queued", gpus=4,
        submit_time=EXAMPLE_TS, eta_reason="it does not start within 168 h (simulated)",
    )  # fmt: skip


def _admission_job() -> AdmissionJob:
    return AdmissionJob(
        job_id="job-0001",
        spec=_spec_full(),
        status="queued",
        submit_time=EXAMPLE_TS,
        admit_time=EXAMPLE_TS + 0.5,
        seq=17,
    )


def _admission_node() -> AdmissionNode:
    return AdmissionNode(
        node_id="node-01",
        incarnation=_INCARNATION,
        hostname="10.0.0.11",
        gpus=[0, 1, 2, 3],
        gpu_type="NVIDIA H100 80GB HBM3",
        cpus=96,
        memory_gb=1024,
        draining=True,
    )


def _node_view() -> NodeView:
    return NodeView(
        node_id="node-01", hostname="gpu-01.example", gpu_type="A100-SXM4-80GB", state=NodeState.DRAINING,
        gpus_total=8, gpus_used=4, gpus_free=4, jobs=["job-0001"], other_jobs=1, live=True, silent=False,
        heartbeat_age_s=0.4, takes_work=False, draining=True, drained_by="operator", drained_at=EXAMPLE_TS,
        drain_reason="replace a fan", agent_draining=False,
    )


def _instance_view() -> InstanceView:
    return InstanceView(
        instance="scheduler-a1b2", service_id="NI3Y0Y1Q2", version="0.1.0", uptime_s=3600.5, policy="las",
        policy_options={"thresholds": [3600.0], "starvation_factor": 4}, leader=True,
        metrics_url="http://127.0.0.1:9101/metrics",
    )


def _round_view() -> RoundView:
    return RoundView(number=42, rounds_run=40, policy="las", phases_s={"snapshot": 0.001, "rank": 0.002},
                     launched=2, suspended=1, dropped=0)


def _world(rank: int) -> WorldInfo:
    return WorldInfo(
        num_nodes=2,
        node_rank=rank,
        world_size=16,
        rank_offset=8 * rank,
        coordinator_node="node-01",
        coordinator_host="node-01.cluster.local",
        coordinator_port=29_500,
    )


_BUILDERS: Final[Mapping[type[WireModel], Callable[[], tuple[WireModel, ...]]]] = {
    JobSpec: lambda: (_spec_full(), _spec_min()),
    JobArrived: lambda: (
        JobArrived(event_id=_eid("arrived"), ts=EXAMPLE_TS, job_id="job-0001", spec=_spec_full()),
        JobArrived(job_id="j", spec=_spec_min()),
    ),
    JobAccepted: lambda: (
        JobAccepted(
            event_id=_eid("accepted"), ts=EXAMPLE_TS, job_id="job-0001", reason="quota left", policy="fifo"
        ),
        JobAccepted(job_id="j"),
    ),
    JobHeld: lambda: (
        JobHeld(
            event_id=_eid("held"), ts=EXAMPLE_TS, job_id="job-0001", reason="user over quota", policy="quota"
        ),
        JobHeld(job_id="j", reason="full"),
    ),
    JobRejected: lambda: (
        JobRejected(
            event_id=_eid("rejected"),
            ts=EXAMPLE_TS,
            job_id="job-0001",
            reason="asks for 2048 GPUs; the cluster has 512",
            policy="capacity",
        ),
        JobRejected(job_id="j", reason="no"),
    ),
    JobCancel: lambda: (
        JobCancel(event_id=_eid("cancel"), ts=EXAMPLE_TS, job_id="job-0001", user="alice", reason="wrong lr"),
        JobCancel(job_id="j", user="u"),
    ),
    JobStarted: lambda: (
        JobStarted(
            event_id=_eid("started"),
            ts=EXAMPLE_TS,
            job_id="job-0001",
            lease_id="lease-0001-2",
            node_id="node-01",
            epoch=7,
            gpus=[0, 1, 2, 3, 4, 5, 6, 7],
            iteration=1200,
            resumed_from="/ckpt/job-0001/001200.pt",
            startup_s=14.5,
        ),
        JobStarted(job_id="j", lease_id="l", node_id="n", epoch=0, gpus=[0]),
    ),
    JobCheckpointed: lambda: (
        JobCheckpointed(
            event_id=_eid("checkpointed"),
            ts=EXAMPLE_TS,
            job_id="job-0001",
            lease_id="lease-0001-2",
            node_id="node-01",
            epoch=7,
            checkpoint_path="/ckpt/job-0001/checkpoint.pt",
            iteration=2000,
        ),
        JobCheckpointed(job_id="j", lease_id="l", node_id="n", epoch=0, checkpoint_path="c", iteration=0),
    ),
    JobSuspended: lambda: (
        JobSuspended(
            event_id=_eid("suspended"),
            ts=EXAMPLE_TS,
            job_id="job-0001",
            lease_id="lease-0001-2",
            node_id="node-01",
            epoch=7,
            reason=SuspendReason.PREEMPTED,
            iteration=2401,
            checkpoint_path="/ckpt/job-0001/002401.pt",
            checkpoint_iteration=2401,
            grace_expired=False,
            stop_s=8.25,
        ),
        JobSuspended(
            job_id="j", lease_id="l", node_id="n", epoch=0, reason=SuspendReason.LEASE_EXPIRED, iteration=0
        ),
    ),
    JobCompleted: lambda: (
        JobCompleted(
            event_id=_eid("completed"),
            ts=EXAMPLE_TS,
            job_id="job-0001",
            lease_id="lease-0001-3",
            node_id="node-02",
            epoch=8,
            reason=CompletionReason.LOSS_TARGET,
            iteration=450_000,
            exit_code=0,
            checkpoint_path="s3://models/job-0001/final.pt",
            loss=0.049,
            runtime_s=3600.0,
        ),
        JobCompleted(job_id="j", lease_id="l", node_id="n", epoch=0, iteration=1),
    ),
    JobFailed: lambda: (
        JobFailed(
            event_id=_eid("failed"),
            ts=EXAMPLE_TS,
            job_id="job-0001",
            reason=FailureReason.EXIT_CODE,
            lease_id="lease-0001-3",
            node_id="node-02",
            epoch=8,
            iteration=1000,
            checkpoint_path="/ckpt/job-0001/001000.pt",
            exit_code=1,
            message="RuntimeError: CUDA error: an illegal memory access was encountered",
            attempts=3,
        ),
        JobFailed(job_id="j", node_id="n", reason=FailureReason.SIGNAL, signal=9, message="killed by the OOM killer"),
        JobFailed(job_id="j", node_id="n", reason=FailureReason.NODE_LOST),
    ),
    ScheduleRound: lambda: (
        ScheduleRound(
            event_id=_eid("round"),
            ts=EXAMPLE_TS,
            epoch=7,
            round=42,
            state_version=1337,
            trigger=RoundTrigger.ARRIVAL,
            policy="fitgpp",
            ranked=["job-0003", "job-0001", "job-0002"],
            gpu_targets={"job-0001": 16},
            terminate={"job-0009": "converged: loss plateaued for 20 epochs"},
            preempt=False,
            fill_only=True,
            to="placement-7f3a",
            snapshot=_snapshot_full(),
        ),
        ScheduleRound(epoch=0, round=0, state_version=0, ranked=[]),
    ),
    PlacementPlan: lambda: (
        PlacementPlan(
            event_id=_eid("plan"),
            ts=EXAMPLE_TS,
            round=42,
            state_version=1337,
            epoch=7,
            policy="consolidated",
            launch={
                "job-0001": [
                    NodeGpus(node_id="node-01", gpus=list(range(8))),
                    NodeGpus(node_id="node-02", gpus=list(range(8))),
                ],
                "job-0003": [NodeGpus(node_id="node-03", gpus=[0])],
            },
            suspend=["job-0002"],
            terminate={"job-0009": "converged: loss plateaued for 20 epochs"},
            instance="placement-7f3a",
        ),
        PlacementPlan(round=43, state_version=1338, epoch=7, instance="placement-7f3a", resync=True),
        PlacementPlan(
            round=44, state_version=1338, epoch=7, instance="placement-7f3a",
            error="the round ranks 1 job(s) its snapshot lacks: job-0010",
        ),
        PlacementPlan(round=0, state_version=0, epoch=0),
    ),
    LeaseGrant: lambda: (
        LeaseGrant(
            event_id=_eid("grant"),
            ts=EXAMPLE_TS,
            epoch=7,
            lease_id="lease-0001-2",
            job_id="job-0001",
            node_id="node-02",
            gpus=list(range(8)),
            spec=_spec_full(),
            world=_world(1),
            resume_from="/ckpt/job-0001/001200.pt",
            resume_iteration=1200,
            attempt=2,
            shared=True,
        ),
        LeaseGrant(epoch=0, lease_id="l", job_id="j", node_id="n", gpus=[0], spec=_spec_min()),
    ),
    LeaseRevoke: lambda: (
        LeaseRevoke(
            event_id=_eid("revoke"),
            ts=EXAMPLE_TS,
            epoch=7,
            lease_id="lease-0001-2",
            job_id="job-0001",
            node_id="node-01",
            reason=RevokeReason.PREEMPT,
            grace_s=60.0,
            message="TE job job-0007 needs 8 GPUs",
        ),
        LeaseRevoke(epoch=0, lease_id="l", job_id="j", node_id="n", reason=RevokeReason.CANCEL, grace_s=0.0),
    ),
    LeaseAck: lambda: (
        LeaseAck(
            event_id=_eid("ack"),
            ts=EXAMPLE_TS,
            lease_id="lease-0001-2",
            node_id="node-01",
            accepted=False,
            error=LeaseAckError.STALE_EPOCH,
            duplicate=False,
            epoch_seen=8,
            message="epoch 7 < 8 already seen",
            leases_held=1,
        ),
        LeaseAck(lease_id="l", node_id="n", accepted=True, epoch_seen=0),
    ),
    NodeRegister: lambda: (
        NodeRegister(
            event_id=_eid("register"),
            ts=EXAMPLE_TS,
            node_id="node-01",
            incarnation=_INCARNATION,
            hostname="node-01.cluster.local",
            cpus=96.0,
            memory_gb=1024.0,
            gpus=[_gpu(0), _gpu(1)],
            links=[[GpuLink.SELF, GpuLink.NVLINK], [GpuLink.NVLINK, GpuLink.SELF]],
            link_bandwidth_gbps=[[0.0, 3600.0], [3600.0, 0.0]],  # H100 NVLink 4: 450 GB/s per direction
            network_gbps=400.0,
            labels={"rack": "r12", "topology.kubernetes.io/zone": "eu-1a"},
            driver_version="550.54.15",
            cuda_version="12.4",
            agent_version="0.1.0",
            lease_ttl_s=30.0,
        ),
        NodeRegister(node_id="n", incarnation=_INCARNATION, hostname="10.0.0.7", cpus=1.0, memory_gb=1.0),
    ),
    NodeReregister: lambda: (
        NodeReregister(
            event_id=_eid("reregister"),
            ts=EXAMPLE_TS,
            epoch=7,
            node_id="node-01",
            reason=ReregisterReason.UNKNOWN_NODE,
        ),
        NodeReregister(epoch=0, node_id="n", reason=ReregisterReason.OTHER_INCARNATION),
    ),
    NodeHeartbeat: lambda: (
        NodeHeartbeat(
            event_id=_eid("heartbeat"),
            ts=EXAMPLE_TS,
            node_id="node-01",
            incarnation=_INCARNATION,
            seq=1234,
            epoch_seen=7,
            leases=[
                HeldLease(
                    lease_id="lease-0001-2",
                    job_id="job-0001",
                    epoch=7,
                    gpus=[0, 1],
                    state=LeaseState.STOPPING,
                    iteration=2400,
                ),
            ],
            draining=True,
        ),
        NodeHeartbeat(node_id="n", incarnation=_INCARNATION, seq=0, epoch_seen=0),
    ),
    JobMetrics: lambda: (
        JobMetrics(
            event_id=_eid("job-metrics"),
            ts=EXAMPLE_TS,
            job_id="job-0001",
            lease_id="lease-0001-2",
            rank=0,
            iteration=2400,
            loss=1.75,
            iteration_time_s=0.31,
            throughput=3303.2,
            batch_size=1024,
            grad_noise_scale=2500.0,
            extra={"top1": 0.61, "lr": 0.1},
        ),
        JobMetrics(job_id="j", iteration=0),
    ),
    NodeMetrics: lambda: (
        NodeMetrics(
            event_id=_eid("node-metrics"),
            ts=EXAMPLE_TS,
            node_id="node-01",
            gpus=[
                GpuSample(
                    index=0,
                    utilization_pct=97.0,
                    memory_used_mib=70_000,
                    memory_total_mib=81_559,
                    temperature_c=64.0,
                    power_w=612.5,
                ),
                GpuSample(index=1, utilization_pct=0.0, memory_used_mib=0),
            ],
            cpu_utilization_pct=35.5,
            memory_used_gb=210.0,
            interval_s=5.0,
        ),
        NodeMetrics(node_id="n"),
    ),
    GpuInventory: lambda: (
        _gpu(0),
        GpuInventory(index=0, uuid="GPU-0", name="Tesla V100", memory_mib=16_384),
    ),
    HeldLease: lambda: (
        HeldLease(
            lease_id="lease-0001-2",
            job_id="job-0001",
            epoch=7,
            gpus=[0, 1],
            state=LeaseState.RUNNING,
            iteration=10,
        ),
        HeldLease(lease_id="l", job_id="j", epoch=0, gpus=[0]),
    ),
    WorldInfo: lambda: (_world(0), _world(1)),
    LeaseStopAt: lambda: (
        LeaseStopAt(
            event_id=_eid("stop-at"),
            ts=EXAMPLE_TS,
            epoch=7,
            lease_id="lease-0001-2",
            job_id="job-0001",
            node_id="node-02",
            stop_at=2401,
            grace_s=25.5,
        ),
        LeaseStopAt(epoch=0, lease_id="l", job_id="j", node_id="n", stop_at=0, grace_s=0.0),
    ),
    JobsQuery: lambda: (
        JobsQuery(
            event_id=_eid("jobs-query"),
            ts=EXAMPLE_TS,
            requester="alice",
            job_ids=["job-0001", "job-0002"],
            statuses=["running", "queued"],
            user="alice",
            include_finished=True,
            after="job-0000",
            limit=50,
        ),
        JobsQuery(requester="u"),
    ),
    JobView: lambda: (
        _job_view(),
        _failed_job_view(),
        _killed_job_view(),
        _queued_job_view(),
        _queued_job_view_without_eta(),
        JobView(job_id="j", name="n", user="u", job_class=JobClass.BE, status="queued", gpus=1, submit_time=0.0),
    ),
    JobsReply: lambda: (
        JobsReply(jobs=[_job_view()], truncated=True, epoch=7,
                  refused={"job-0002": "permission denied: bob cannot read alice's job"}),
        JobsReply(epoch=0),
    ),
    LogsQuery: lambda: (
        LogsQuery(event_id=_eid("logs-query"), ts=EXAMPLE_TS, requester="alice", job_id="job-0001", run=2, rank=1,
                  offset=4096, max_bytes=1024),
        LogsQuery(requester="u", job_id="j"),
    ),
    LogRun: lambda: (
        LogRun(run=2, lease_id="lease-0001-2", nodes=["node-02", "node-03"], ranks=[0, 1, 2, 3], current=True),
        LogRun(run=1, lease_id="l", nodes=["n"]),
    ),
    LogChunk: lambda: (
        LogChunk(run=2, rank=1, node_id="node-02", offset=4096, data="step 100 loss 0.31\n", next_offset=4115,
                 size=4115),
        LogChunk(run=1, rank=0, node_id="node-01", offset=0, next_offset=0,
                 unavailable="node node-01 did not answer within 2.0 s (gone or unreachable)"),
        LogChunk(run=1, rank=0, node_id="n", offset=0, next_offset=0),
    ),
    LogsReply: lambda: (
        LogsReply(job_id="job-0001", status="running",
                  runs=[LogRun(run=1, lease_id="lease-0001-1", nodes=["node-01"], ranks=[0]),
                        LogRun(run=2, lease_id="lease-0001-2", nodes=["node-02"], ranks=[0], current=True)],
                  chunk=LogChunk(run=2, rank=0, node_id="node-02", offset=0, data="hello\n", next_offset=6, size=6),
                  epoch=7),
        LogsReply(job_id="job-0002", refused="permission denied: bob cannot read alice's job", epoch=7),
        LogsReply(job_id="j", epoch=0),
    ),
    LogRead: lambda: (
        LogRead(event_id=_eid("log-read"), ts=EXAMPLE_TS, node_id="node-02", job_id="job-0001",
                lease_id="lease-0001-2", local_rank=1, offset=4096, max_bytes=1024),
        LogRead(node_id="n", job_id="j", lease_id="l", local_rank=0),
    ),
    LogData: lambda: (
        LogData(offset=4096, data="step 100 loss 0.31\n", next_offset=4115, size=4115),
        LogData(offset=0, next_offset=0, missing="no log of rank 0 in lease l"),
        LogData(offset=0, next_offset=0),
    ),
    NodesQuery: lambda: (
        NodesQuery(event_id=_eid("nodes-query"), ts=EXAMPLE_TS, requester="alice", node_ids=["node-01"]),
        NodesQuery(requester="u"),
    ),
    NodeView: lambda: (_node_view(), NodeView(node_id="n", hostname="h", state=NodeState.IDLE, gpus_total=0,
                                              gpus_used=0, gpus_free=0, live=True, takes_work=True)),
    NodesReply: lambda: (
        NodesReply(nodes=[_node_view()], epoch=7, silent_after_s=2.0, down_after_s=15.0, unknown=["node-99"]),
        NodesReply(epoch=0),
    ),
    DrainRequest: lambda: (
        DrainRequest(event_id=_eid("drain"), ts=EXAMPLE_TS, requester="operator", node_id="node-01", drain=True,
                     now=True, reason="replace a fan"),
        DrainRequest(requester="o", node_id="n"),
    ),
    DrainReply: lambda: (
        DrainReply(node_id="node-01", draining=True, changed=True, preempted=["job-0001"], epoch=7),
        DrainReply(node_id="n", draining=False, changed=False, epoch=0),
    ),
    StatusQuery: lambda: (StatusQuery(event_id=_eid("status-query"), ts=EXAMPLE_TS, requester="alice"),
                          StatusQuery(requester="u")),
    InstanceView: lambda: (_instance_view(), InstanceView(instance="i", service_id="s")),
    ServiceView: lambda: (ServiceView(kind="scheduler", instances=[_instance_view()]), ServiceView(kind="k")),
    RoundView: lambda: (_round_view(), RoundView()),
    QueueDepth: lambda: (QueueDepth(queued=3, held=1, running=2, queued_gpus=12), QueueDepth()),
    StatusReply: lambda: (
        StatusReply(leader="scheduler-a1b2", epoch=7, services=[ServiceView(kind="scheduler",
                    instances=[_instance_view()])], round=_round_view(),
                    queue=QueueDepth(queued=3, held=1, running=2, queued_gpus=12), nodes=2, nodes_taking_work=1,
                    gpus_total=16, gpus_used=8),
        StatusReply(leader="s", epoch=0),
    ),
    AdmissionQuery: lambda: (
        AdmissionQuery(event_id=_eid("admission-query"), ts=EXAMPLE_TS, through_seq=1234, after_seq=17, limit=500),
        AdmissionQuery(),
    ),
    AdmissionJob: lambda: (
        _admission_job(),
        AdmissionJob(job_id="j", spec=_spec_min(), status="held", submit_time=0.0, seq=0),
    ),
    AdmissionNode: lambda: (
        _admission_node(),
        AdmissionNode(node_id="n", incarnation=_INCARNATION, hostname="h"),
    ),
    AdmissionReply: lambda: (
        AdmissionReply(jobs=[_admission_job()], nodes=[_admission_node()], truncated=True, epoch=7),
        AdmissionReply(epoch=0),
    ),
    NodeGpus: lambda: (NodeGpus(node_id="node-01", gpus=[0, 1, 2, 3]), NodeGpus(node_id="n", gpus=[0])),
    PolicySpec: lambda: (_policy_spec_full(), PolicySpec(name="j")),
    GpuPairLink: lambda: (GpuPairLink(a=0, b=1, gbps=2400.0), GpuPairLink(a=1, b=0, gbps=0.0)),
    SnapshotNode: lambda: (
        SnapshotNode(node_id="node-03", gpus=[0, 1], gpu_type="a100", cpus=64, memory_gb=512,
                     links=[GpuPairLink(a=0, b=1, gbps=2400.0)], network_gbps=200.0),
        SnapshotNode(node_id="n", gpus=[0]),
    ),
    SnapshotJob: lambda: (
        _snapshot_job_full(),
        SnapshotJob(job_id="job-0003", submit_time=EXAMPLE_TS - 5, seq=3, queued_since=EXAMPLE_TS - 5),
        SnapshotJob(job_id="j", submit_time=0.0, seq=0),
    ),
    RoundSnapshot: lambda: (_snapshot_full(), RoundSnapshot(version=0, now=0.0)),
    GpuSample: lambda: (
        GpuSample(
            index=3,
            utilization_pct=50.0,
            memory_used_mib=1024,
            memory_total_mib=16_384,
            temperature_c=40.0,
            power_w=120.0,
        ),
        GpuSample(index=0, utilization_pct=0.0, memory_used_mib=0),
    ),
}


def examples_by_model() -> dict[type[WireModel], tuple[WireModel, ...]]:
    """Every model with examples, mapped to ``(full, ..., minimal)``; built fresh on each call."""
    return {model: build() for model, build in _BUILDERS.items()}


def examples(model: type[M]) -> tuple[M, ...]:
    """``(full, ..., minimal)`` examples of ``model``. Raises KeyError for a model without examples."""
    return cast("tuple[M, ...]", _BUILDERS[model]())


def example(model: type[M]) -> M:
    """The full example of ``model`` (every optional field set)."""
    return examples(model)[0]
