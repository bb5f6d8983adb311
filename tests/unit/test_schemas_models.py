"""Round-trip tests for every wire model, plus the behaviour models add beyond their fields."""

from __future__ import annotations

import uuid

import pytest
from pydantic import ValidationError

import schemas
from schemas import codec
from schemas.base import Event, WireModel
from schemas.examples import EXAMPLE_TS, example, examples, examples_by_model
from schemas.jobs import JobArrived
from schemas.leases import LeaseGrant, LeaseRevoke
from schemas.nodes import NodeHeartbeat, NodeRegister
from schemas.rounds import PlacementPlan
from schemas.subjects import SUBJECTS, subject_for

EXAMPLES = examples_by_model()
CASES = [
    pytest.param(model, instance, id=f"{model.__name__}-{i}")
    for model, built in EXAMPLES.items()
    for i, instance in enumerate(built)
]
SUBJECT_MODELS = {s.model for s in SUBJECTS}


def _all_models() -> set[type[WireModel]]:
    """Every model reachable from the subject table, including nested ones (JobSpec, WorldInfo...)."""
    found: set[type[WireModel]] = set()
    todo: list[type[WireModel]] = [s.model for s in SUBJECTS]
    todo += [s.reply_model for s in SUBJECTS if s.reply_model is not None]
    while todo:
        model = todo.pop()
        if model in found:
            continue
        found.add(model)
        for field in model.model_fields.values():
            for arg in _walk_types(field.annotation):
                if isinstance(arg, type) and issubclass(arg, WireModel):
                    todo.append(arg)
    return found


def _walk_types(annotation: object) -> list[object]:
    out = [annotation]
    for arg in getattr(annotation, "__args__", ()):
        out += _walk_types(arg)
    return out


def test_every_model_has_full_and_minimal_examples() -> None:
    reachable = _all_models()
    missing = sorted(m.__name__ for m in reachable if m not in EXAMPLES)
    assert not missing, f"models without examples (so without round-trip tests): {missing}"
    assert len(reachable) >= 20
    for model, built in EXAMPLES.items():
        assert len(built) >= 2, model.__name__
        full, minimal = built[0], built[-1]
        covered = set().union(*(e.model_fields_set for e in built))
        # Together the examples set every field, so each one is round-tripped at least once.
        assert set(model.model_fields) - {"schema_version"} == covered, model.__name__
        assert minimal.model_fields_set <= full.model_fields_set, model.__name__


@pytest.mark.parametrize(("model", "instance"), CASES)
def test_round_trip_json(model: type[WireModel], instance: WireModel) -> None:
    data = codec.encode(instance)
    again = codec.decode_as(model, data)
    assert again == instance
    assert codec.encode(again) == data
    # The codec's bytes are exactly what model_dump_json writes (the documented wire format).
    assert data == instance.model_dump_json().encode()
    # Python-mode dumps round-trip as well (what the store or the simulator may keep).
    assert model.model_validate(instance.model_dump()) == instance


@pytest.mark.parametrize(("model", "instance"), [c for c in CASES if c.values[0] in SUBJECT_MODELS])
def test_round_trip_through_subject(model: type[Event], instance: Event) -> None:
    subject = subject_for(instance)
    decoded = codec.decode(subject, codec.encode(instance))
    assert type(decoded) is model
    assert decoded == instance
    assert decoded.event_id == instance.event_id


def test_event_defaults_are_fresh_and_current() -> None:
    a = example(JobArrived)
    b, c = JobArrived(job_id="a", spec=a.spec), JobArrived(job_id="a", spec=a.spec)
    assert b.event_id != c.event_id
    assert isinstance(b.event_id, uuid.UUID)
    assert b.ts > EXAMPLE_TS
    assert b.schema_version == schemas.SCHEMA_VERSION


def test_models_are_frozen() -> None:
    grant = example(LeaseGrant)
    with pytest.raises(ValidationError, match="frozen"):
        grant.epoch = 99  # type: ignore[misc]


def test_revoke_grace_deadline_is_on_issuer_clock() -> None:
    revoke = example(LeaseRevoke)
    assert revoke.grace_deadline == pytest.approx(revoke.ts + revoke.grace_s)


def test_grant_coordinator() -> None:
    worker_side, minimal = examples(LeaseGrant)
    assert worker_side.world is not None
    assert worker_side.world.node_rank == 1
    assert not worker_side.is_coordinator
    assert minimal.is_coordinator  # single-node grants are their own coordinator


def test_plan_helpers() -> None:
    plan, *_, empty = examples(PlacementPlan)
    assert plan.gpu_count("job-0001") == 16
    assert plan.gpu_count("job-0003") == 1
    assert plan.gpu_count("absent") == 0
    assert not plan.is_empty
    assert empty.is_empty


def test_heartbeat_lists_jobs_and_leases() -> None:
    beat = example(NodeHeartbeat)
    assert beat.job_ids == ("job-0001",)
    assert beat.lease_ids == ("lease-0001-2",)


def test_register_counts_gpus() -> None:
    full, minimal = examples(NodeRegister)
    assert full.gpu_count == 2
    assert minimal.gpu_count == 0
