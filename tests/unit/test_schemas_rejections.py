"""Rejection tests: each bad input is refused, and the error names the field and the rule.

Every case starts from a model's full example (``schemas.examples``), breaks one thing, and checks
pydantic's error (``loc`` = the field, ``type`` = the rule) both for Python input and for JSON bytes
through the codec, whose message must name the field and the rule as well.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from schemas import codec
from schemas.base import WireModel
from schemas.examples import example
from schemas.job import JobSpec
from schemas.jobs import (
    JobArrived,
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobHeld,
    JobStarted,
    JobSuspended,
)
from schemas.leases import LeaseAck, LeaseGrant, LeaseRevoke
from schemas.metrics import JobMetrics, NodeMetrics
from schemas.nodes import NodeHeartbeat, NodeRegister
from schemas.rounds import PlacementPlan, ScheduleRound

DELETE = object()


def case(  # noqa: PLR0917 - a table row reads best positionally
    case_id: str,
    model: type[WireModel],
    path: tuple[str | int, ...],
    value: Any,
    loc: tuple[str | int, ...],
    rule: str,
) -> Any:
    return pytest.param(model, path, value, loc, rule, id=case_id)


CASES = [
    # --- JobSpec: argv, never a shell string ---------------------------------------------------
    case("command-shell-string", JobSpec, ("command",), "python train.py", ("command",), "list_type"),
    case("command-empty", JobSpec, ("command",), [], ("command",), "too_short"),
    case("command-empty-program", JobSpec, ("command",), ["", "x"], ("command",), "empty_program"),
    case("command-nul-byte", JobSpec, ("command",), ["python", "a\x00b"], ("command", 1), "nul_byte"),
    case(
        "command-arg-too-long",
        JobSpec,
        ("command",),
        ["python", "x" * 4097],
        ("command", 1),
        "string_too_long",
    ),
    case("command-too-many-args", JobSpec, ("command",), ["x"] * 257, ("command",), "too_long"),
    case("command-too-large", JobSpec, ("command",), ["x" * 4000] * 20, ("command",), "command_too_large"),
    case("command-not-strings", JobSpec, ("command",), ["python", 3], ("command", 1), "string_type"),
    # --- JobSpec: sizes and ranges ---------------------------------------------------------------
    case("name-with-space", JobSpec, ("name",), "my job", ("name",), "string_pattern_mismatch"),
    case("name-too-long", JobSpec, ("name",), "a" * 129, ("name",), "string_too_long"),
    case("name-missing", JobSpec, ("name",), DELETE, ("name",), "missing"),
    case("user-with-slash", JobSpec, ("user",), "a/b", ("user",), "string_pattern_mismatch"),
    case("gpus-zero", JobSpec, ("gpus",), 0, ("gpus",), "greater_than_equal"),
    case("gpus-too-many", JobSpec, ("gpus",), 1025, ("gpus",), "less_than_equal"),
    case("gpus-fractional", JobSpec, ("gpus",), 1.5, ("gpus",), "int_from_float"),
    case("gpus-word", JobSpec, ("gpus",), "two", ("gpus",), "int_parsing"),
    case("max-gpus-below-gpus", JobSpec, ("max_gpus",), 4, ("max_gpus",), "max_gpus_below_gpus"),
    case("cpus-zero", JobSpec, ("cpus",), 0, ("cpus",), "greater_than"),
    case("memory-infinite", JobSpec, ("memory_gb",), float("inf"), ("memory_gb",), "finite_number"),
    case("loss-target-nan", JobSpec, ("loss_target",), float("nan"), ("loss_target",), "finite_number"),
    case("job-class-unknown", JobSpec, ("job_class",), "URGENT", ("job_class",), "enum"),
    case("priority-too-high", JobSpec, ("priority",), 1001, ("priority",), "less_than_equal"),
    case("grace-negative", JobSpec, ("grace_period_s",), -1, ("grace_period_s",), "greater_than_equal"),
    case("grace-over-a-day", JobSpec, ("grace_period_s",), 86_401, ("grace_period_s",), "less_than_equal"),
    case(
        "max-preemptions-negative",
        JobSpec,
        ("max_preemptions",),
        -1,
        ("max_preemptions",),
        "greater_than_equal",
    ),
    case("model-hint-newline", JobSpec, ("model",), "res\nnet", ("model",), "string_pattern_mismatch"),
    case(
        "expected-iterations-zero",
        JobSpec,
        ("expected_iterations",),
        0,
        ("expected_iterations",),
        "greater_than_equal",
    ),
    case(
        "env-key-invalid",
        JobSpec,
        ("env",),
        {"1BAD": "x"},
        ("env", "1BAD", "[key]"),
        "string_pattern_mismatch",
    ),
    case("env-key-reserved", JobSpec, ("env",), {"ROUNDHOUSE_LEASE": "x"}, ("env",), "reserved_env_key"),
    case("env-value-nul", JobSpec, ("env",), {"A": "\x00"}, ("env", "A"), "nul_byte"),
    case("env-too-many", JobSpec, ("env",), {f"K{i}": "v" for i in range(129)}, ("env",), "too_long"),
    case(
        "env-too-large",
        JobSpec,
        ("env",),
        {f"K{i}": "v" * 4000 for i in range(20)},
        ("env",),
        "env_too_large",
    ),
    case("workdir-relative", JobSpec, ("workdir",), "src/", ("workdir",), "string_pattern_mismatch"),
    case("unknown-field", JobSpec, ("shell",), "bash -c", ("shell",), "extra_forbidden"),
    # --- Event envelope ----------------------------------------------------------------------------
    case("event-id-not-uuid", JobArrived, ("event_id",), "42", ("event_id",), "uuid_parsing"),
    case("ts-negative", JobArrived, ("ts",), -1.0, ("ts",), "greater_than_equal"),
    case("ts-in-milliseconds", JobArrived, ("ts",), 1.7e12, ("ts",), "less_than_equal"),
    case("schema-version-zero", JobArrived, ("schema_version",), 0, ("schema_version",), "literal_error"),
    case("schema-version-bool", JobArrived, ("schema_version",), True, ("schema_version",), "int_type"),
    case("schema-version-string", JobArrived, ("schema_version",), "1", ("schema_version",), "literal_error"),
    case("nested-spec-field", JobArrived, ("spec", "gpus"), 0, ("spec", "gpus"), "greater_than_equal"),
    # --- ids must be NATS subject tokens -----------------------------------------------------------
    case("job-id-with-dot", JobArrived, ("job_id",), "a.b", ("job_id",), "string_pattern_mismatch"),
    case("job-id-with-star", JobArrived, ("job_id",), "a*", ("job_id",), "string_pattern_mismatch"),
    case("job-id-with-gt", JobArrived, ("job_id",), ">", ("job_id",), "string_pattern_mismatch"),
    case("job-id-with-space", JobArrived, ("job_id",), "a b", ("job_id",), "string_pattern_mismatch"),
    case("job-id-empty", JobArrived, ("job_id",), "", ("job_id",), "string_too_short"),
    case("job-id-too-long", JobArrived, ("job_id",), "a" * 65, ("job_id",), "string_too_long"),
    case("node-id-with-dot", NodeHeartbeat, ("node_id",), "n.1", ("node_id",), "string_pattern_mismatch"),
    case("lease-id-with-dot", LeaseRevoke, ("lease_id",), "l.1", ("lease_id",), "string_pattern_mismatch"),
    # --- job lifecycle -----------------------------------------------------------------------------
    case("held-reason-empty", JobHeld, ("reason",), "", ("reason",), "string_too_short"),
    case("held-reason-missing", JobHeld, ("reason",), DELETE, ("reason",), "missing"),
    case("held-reason-too-long", JobHeld, ("reason",), "x" * 1025, ("reason",), "string_too_long"),
    case("started-gpus-repeat", JobStarted, ("gpus",), [0, 1, 0], ("gpus",), "duplicate_items"),
    case("started-gpus-empty", JobStarted, ("gpus",), [], ("gpus",), "too_short"),
    case("started-gpu-index-too-big", JobStarted, ("gpus",), [64], ("gpus", 0), "less_than"),
    case("started-epoch-missing", JobStarted, ("epoch",), DELETE, ("epoch",), "missing"),
    case(
        "suspended-checkpoint-ahead",
        JobSuspended,
        ("checkpoint_iteration",),
        10**6,
        ("checkpoint_iteration",),
        "checkpoint_after_iteration",
    ),
    case(
        "suspended-checkpoint-without-path",
        JobSuspended,
        ("checkpoint_path",),
        None,
        ("checkpoint_iteration",),
        "checkpoint_path_required",
    ),
    # A periodic checkpoint names its file and the iteration it holds: both are required.
    case("checkpointed-path-missing", JobCheckpointed, ("checkpoint_path",), DELETE, ("checkpoint_path",), "missing"),
    case("checkpointed-path-empty", JobCheckpointed, ("checkpoint_path",), "", ("checkpoint_path",),
         "string_too_short"),
    case("checkpointed-path-nul", JobCheckpointed, ("checkpoint_path",), "a\x00b", ("checkpoint_path",),
         "string_pattern_mismatch"),
    case("checkpointed-iteration-missing", JobCheckpointed, ("iteration",), DELETE, ("iteration",), "missing"),
    case("checkpointed-iteration-negative", JobCheckpointed, ("iteration",), -1, ("iteration",),
         "greater_than_equal"),
    case("checkpointed-epoch-missing", JobCheckpointed, ("epoch",), DELETE, ("epoch",), "missing"),
    case("checkpointed-lease-missing", JobCheckpointed, ("lease_id",), DELETE, ("lease_id",), "missing"),
    case("suspended-reason-unknown", JobSuspended, ("reason",), "bored", ("reason",), "enum"),
    case("completed-exit-code-256", JobCompleted, ("exit_code",), 256, ("exit_code",), "less_than_equal"),
    case("failed-exit-code-reason-needs-code", JobFailed, ("exit_code",), None, (), "exit_code_required"),
    case("failed-signal-reason-needs-signal", JobFailed, ("reason",), "signal", (), "signal_required"),
    case("failed-message-too-long", JobFailed, ("message",), "x" * 4097, ("message",), "string_too_long"),
    # --- leases --------------------------------------------------------------------------------------
    case("grant-epoch-negative", LeaseGrant, ("epoch",), -1, ("epoch",), "greater_than_equal"),
    case("grant-epoch-missing", LeaseGrant, ("epoch",), DELETE, ("epoch",), "missing"),
    case(
        "grant-spec-shell-string",
        LeaseGrant,
        ("spec", "command"),
        "rm -rf /",
        ("spec", "command"),
        "list_type",
    ),
    case(
        "grant-node-rank-too-big",
        LeaseGrant,
        ("world", "node_rank"),
        2,
        ("world", "node_rank"),
        "node_rank_out_of_range",
    ),
    case(
        "grant-rank-offset-too-big",
        LeaseGrant,
        ("world", "rank_offset"),
        16,
        ("world", "rank_offset"),
        "rank_offset_out_of_range",
    ),
    case("grant-world-too-small", LeaseGrant, ("world", "world_size"), 12, (), "world_too_small"),
    case(
        "grant-coordinator-mismatch",
        LeaseGrant,
        ("world", "coordinator_node"),
        "node-02",
        (),
        "coordinator_mismatch",
    ),
    case(
        "grant-privileged-port",
        LeaseGrant,
        ("world", "coordinator_port"),
        80,
        ("world", "coordinator_port"),
        "greater_than_equal",
    ),
    case(
        "grant-bad-host",
        LeaseGrant,
        ("world", "coordinator_host"),
        "bad host!",
        ("world", "coordinator_host"),
        "invalid_host",
    ),
    case("revoke-grace-over-a-day", LeaseRevoke, ("grace_s",), 86_401.0, ("grace_s",), "less_than_equal"),
    case("revoke-reason-unknown", LeaseRevoke, ("reason",), "whim", ("reason",), "enum"),
    case("ack-refused-without-error", LeaseAck, ("error",), None, (), "error_required"),
    case("ack-accepted-with-error", LeaseAck, ("accepted",), True, ("error",), "error_on_accepted"),
    # --- nodes ---------------------------------------------------------------------------------------
    case("register-gpu-index-repeat", NodeRegister, ("gpus", 1, "index"), 0, ("gpus",), "duplicate_items"),
    case(
        "register-gpu-memory-zero",
        NodeRegister,
        ("gpus", 0, "memory_mib"),
        0,
        ("gpus", 0, "memory_mib"),
        "greater_than_equal",
    ),
    case(
        "register-pci-bus-id",
        NodeRegister,
        ("gpus", 0, "pci_bus_id"),
        "slot 3",
        ("gpus", 0, "pci_bus_id"),
        "string_pattern_mismatch",
    ),
    case("register-links-wrong-shape", NodeRegister, ("links",), [["self"]], ("links",), "matrix_shape"),
    case(
        "register-links-asymmetric",
        NodeRegister,
        ("links",),
        [["self", "nvlink"], ["sys", "self"]],
        ("links",),
        "matrix_not_symmetric",
    ),
    case(
        "register-link-unknown",
        NodeRegister,
        ("links",),
        [["self", "fast"], ["fast", "self"]],
        ("links", 0, 1),
        "enum",
    ),
    case(
        "register-bandwidth-negative",
        NodeRegister,
        ("link_bandwidth_gbps",),
        [[0, -1], [-1, 0]],
        ("link_bandwidth_gbps", 0, 1),
        "greater_than_equal",
    ),
    case("register-hostname", NodeRegister, ("hostname",), "-bad-.example", ("hostname",), "invalid_host"),
    case(
        "register-too-many-labels",
        NodeRegister,
        ("labels",),
        {f"k{i}": "v" for i in range(65)},
        ("labels",),
        "too_long",
    ),
    case(
        "register-label-key",
        NodeRegister,
        ("labels",),
        {"bad key": "v"},
        ("labels", "bad key", "[key]"),
        "string_pattern_mismatch",
    ),
    case("register-incarnation", NodeRegister, ("incarnation",), "x", ("incarnation",), "uuid_parsing"),
    case(
        "heartbeat-lease-repeat",
        NodeHeartbeat,
        ("leases",),
        [
            {"lease_id": "l", "job_id": "a", "epoch": 1, "gpus": [0]},
            {"lease_id": "l", "job_id": "b", "epoch": 1, "gpus": [1]},
        ],
        ("leases",),
        "duplicate_items",
    ),
    case(
        "heartbeat-lease-state",
        NodeHeartbeat,
        ("leases", 0, "state"),
        "zombie",
        ("leases", 0, "state"),
        "enum",
    ),
    # --- rounds --------------------------------------------------------------------------------------
    case("round-ranked-repeat", ScheduleRound, ("ranked",), ["a", "b", "a"], ("ranked",), "duplicate_items"),
    case(
        "round-ranked-too-many",
        ScheduleRound,
        ("ranked",),
        [f"j{i}" for i in range(50_001)],
        ("ranked",),
        "too_long",
    ),
    case(
        "round-target-not-ranked",
        ScheduleRound,
        ("gpu_targets",),
        {"ghost": 2},
        ("gpu_targets",),
        "target_not_ranked",
    ),
    case(
        "round-target-zero",
        ScheduleRound,
        ("gpu_targets",),
        {"job-0001": 0},
        ("gpu_targets", "job-0001"),
        "greater_than_equal",
    ),
    case(
        "round-terminate-empty-reason",
        ScheduleRound,
        ("terminate",),
        {"job-0001": ""},
        ("terminate", "job-0001"),
        "string_too_short",
    ),
    case("round-trigger-unknown", ScheduleRound, ("trigger",), "boredom", ("trigger",), "enum"),
    case(
        "plan-terminated-launched",
        PlacementPlan,
        ("terminate",),
        {"job-0001": "converged"},
        ("terminate",),
        "terminated_job_launched",
    ),
    case(
        "plan-empty-assignment",
        PlacementPlan,
        ("launch", "job-0001"),
        [],
        ("launch", "job-0001"),
        "too_short",
    ),
    case(
        "plan-node-repeat",
        PlacementPlan,
        ("launch", "job-0001", 1, "node_id"),
        "node-01",
        ("launch", "job-0001"),
        "duplicate_items",
    ),
    case(
        "plan-gpu-repeat",
        PlacementPlan,
        ("launch", "job-0003", 0, "gpus"),
        [1, 1],
        ("launch", "job-0003", 0, "gpus"),
        "duplicate_items",
    ),
    case("plan-suspend-repeat", PlacementPlan, ("suspend",), ["a", "a"], ("suspend",), "duplicate_items"),
    # --- metrics -------------------------------------------------------------------------------------
    case("metrics-loss-nan", JobMetrics, ("loss",), float("nan"), ("loss",), "finite_number"),
    case("metrics-loss-infinite", JobMetrics, ("loss",), float("-inf"), ("loss",), "finite_number"),
    case(
        "metrics-iteration-time-zero",
        JobMetrics,
        ("iteration_time_s",),
        0,
        ("iteration_time_s",),
        "greater_than",
    ),
    case(
        "metrics-throughput-negative", JobMetrics, ("throughput",), -1, ("throughput",), "greater_than_equal"
    ),
    case(
        "metrics-extra-too-many",
        JobMetrics,
        ("extra",),
        {f"m{i}": 1.0 for i in range(33)},
        ("extra",),
        "too_long",
    ),
    case(
        "metrics-extra-key",
        JobMetrics,
        ("extra",),
        {"top 1": 1.0},
        ("extra", "top 1", "[key]"),
        "string_pattern_mismatch",
    ),
    case(
        "metrics-extra-not-number", JobMetrics, ("extra",), {"lr": "high"}, ("extra", "lr"), "float_parsing"
    ),
    case(
        "node-metrics-utilization",
        NodeMetrics,
        ("gpus", 0, "utilization_pct"),
        101,
        ("gpus", 0, "utilization_pct"),
        "less_than_equal",
    ),
    case("node-metrics-gpu-repeat", NodeMetrics, ("gpus", 1, "index"), 0, ("gpus",), "duplicate_items"),
]


def _broken(model: type[WireModel], path: tuple[str | int, ...], value: Any) -> Any:
    data: Any = example(model).model_dump(mode="json")
    target = data
    for step in path[:-1]:
        target = target[step]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


def _field(loc: tuple[str | int, ...]) -> str:
    return ".".join(map(str, loc)) if loc else "(message)"


@pytest.mark.parametrize(("model", "path", "value", "loc", "rule"), CASES)
def test_rejected_with_field_and_rule(
    model: type[WireModel], path: tuple[str | int, ...], value: Any, loc: tuple[str | int, ...], rule: str
) -> None:
    data = _broken(model, path, value)
    with pytest.raises(ValidationError) as caught:
        model.model_validate(data)
    found = {(e["loc"], e["type"]) for e in caught.value.errors()}
    assert (loc, rule) in found
    # pydantic's own text names both as well: the field path, then "[type=<rule>".
    text = str(caught.value)
    assert f"[type={rule}" in text
    if loc:
        assert _field(loc) in text

    with pytest.raises(codec.MalformedMessageError) as wire:
        codec.decode_as(model, json.dumps(data).encode(), subject="test.subject")
    assert f"{_field(loc)}: {rule} (" in str(wire.value)
    assert "test.subject" in str(wire.value)
    assert any(e.field == _field(loc) and e.rule == rule for e in wire.value.errors)


def test_every_case_id_is_unique() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


def test_every_rule_named_in_code_has_a_case() -> None:
    """Each custom rule (PydanticCustomError type) raised in schemas/ is exercised above."""
    import pathlib
    import re

    import schemas

    root = pathlib.Path(schemas.__file__).parent
    raised = set()
    for source in root.glob("*.py"):
        raised |= set(re.findall(r'PydanticCustomError\(\s*"([a-z_]+)"', source.read_text()))
    tested = {c.values[4] for c in CASES}
    assert len(raised) >= 20
    assert raised - tested == set()
