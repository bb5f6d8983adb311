"""Conversions between the typed records and table rows.

Rows headed for the batched writer are tuples in the table's column order (``*_COLUMNS``), which the
writer binds positionally: building and binding a tuple costs a fraction of a keyword dict, and at
tens of thousands of rows per second that difference is most of the writer's CPU time.
"""

from __future__ import annotations

from typing import TypeAlias, cast

import orjson

from schemas.job import JobClass, JobSpec
from services.core.decisions import Plan
from services.core.state import JobStatus
from services.runtime.store.records import (
    JOB_CHANGE_FIELDS,
    JobChanges,
    JobRecord,
    LeaseRecord,
    LeaseState,
    RoundRecord,
)
from services.runtime.store.tables import (
    JobRow,
    LeaseRow,
    RoundRow,
    applied_table,
    jobs_table,
    leases_table,
    rounds_table,
)

RowValue: TypeAlias = str | int | float | None
RowTuple: TypeAlias = tuple[RowValue, ...]
RowDict: TypeAlias = dict[str, RowValue]

JOB_COLUMNS: tuple[str, ...] = tuple(c.name for c in jobs_table.c)
LEASE_COLUMNS: tuple[str, ...] = tuple(c.name for c in leases_table.c)
ROUND_COLUMNS: tuple[str, ...] = tuple(c.name for c in rounds_table.c)
APPLIED_COLUMNS: tuple[str, ...] = tuple(c.name for c in applied_table.c)

# Plain-str values of the enums, looked up by member: cheaper than the ``.value`` descriptor.
_STATUS = {s: s.value for s in JobStatus}
_CLASS = {c: c.value for c in JobClass}
_LEASE_STATE = {s: s.value for s in LeaseState}
# What ``JobSpec.model_dump_json()`` calls, without its per-call keyword handling (half its cost).
_spec_json = JobSpec.__pydantic_serializer__.to_json


def job_to_row(job: JobRecord) -> RowTuple:
    """A job as a ``JOB_COLUMNS`` tuple."""
    spec = job.spec
    return (
        job.job_id,
        _spec_json(spec).decode(),
        _STATUS[job.status],
        spec.user,
        _CLASS[spec.job_class],
        spec.gpus,
        job.submit_time,
        job.admit_time,
        job.first_start_time,
        job.last_start_time,
        job.last_preempt_time,
        job.finish_time,
        job.attained_service,
        job.executed_time,
        job.iterations_done,
        job.preemptions,
        job.checkpoint_path,
        job.checkpoint_iteration,
        job.seq,
        job.queued_since,
        job.longest_wait_s,
        job.version,
        job.reason,
        job.exit_code,
        job.signal,
    )


def job_from_row(row: JobRow) -> JobRecord:
    return JobRecord(
        job_id=row.job_id,
        spec=JobSpec.model_validate_json(row.spec),
        submit_time=row.submit_time,
        status=JobStatus(row.status),
        admit_time=row.admit_time,
        first_start_time=row.first_start_time,
        last_start_time=row.last_start_time,
        last_preempt_time=row.last_preempt_time,
        finish_time=row.finish_time,
        attained_service=row.attained_service,
        executed_time=row.executed_time,
        iterations_done=row.iterations_done,
        preemptions=row.preemptions,
        checkpoint_path=row.checkpoint_path,
        checkpoint_iteration=row.checkpoint_iteration,
        seq=row.seq,
        queued_since=row.queued_since,
        longest_wait_s=row.longest_wait_s,
        version=row.version,
        reason=row.reason,
        exit_code=row.exit_code,
        signal=row.signal,
    )


_PLAIN_TYPES = frozenset({str, int, float, type(None)})


def changes_to_row(job_id: str, changes: JobChanges) -> RowDict:
    """Column values of an update; rejects keys that are not mutable job fields."""
    if not JOB_CHANGE_FIELDS.issuperset(changes):
        unknown = set(changes) - JOB_CHANGE_FIELDS
        raise ValueError(
            f"update of job {job_id!r} names unknown or immutable fields {sorted(unknown)}; "
            f"allowed: {sorted(JOB_CHANGE_FIELDS)}"
        )
    row: RowDict = {}
    for key, value in changes.items():
        # Exact types first (one set lookup per value, on every job update); subclasses after.
        if type(value) in _PLAIN_TYPES:
            row[key] = cast(RowValue, value)
        elif isinstance(value, JobStatus):
            row[key] = value.value
        elif isinstance(value, str | int | float):
            row[key] = value
        else:
            raise TypeError(f"update of job {job_id!r}: {key} must be a number, string or None: {value!r}")
    return row


def lease_to_row(lease: LeaseRecord) -> RowTuple:
    """A lease as a ``LEASE_COLUMNS`` tuple."""
    return (
        lease.lease_id,
        lease.job_id,
        lease.node_id,
        orjson.dumps(list(lease.gpu_indices)).decode(),
        lease.epoch,
        _LEASE_STATE[lease.state],
        lease.granted_at,
        lease.revoke_deadline,
    )


def lease_from_row(row: LeaseRow) -> LeaseRecord:
    indices = orjson.loads(row.gpu_indices)
    if not isinstance(indices, list) or not all(isinstance(i, int) for i in indices):
        raise ValueError(f"lease {row.lease_id!r} has malformed gpu_indices {row.gpu_indices!r}")
    return LeaseRecord(
        lease_id=row.lease_id,
        job_id=row.job_id,
        node_id=row.node_id,
        gpu_indices=tuple(indices),
        epoch=row.epoch,
        granted_at=row.granted_at,
        state=LeaseState(row.state),
        revoke_deadline=row.revoke_deadline,
    )


def plan_to_json(plan: Plan) -> str:
    return orjson.dumps(
        {
            "launch": {job: list(gpus) for job, gpus in plan.launch.items()},
            "suspend": list(plan.suspend),
            "terminate": dict(plan.terminate),
        }
    ).decode()


def plan_from_json(text: str) -> Plan:
    raw = orjson.loads(text)
    if not isinstance(raw, dict):
        raise ValueError(f"round plan is not a JSON object: {text[:80]!r}")
    launch = raw.get("launch", {})
    suspend = raw.get("suspend", [])
    terminate = raw.get("terminate", {})
    if not (isinstance(launch, dict) and isinstance(suspend, list) and isinstance(terminate, dict)):
        raise ValueError(f"round plan has malformed fields: {text[:80]!r}")
    return Plan(
        launch={str(job): tuple(int(g) for g in gpus) for job, gpus in launch.items()},
        suspend=tuple(str(j) for j in suspend),
        terminate={str(job): str(reason) for job, reason in terminate.items()},
    )


def round_to_row(rnd: RoundRecord) -> RowTuple:
    """A round as a ``ROUND_COLUMNS`` tuple."""
    return (rnd.round_number, rnd.epoch, rnd.state_version, rnd.decided_at, plan_to_json(rnd.plan))


def round_from_row(row: RoundRow) -> RoundRecord:
    return RoundRecord(
        round_number=row.round_number,
        epoch=row.epoch,
        state_version=row.state_version,
        decided_at=row.decided_at,
        plan=plan_from_json(row.plan),
    )
