"""The codec: bytes in, models out, and errors that say what is wrong and where."""

from __future__ import annotations

import json

import pytest

from schemas import codec
from schemas.base import SCHEMA_VERSION
from schemas.codec import MalformedMessageError, UnsupportedSchemaVersionError, decode, decode_reply, encode
from schemas.examples import example
from schemas.jobs import JobArrived
from schemas.leases import LeaseAck, LeaseGrant
from schemas.metrics import JobMetrics
from schemas.subjects import UnknownSubjectError


def _payload(model: type, **changes: object) -> bytes:
    data: dict[str, object] = example(model).model_dump(mode="json")
    data.update(changes)
    return json.dumps(data).encode()


def test_encode_is_compact_json_bytes() -> None:
    event = example(JobArrived)
    data = encode(event)
    assert isinstance(data, bytes)
    assert b'": ' not in data  # no pretty-printing
    assert b"\n" not in data
    assert json.loads(data)["job_id"] == "job-0001"
    assert json.loads(data)["schema_version"] == SCHEMA_VERSION


def test_decode_returns_the_subjects_model() -> None:
    event = example(LeaseGrant)
    decoded = decode("lease.grant.node-02", encode(event))
    assert isinstance(decoded, LeaseGrant)
    assert decoded == event


def test_decode_names_subject_field_and_rule() -> None:
    data = _payload(JobArrived, spec={**example(JobArrived).spec.model_dump(mode="json"), "gpus": 0})
    with pytest.raises(MalformedMessageError) as caught:
        decode("job.arrived.alice", data)
    message = str(caught.value)
    assert "'job.arrived.alice'" in message
    assert "JobArrived" in message
    assert "spec.gpus: greater_than_equal (Input should be greater than or equal to 1)" in message
    assert caught.value.subject == "job.arrived.alice"
    assert caught.value.model == "JobArrived"
    assert [(e.field, e.rule) for e in caught.value.errors] == [("spec.gpus", "greater_than_equal")]
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("data", "rule"),
    [
        pytest.param(b"not json", "json_invalid", id="not-json"),
        pytest.param(b"", "json_invalid", id="empty"),
        pytest.param(b"[1, 2]", "model_type", id="json-array"),
        pytest.param(b'{"job_id": "a"}', "missing", id="missing-fields"),
        pytest.param(b'{"job_id": "a", "iteration": 1, "loss": NaN}', "finite_number", id="nan-literal"),
        pytest.param(b'{"job_id": "a", "iteration": 1, "loss": 1e999}', "finite_number", id="overflow"),
        pytest.param(b'{"job_id": "a", "iteration": 1, "bogus": 1}', "extra_forbidden", id="unknown-field"),
    ],
)
def test_decode_rejects_bad_bytes(data: bytes, rule: str) -> None:
    with pytest.raises(MalformedMessageError, match=rule):
        decode("metrics.job.a", data)


def test_many_errors_are_summarised() -> None:
    data = json.dumps(
        {"extra": {f"bad key {i}": 1 for i in range(20)}, "job_id": "a", "iteration": 1}
    ).encode()
    with pytest.raises(MalformedMessageError, match="and 12 more") as caught:
        decode("metrics.job.a", data)
    assert len(caught.value.errors) == 20


def test_newer_schema_version_is_refused_clearly() -> None:
    data = _payload(JobArrived, schema_version=SCHEMA_VERSION + 1, some_new_field=True)
    with pytest.raises(UnsupportedSchemaVersionError) as caught:
        decode("job.arrived.alice", data)
    message = str(caught.value)
    assert f"version {SCHEMA_VERSION + 1} is newer than the {SCHEMA_VERSION} this process supports" in message
    assert "schema_version: unsupported_schema_version" in message
    assert caught.value.version == SCHEMA_VERSION + 1
    assert isinstance(caught.value, MalformedMessageError)


def test_older_or_garbage_version_is_plain_malformed() -> None:
    for version in (0, "1", True, None):
        with pytest.raises(MalformedMessageError) as caught:
            decode("job.arrived.alice", _payload(JobArrived, schema_version=version))
        assert not isinstance(caught.value, UnsupportedSchemaVersionError)
        assert "schema_version" in str(caught.value)


@pytest.mark.parametrize(
    ("subject", "model"),
    [
        pytest.param("lease.grant.node-99", LeaseGrant, id="grant-to-another-node"),
        pytest.param("metrics.job.other-job", JobMetrics, id="metrics-for-another-job"),
    ],
)
def test_payload_must_match_subject_token(subject: str, model: type) -> None:
    with pytest.raises(MalformedMessageError, match="subject_token_mismatch") as caught:
        decode(subject, encode(example(model)))
    assert caught.value.errors[0].field in ("node_id", "job_id")


def test_unknown_subject_is_a_lookup_error() -> None:
    with pytest.raises(UnknownSubjectError):
        decode("job.teleported", b"{}")


def test_oversized_message_is_refused_before_parsing() -> None:
    data = b" " * (codec.MAX_MESSAGE_BYTES + 1)
    with pytest.raises(MalformedMessageError, match="message_too_large"):
        decode("job.arrived.alice", data)


def test_decode_reply() -> None:
    ack = example(LeaseAck)
    assert decode_reply("lease.grant.node-01", encode(ack)) == ack
    with pytest.raises(MalformedMessageError, match="no_reply_expected"):
        decode_reply("job.arrived.alice", encode(ack))
    with pytest.raises(MalformedMessageError, match="error_required"):
        decode_reply("lease.revoke.n", encode(ack).replace(b'"error":"stale_epoch"', b'"error":null'))


ENVELOPE = b'"event_id": "0b7d3c52-8f0e-4d1e-a2a5-2f3c4d5e6f70", "ts": 1700000000, "schema_version": 1'


def test_decode_accepts_messages_of_other_publishers() -> None:
    """A non-Python publisher may order keys differently, omit defaults and send ints for floats."""
    data = (
        b'{"spec": {"command": ["python", "t.py"], "name": "x", "cpus": 2, "user": "alice"}, "job_id": "j1", '
        + ENVELOPE
        + b"}"
    )
    event = decode("job.arrived.alice", data)
    assert isinstance(event, JobArrived)
    assert event.spec.cpus == 2.0
    assert event.ts == 1_700_000_000.0
    assert event.schema_version == SCHEMA_VERSION


@pytest.mark.parametrize("dropped", ["event_id", "ts", "schema_version"])
def test_decode_requires_the_envelope(dropped: str) -> None:
    """Python fills event_id/ts in when building a model; a message must carry them (dedup, ordering)."""
    data = json.loads(b'{"job_id": "j1", "spec": {"command": ["p"], "name": "x"}, ' + ENVELOPE + b"}")
    del data[dropped]
    with pytest.raises(MalformedMessageError) as caught:
        decode("job.arrived.alice", json.dumps(data).encode())
    assert [(e.field, e.rule) for e in caught.value.errors] == [(dropped, "missing")]
    assert f"{dropped}: missing" in str(caught.value)
