"""The permission table (schemas/roles.py): least privilege, and it matches the subjects the code uses."""

from __future__ import annotations

import pytest

from schemas.roles import (
    BUCKETS,
    RESERVED_NAMES,
    ROLE_PERMISSIONS,
    STREAM,
    Role,
    inbox_prefix,
    permissions_for,
    validate_identity,
)
from schemas.subjects import SUBJECTS


def covers(pattern: str, subject: str) -> bool:
    """NATS matching: does permission ``pattern`` cover the concrete ``subject``?"""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


def may_publish(role: Role, identity: str, subject: str, namespace: str = "") -> bool:
    publish, _, _ = permissions_for(role, identity, namespace=namespace)
    return any(covers(p, subject) for p in publish)


def may_subscribe(role: Role, identity: str, subject: str, namespace: str = "") -> bool:
    _, subscribe, _ = permissions_for(role, identity, namespace=namespace)
    return any(covers(p, subject) for p in subscribe)


# Who publishes each subject, from the direction the subject table documents.
_SPEAKERS = {"client": Role.USER, "worker": Role.WORKER, "job": Role.WORKER, "scheduler": Role.SCHEDULER,
             "admission": Role.ADMISSION, "placement": Role.PLACEMENT,
             "operator": Role.OPERATOR}  # fmt: skip


def _concrete(pattern: str, identity: str) -> str:
    return pattern.replace("*", identity)


@pytest.mark.parametrize("spec", SUBJECTS, ids=lambda s: s.pattern)
def test_the_documented_publisher_may_publish_each_subject_on_its_own_token(spec: object) -> None:
    from schemas.subjects import SubjectSpec

    assert isinstance(spec, SubjectSpec)
    speaker = _SPEAKERS[spec.direction.split("->")[0].split()[0].strip(" ,")]
    identity = "any" if speaker in (Role.SCHEDULER, Role.PLACEMENT) else "n1"
    assert may_publish(speaker, identity, _concrete(spec.pattern, "n1")), spec.pattern


@pytest.mark.parametrize(
    "subject",
    ["job.started.n2", "job.completed.n2", "job.failed.n2", "job.suspended.n2", "job.checkpointed.n2",
     "node.register.n2", "node.heartbeat.n2", "metrics.node.n2", "lease.grant.n2", "lease.revoke.n1",
     "job.arrived.alice", "job.cancel.alice", "schedule.round.any", "placement.plan", "job.accepted"],
)  # fmt: skip
def test_a_worker_speaks_only_for_its_own_node(subject: str) -> None:
    assert not may_publish(Role.WORKER, "n1", subject)


def test_a_worker_hears_only_its_own_commands() -> None:
    assert may_subscribe(Role.WORKER, "n1", "lease.grant.n1")
    for other in ("lease.grant.n2", "lease.revoke.n2", "lease.stop.n2", "job.arrived.alice", "schedule.round.any"):
        assert not may_subscribe(Role.WORKER, "n1", other), other


@pytest.mark.parametrize(
    "subject",
    ["job.arrived.bob", "job.cancel.bob", "query.jobs.bob", "job.accepted", "lease.grant.n1", "lease.revoke.n1",
     "job.completed.n1", "node.register.n1", "query.admission", "$JS.API.STREAM.DELETE.RH_EVENTS",
     "$JS.API.CONSUMER.CREATE.RH_EVENTS.x", "$KV.scheduler-leader.leader", "schedule.round.any"],
)  # fmt: skip
def test_a_user_acts_only_as_itself_and_never_on_jetstream(subject: str) -> None:
    assert not may_publish(Role.USER, "alice", subject)
    assert may_publish(Role.USER, "alice", "job.arrived.alice")
    assert may_publish(Role.USER, "alice", "job.cancel.alice")


@pytest.mark.parametrize(
    "subject",
    ["job.arrived.alice", "job.arrived.bob", "lease.grant.n1", "job.cancel.bob", "_INBOX.user.bob.x",
     "_INBOX.scheduler.scheduler.x", "query.jobs.bob"],
)  # fmt: skip
def test_a_user_reads_no_spec_no_grant_and_nobody_elses_replies(subject: str) -> None:
    assert not may_subscribe(Role.USER, "alice", subject)
    assert may_subscribe(Role.USER, "alice", "_INBOX.user.alice.x")


@pytest.mark.parametrize(
    "subject",
    ["lease.grant.n1", "lease.revoke.n1", "$KV.scheduler-leader.leader", "rh.scheduler.leader.3",
     "schedule.round.any", "$JS.API.STREAM.CREATE.KV_scheduler-leader"],
)  # fmt: skip
def test_only_the_scheduler_commands_workers_and_holds_the_leader_key(subject: str) -> None:
    allowed = {role for role in Role if may_publish(role, "x", subject)}
    assert allowed == {Role.SCHEDULER, Role.OPERATOR}, subject


@pytest.mark.parametrize("verb", ["DELETE", "PURGE"])
def test_only_an_operator_deletes_or_purges_a_stream(verb: str) -> None:
    for stream in (STREAM, "KV_scheduler-leader", "KV_job-metrics"):
        subject = f"$JS.API.STREAM.{verb}.{stream}"
        allowed = {role for role in Role if may_publish(role, "x", subject)}
        assert allowed == {Role.OPERATOR}, subject


def test_only_admission_and_operators_read_every_spec_through_query_admission() -> None:
    allowed = {role for role in Role if may_publish(role, "x", "query.admission")}
    assert allowed == {Role.ADMISSION, Role.OPERATOR}


def test_namespace_prefixes_subjects_streams_and_buckets() -> None:
    assert may_publish(Role.WORKER, "n1", "prod.job.started.n1", namespace="prod")
    assert not may_publish(Role.WORKER, "n1", "job.started.n1", namespace="prod")
    assert may_publish(Role.SCHEDULER, "s", "$JS.API.STREAM.CREATE.prod_RH_EVENTS", namespace="prod")
    assert may_publish(Role.SCHEDULER, "s", "$KV.prod_scheduler-leader.leader", namespace="prod")
    assert not may_publish(Role.SCHEDULER, "s", "$JS.API.STREAM.CREATE.RH_EVENTS", namespace="prod")


def test_every_identity_subscribes_to_its_own_inbox_only() -> None:
    for role in Role:
        _, subscribe, _ = permissions_for(role, "me")
        assert inbox_prefix(role, "me") + ".>" in subscribe
        if role is not Role.OPERATOR:
            assert not any(covers(p, inbox_prefix(role, "other") + ".x") for p in subscribe), role


def test_users_may_not_answer_requests_services_may() -> None:
    assert not ROLE_PERMISSIONS[Role.USER].allow_responses
    assert all(ROLE_PERMISSIONS[r].allow_responses for r in Role if r is not Role.USER)


def test_bucket_and_stream_names_are_the_services_own() -> None:
    from services.metrics.aggregates import JOB_BUCKET
    from services.metrics.service import NODE_BUCKET
    from services.scheduler.leader import BUCKET

    assert {b.name for b in BUCKETS} == {BUCKET, JOB_BUCKET, NODE_BUCKET}
    assert STREAM == "RH_EVENTS"  # Bus.stream_name's base (services/runtime/bus.py)


@pytest.mark.parametrize("name", ["scheduler", "operator", "a.b", "a*", "", "x" * 65, "-x"])
def test_reserved_or_invalid_identities_are_refused_with_a_reason(name: str) -> None:
    with pytest.raises(ValueError, match=r"reserved|must be"):
        validate_identity(Role.USER, name)
    assert "operator" in RESERVED_NAMES
    assert validate_identity(Role.WORKER, "gpu-node_7") == "gpu-node_7"
