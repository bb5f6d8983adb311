"""The subject registry: matching, the durable set, and the helpers that build concrete subjects."""

from __future__ import annotations

import pytest

from schemas import subjects
from schemas.base import Event
from schemas.control import AdmissionReply, JobsReply
from schemas.examples import example
from schemas.jobs import JobAccepted, JobArrived, JobCancel, JobCheckpointed, JobFailed
from schemas.leases import LeaseAck, LeaseGrant, LeaseRevoke
from schemas.logs import LogData, LogsReply
from schemas.metrics import JobMetrics, NodeMetrics
from schemas.nodes import NodeHeartbeat, NodeRegister
from schemas.operations import DrainReply, NodesReply, StatusReply
from schemas.rounds import PlacementPlan, ScheduleRound
from schemas.subjects import (
    SUBJECTS,
    InvalidSubjectTokenError,
    UnknownSubjectError,
    durable_patterns,
    model_for,
    spec_for,
    subject_for,
)

DESIGN_SUBJECTS = {
    # DESIGN.md, "Events and subjects": every row of the table has an entry.
    # Issue 13: what a user or a worker says ends in its identity (user name, node id), which the
    # broker vouches for; verdicts, rounds and plans come from one service role each.
    "job.arrived.*", "job.accepted", "job.held", "job.rejected", "job.cancel.*",
    "placement.plan", "lease.grant.*", "lease.revoke.*", "job.started.*", "job.suspended.*", "job.completed.*",
    "job.failed.*", "node.register.*", "node.heartbeat.*", "metrics.job.*", "metrics.node.*",
}  # fmt: skip


CONTROL_SUBJECTS = {
    # Beyond DESIGN.md's table: two-phase stop propagation and job queries (schemas/control.py),
    # periodic checkpoints of a running job (schemas/jobs.py).
    "lease.stop.*", "query.jobs.*", "job.checkpointed.*",
    # What admission starts from (issue 12: the store is the source of truth for recovery).
    "query.admission",
    # DESIGN.md's schedule.round, per placement instance: schedule.round.<instance> carries a delta
    # against the snapshot that instance acknowledged, schedule.round.any a full one (queue group).
    "schedule.round.*",
    # A job's output (issue 14, item 1): the user asks the scheduler, the scheduler asks the nodes.
    "query.logs.*", "logs.read.*",
    # The operator's view (issue 15, item 3): nodes, status, drains.
    "query.nodes.*", "query.status.*", "operator.drain.*",
    # Issue 18: a leader whose store does not know a live node asks it to register again.
    "node.reregister.*",
}  # fmt: skip


def test_table_covers_design() -> None:
    assert {s.pattern for s in SUBJECTS} == DESIGN_SUBJECTS | CONTROL_SUBJECTS


def test_each_model_has_one_subject() -> None:
    models = [s.model for s in SUBJECTS]
    assert len(models) == len(set(models))


@pytest.mark.parametrize(
    ("subject", "model"),
    [
        pytest.param("job.arrived.alice", JobArrived, id="submission-of-a-user"),
        pytest.param("job.cancel.alice", JobCancel, id="intent-of-a-user"),
        pytest.param("job.failed.node-01", JobFailed, id="fact-of-a-node"),
        pytest.param("job.checkpointed.node-01", JobCheckpointed, id="checkpoint-fact-of-a-node"),
        pytest.param("job.accepted", JobAccepted, id="exact"),
        pytest.param("schedule.round.any", ScheduleRound, id="round"),
        pytest.param("placement.plan", PlacementPlan, id="plan"),
        pytest.param("node.register.n1", NodeRegister, id="register"),
        pytest.param("node.heartbeat.n1", NodeHeartbeat, id="heartbeat"),
        pytest.param("lease.grant.node-01", LeaseGrant, id="grant-token"),
        pytest.param("lease.revoke.gpu_box_7", LeaseRevoke, id="revoke-token"),
        pytest.param("metrics.job.0f3a9c", JobMetrics, id="job-metrics-token"),
        pytest.param("metrics.node.n1", NodeMetrics, id="node-metrics-token"),
        pytest.param("metrics.job.*", JobMetrics, id="the-pattern-itself"),
    ],
)
def test_spec_for_matches(subject: str, model: type) -> None:
    assert spec_for(subject).model is model
    assert model_for(subject) is model


@pytest.mark.parametrize(
    "subject",
    [
        pytest.param("job.unknown", id="unknown-leaf"),
        pytest.param("job", id="prefix-only"),
        pytest.param("job.arrived.alice.extra", id="extra-token"),
        pytest.param("job.arrived", id="missing-identity"),
        pytest.param("lease.grant", id="missing-token"),
        pytest.param("lease.grant.a.b", id="two-tokens-for-star"),
        pytest.param("lease.grant.", id="empty-token"),
        pytest.param("lease.grant.>", id="wildcard-gt"),
        pytest.param("metrics.*.x", id="wildcard-star"),
        pytest.param("job.>", id="broad-wildcard"),
        pytest.param("", id="empty"),
        pytest.param("JOB.ARRIVED", id="case-sensitive"),
    ],
)
def test_spec_for_rejects(subject: str) -> None:
    with pytest.raises(UnknownSubjectError, match="no schema for subject") as caught:
        spec_for(subject)
    assert isinstance(caught.value, LookupError)
    assert "job.arrived" in str(caught.value)  # the message lists what would have matched


def test_gt_wildcard_matches_one_or_more_tokens() -> None:
    assert subjects._matches(("a", ">"), ["a", "b"])
    assert subjects._matches(("a", ">"), ["a", "b", "c"])
    assert not subjects._matches(("a", ">"), ["a"])
    assert subjects._matches(("a", "*", "c"), ["a", "x", "c"])
    assert not subjects._matches(("a", "*", "c"), ["a", "x", "d"])


def test_durable_patterns_are_the_lifecycle_subjects() -> None:
    durable = durable_patterns()
    assert set(durable) == {
        "job.arrived.*", "job.accepted", "job.held", "job.rejected", "job.cancel.*",
        "job.started.*", "job.checkpointed.*", "job.suspended.*", "job.completed.*", "job.failed.*",
        "node.register.*",
    }  # fmt: skip
    # Heartbeats, metrics, leases (request-reply) and rounds stay on core NATS.
    for core in ("node.heartbeat.n", "metrics.job.x", "metrics.node.x", "lease.grant.x", "schedule.round.any"):
        assert not spec_for(core).durable
    # A JetStream stream's subjects must not overlap: at most one trailing '*', distinct prefixes.
    assert all(">" not in p and "*" not in p.removesuffix(".*") for p in durable)
    prefixes = [p.removesuffix(".*") for p in durable]
    assert len(prefixes) == len(set(prefixes))


def test_request_reply_subjects() -> None:
    with_reply = {s.pattern: s.reply_model for s in SUBJECTS if s.reply_model is not None}
    assert with_reply == {
        "lease.grant.*": LeaseAck,
        "lease.revoke.*": LeaseAck,
        "lease.stop.*": LeaseAck,
        "query.jobs.*": JobsReply,
        "query.admission": AdmissionReply,
        "query.logs.*": LogsReply,
        "logs.read.*": LogData,
        "query.nodes.*": NodesReply,
        "query.status.*": StatusReply,
        "operator.drain.*": DrainReply,
    }


def test_every_wildcard_names_its_token_field() -> None:
    for spec in SUBJECTS:
        if "*" in spec.pattern:
            assert spec.token_field is not None, spec.pattern
            head, _, rest = spec.token_field.partition(".")
            assert head in spec.model.model_fields, spec.pattern
            if rest:  # a nested field: job.arrived.<spec.user>
                annotation = spec.model.model_fields[head].annotation
                assert annotation is not None, spec.pattern
                assert rest in annotation.model_fields, spec.pattern
        else:
            assert spec.token_field is None, spec.pattern
        assert spec.description
        assert "->" in spec.direction


def test_helpers_build_concrete_subjects() -> None:
    assert subjects.lease_grant("node-01") == "lease.grant.node-01"
    assert subjects.lease_revoke("node-01") == "lease.revoke.node-01"
    assert subjects.lease_stop("node-02") == "lease.stop.node-02"
    assert subjects.QUERY_JOBS == "query.jobs.*"
    assert subjects.job_metrics("job_7") == "metrics.job.job_7"
    assert subjects.node_metrics("n1") == "metrics.node.n1"
    assert subjects.JOB_ARRIVED == "job.arrived.*"
    for built in (subjects.lease_grant("a"), subjects.job_metrics("b")):
        spec_for(built)  # every helper's output resolves


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param("", id="empty"),
        pytest.param("a.b", id="dot"),
        pytest.param("a*", id="star"),
        pytest.param(">", id="gt"),
        pytest.param("a b", id="space"),
        pytest.param("a\tb", id="tab"),
        pytest.param("x" * 65, id="too-long"),
        pytest.param("-lead", id="leading-dash"),
    ],
)
def test_helpers_reject_invalid_tokens(bad: str) -> None:
    with pytest.raises(InvalidSubjectTokenError, match="cannot be a subject token"):
        subjects.lease_grant(bad)
    with pytest.raises(ValueError, match=r"no '\.', '\*', '>' or spaces"):
        subjects.job_metrics(bad)


@pytest.mark.parametrize(
    ("event", "subject"),
    [
        pytest.param(example(JobArrived), "job.arrived.alice", id="submission-ends-in-its-user"),
        pytest.param(example(JobAccepted), "job.accepted", id="plain"),
        pytest.param(example(JobCancel), "job.cancel.alice", id="cancel-ends-in-who-asked"),
        pytest.param(example(JobFailed), "job.failed.node-02", id="fact-ends-in-its-node"),
        pytest.param(example(NodeHeartbeat), "node.heartbeat.node-01", id="heartbeat-ends-in-its-node"),
        pytest.param(example(LeaseGrant), "lease.grant.node-02", id="grant-to-its-node"),
        pytest.param(example(LeaseRevoke), "lease.revoke.node-01", id="revoke-to-coordinator"),
        pytest.param(example(JobMetrics), "metrics.job.job-0001", id="job-metrics"),
        pytest.param(example(NodeMetrics), "metrics.node.node-01", id="node-metrics"),
    ],
)
def test_subject_for_event(event: Event, subject: str) -> None:
    assert subject_for(event) == subject
    assert spec_for(subject).model is type(event)


def test_subject_for_model_without_subject() -> None:
    with pytest.raises(UnknownSubjectError, match="LeaseAck is not carried by any subject"):
        subject_for(example(LeaseAck))
