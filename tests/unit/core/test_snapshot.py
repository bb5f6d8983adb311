"""A round's snapshot: what the scheduler writes is what a placement replica rebuilds, field by field."""

from __future__ import annotations

import dataclasses

import pytest

from schemas.codec import decode, encode
from schemas.rounds import RoundSnapshot, ScheduleRound
from schemas.subjects import schedule_round
from services.core.snapshot import (
    BaseMismatchError,
    SnapshotReplica,
    UnknownSnapshotGpuError,
    policy_spec,
)
from services.core.state import ClusterState, JobState
from services.scheduler.policies.pollux import PolluxPolicy
from tests.round_builders import NOW, Owner, job


def wire(snapshot: RoundSnapshot) -> RoundSnapshot:
    """Through the real codec, as the bus sends it (a model built with model_construct included)."""
    message = ScheduleRound.model_construct(epoch=1, round=1, state_version=1, ranked=[], gpu_targets={},
                                            terminate={}, snapshot=snapshot)  # fmt: skip
    decoded = decode(schedule_round(), encode(message))
    assert isinstance(decoded, ScheduleRound)
    assert decoded.snapshot is not None
    return decoded.snapshot


def comparable(state: JobState) -> dict[str, object]:
    fields = dataclasses.asdict(state)
    fields["spec"] = policy_spec(state.spec)
    return fields


def assert_same(owner: Owner, jobs: dict[str, JobState], cluster: ClusterState) -> None:
    assert {j: comparable(s) for j, s in jobs.items()} == {j: comparable(s) for j, s in owner.jobs.items()}
    assert cluster.gpu_jobs == owner.cluster.gpu_jobs
    assert [(n.node_id, n.gpu_ids, n.gpu_type) for n in cluster.nodes.values()] == [
        (n.node_id, n.gpu_ids, n.gpu_type) for n in owner.cluster.nodes.values()
    ]
    assert cluster.gpus == owner.cluster.gpus


@pytest.fixture
def owner() -> Owner:
    o = Owner()
    o.jobs["wait"] = job("wait", gpus=2, seq=1, attained_service=50.0, executed_time=25.0, preemptions=1,
                         loss=0.5, loss_history=[(1.0, 0.9), (2.0, 0.5)], iteration_time_s=0.2)  # fmt: skip
    o.jobs["run"] = job("run", gpus=2, seq=2, iterations_done=40)
    o.run(o.jobs["run"], (4, 5), service0=100.0, executed0=50.0, start=900.0)
    return o


def test_a_full_snapshot_rebuilds_every_field_policies_read(owner: Owner) -> None:
    replica = SnapshotReplica()
    jobs, cluster = replica.apply(wire(owner.encode(NOW)))
    assert_same(owner, jobs, cluster)
    assert jobs["run"].attained_service == 100.0 + 2 * 100.0


def test_specs_travel_without_command_env_and_workdir(owner: Owner) -> None:
    sent = wire(owner.encode(NOW))
    for row in sent.jobs:
        assert row.spec is not None
        assert not {"command", "env", "workdir"} & set(type(row.spec).model_fields)
        assert row.spec.model == "resnet50"
    assert b"s3cret" not in encode(ScheduleRound.model_construct(
        epoch=1, round=1, state_version=1, ranked=[], gpu_targets={}, terminate={}, snapshot=sent))  # fmt: skip


def test_a_delta_sends_only_what_changed_and_the_clock_moves_running_jobs(owner: Owner) -> None:
    replica = SnapshotReplica()
    first = owner.encode(NOW)
    replica.apply(wire(first))
    owner.writer.acknowledged("placement-1", first.version)
    # Nothing but the clock changed: an empty delta, and the running job's service still advances.
    second = owner.encode(NOW + 30)
    assert (second.base, second.jobs, second.removed, second.nodes) == (first.version, [], [], None)
    jobs, cluster = replica.apply(wire(second))
    assert_same(owner, jobs, cluster)
    assert jobs["run"].attained_service == 100.0 + 2 * 130.0
    owner.writer.acknowledged("placement-1", second.version)
    # One new job, one changed, one gone.
    owner.jobs["new"] = job("new", seq=3)
    owner.jobs["wait"].preemptions = 2
    owner.cluster.release("run", owner.jobs["run"].gpus)
    del owner.jobs["run"]
    third = owner.encode(NOW + 60)
    assert sorted(row.job_id for row in third.jobs) == ["new", "wait"]
    assert [row.spec is None for row in sorted(third.jobs, key=lambda r: r.job_id)] == [False, True]
    assert third.removed == ["run"]
    jobs, cluster = replica.apply(wire(third))
    assert_same(owner, jobs, cluster)


def test_gpus_held_by_jobs_outside_the_round_stay_taken(owner: Owner) -> None:
    owner.cluster.assign("revoking", (0, 1))
    jobs, cluster = SnapshotReplica().apply(wire(owner.encode(NOW, held={"revoking": (0, 1)})))
    assert cluster.gpu_jobs[0] == ("revoking",)
    assert "revoking" not in jobs
    assert_same(owner, jobs, cluster)


def test_a_delta_against_another_base_is_refused_and_changes_nothing(owner: Owner) -> None:
    replica = SnapshotReplica()
    first = owner.encode(NOW)
    replica.apply(wire(first))
    owner.writer.acknowledged("placement-1", first.version)
    owner.jobs["wait"].preemptions = 7
    delta = owner.encode(NOW + 1)
    stranger = SnapshotReplica()
    with pytest.raises(BaseMismatchError):
        stranger.apply(wire(delta))
    bad = wire(delta).model_copy(update={"base": first.version + 10})
    with pytest.raises(BaseMismatchError):
        replica.apply(bad)
    assert replica.version == first.version
    jobs, _ = replica.apply(wire(delta))
    assert jobs["wait"].preemptions == 7


def test_a_job_on_a_gpu_of_no_snapshot_node_is_an_error_of_the_round(owner: Owner) -> None:
    sent = wire(owner.encode(NOW))
    rows = [row if row.job_id != "run" else row.model_copy(
        update={"gpus": [row.gpus[0].model_copy(update={"node_id": "node-x"})]}) for row in sent.jobs]  # fmt: skip
    replica = SnapshotReplica()
    with pytest.raises(UnknownSnapshotGpuError, match="node-x"):
        replica.apply(sent.model_copy(update={"jobs": rows}))
    assert replica.version is None


def test_forgetting_the_peer_makes_the_next_snapshot_full(owner: Owner) -> None:
    first = owner.encode(NOW)
    owner.writer.acknowledged("placement-1", first.version)
    assert owner.encode(NOW).base == first.version
    owner.writer.forget()
    full = owner.encode(NOW)
    assert full.base is None
    assert full.nodes is not None
    assert len(full.jobs) == 2


def test_pollux_reads_the_noise_scale_the_snapshot_carries(owner: Owner) -> None:
    """Pollux ranks by a job's reported gradient noise scale (``JobState.grad_noise_scale``): the
    snapshot must carry it (and the batch size reported beside it), in full and as a delta of its
    own, so that the ranking the snapshot gives is the scheduler's (round differential)."""
    for job_id in ("wait", "run"):
        state = owner.jobs[job_id]
        state.spec = state.spec.model_copy(update={"model": "cifar10", "max_gpus": 4})
    owner.jobs["wait"].grad_noise_scale, owner.jobs["wait"].batch_size = 5_000.0, 512
    replica = SnapshotReplica()
    first = owner.encode(NOW)
    jobs, cluster = replica.apply(wire(first))
    assert_same(owner, jobs, cluster)
    policy = PolluxPolicy()
    assert policy.rank(jobs, cluster, NOW) == policy.rank(owner.jobs, owner.cluster, NOW)
    owner.writer.acknowledged("placement-1", first.version)
    owner.jobs["run"].grad_noise_scale = 40.0  # a new report alone is a change
    second = owner.encode(NOW + 1)
    assert [row.job_id for row in second.jobs] == ["run"]
    jobs, cluster = replica.apply(wire(second))
    assert_same(owner, jobs, cluster)
    assert policy.rank(jobs, cluster, NOW + 1) == policy.rank(owner.jobs, owner.cluster, NOW + 1)
