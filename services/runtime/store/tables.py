"""The relational schema: typed SQLAlchemy 2 declarative models.

Reads go through these models (an ``AsyncSession`` returns typed rows); the batched writer issues
Core bulk statements against the same tables (``JobRow.__table__``) because an ``executemany`` is an
order of magnitude faster than flushing ORM objects. Columns hold plain values only (strings, numbers,
JSON text), so the schema is identical on SQLite and PostgreSQL. Status and lease-state values are
checked by the enums on the way in and out rather than by CHECK constraints, which cost a third of
SQLite's insert throughput.
"""

from __future__ import annotations

from typing import cast

from sqlalchemy import BigInteger, Float, ForeignKey, Index, MetaData, String, Table, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

SCHEMA_VERSION = 3
"""Bumped on any change to the tables below; stored in ``meta`` under ``schema_version``. A database
at an older version is upgraded on open by ``migrations.py`` (one step per version); a newer one is
refused."""

_NAMING = {
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=_NAMING)


class JobRow(Base):
    """One job: its spec (JSON of ``schemas.job.JobSpec``) and everything the scheduler tracks."""

    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_status", "status"),)

    job_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    spec: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    user_name: Mapped[str] = mapped_column(String(64))
    """``spec.user``; named ``user_name`` because ``user`` is reserved in PostgreSQL."""
    job_class: Mapped[str] = mapped_column(String(8))
    gpus: Mapped[int] = mapped_column(BigInteger)
    """GPUs requested (``spec.gpus``); the GPUs held are in ``leases``."""
    submit_time: Mapped[float] = mapped_column(Float)
    admit_time: Mapped[float | None] = mapped_column(Float)
    first_start_time: Mapped[float | None] = mapped_column(Float)
    last_start_time: Mapped[float | None] = mapped_column(Float)
    last_preempt_time: Mapped[float | None] = mapped_column(Float)
    finish_time: Mapped[float | None] = mapped_column(Float)
    attained_service: Mapped[float] = mapped_column(Float)
    executed_time: Mapped[float] = mapped_column(Float)
    iterations_done: Mapped[int] = mapped_column(BigInteger)
    preemptions: Mapped[int] = mapped_column(BigInteger)
    checkpoint_path: Mapped[str | None] = mapped_column(Text)
    checkpoint_iteration: Mapped[int | None] = mapped_column(BigInteger)
    """Iteration the checkpoint at ``checkpoint_path`` holds: what the next run resumes from. Kept
    apart from ``iterations_done``, which a run moves past its last checkpoint. Added in schema
    version 2 (NULL: unknown, e.g. a row written by version 1 for a finished job)."""
    seq: Mapped[int] = mapped_column(BigInteger)
    """Submission sequence number from the scheduler: the last tie-breaker of every ranking."""
    queued_since: Mapped[float | None] = mapped_column(Float)
    longest_wait_s: Mapped[float] = mapped_column(Float)
    version: Mapped[int] = mapped_column(BigInteger)
    """Bumped by every update; optimistic updates name the version they read."""
    reason: Mapped[str | None] = mapped_column(Text)
    """Why it failed, was cancelled or rejected, in words for ``roundhouse jobs`` (a failure's exit
    code or signal and the last lines of its output). Added in schema version 3."""
    exit_code: Mapped[int | None] = mapped_column(BigInteger)
    """A failed job's non-zero exit code (version 3)."""
    signal: Mapped[int | None] = mapped_column(BigInteger)
    """The signal that killed a failed job (version 3)."""


class LeaseRow(Base):
    """A grant of GPUs on one node to one job, fenced by the leader epoch that issued it (Blox §7)."""

    __tablename__ = "leases"
    __table_args__ = (
        Index("ix_leases_node_id", "node_id"),
        Index("ix_leases_job_id", "job_id"),
    )

    lease_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(64), ForeignKey("jobs.job_id", ondelete="CASCADE"))
    node_id: Mapped[str] = mapped_column(String(128))
    gpu_indices: Mapped[str] = mapped_column(Text)
    """JSON list of local GPU indices on ``node_id``."""
    epoch: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16))
    granted_at: Mapped[float] = mapped_column(Float)
    revoke_deadline: Mapped[float | None] = mapped_column(Float)


class RoundRow(Base):
    """One decided scheduling round: what was planned and on which state version."""

    __tablename__ = "rounds"

    round_number: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    epoch: Mapped[int] = mapped_column(BigInteger)
    state_version: Mapped[int] = mapped_column(BigInteger)
    decided_at: Mapped[float] = mapped_column(Float)
    plan: Mapped[str] = mapped_column(Text)
    """JSON of ``services.core.decisions.Plan``."""


class AppliedEventRow(Base):
    """Event ids a consumer has applied: makes JetStream redelivery a no-op (see ``Store.apply_event``).

    The key is (consumer, event_id): several consumers sharing one database each apply the same event.
    """

    __tablename__ = "applied_events"
    # Small rows under a random key: one B-tree (WITHOUT ROWID) instead of a table plus a key index
    # makes claiming events ~10% cheaper on SQLite. PostgreSQL ignores the option.
    __table_args__ = (Index("ix_applied_events_applied_at", "applied_at"), {"sqlite_with_rowid": False})

    consumer: Mapped[str] = mapped_column(String(128), primary_key=True)
    event_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    applied_at: Mapped[float] = mapped_column(Float)


class MetaRow(Base):
    """Small key-value facts about the database itself (``schema_version``)."""

    __tablename__ = "meta"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


jobs_table = cast(Table, JobRow.__table__)
leases_table = cast(Table, LeaseRow.__table__)
rounds_table = cast(Table, RoundRow.__table__)
applied_table = cast(Table, AppliedEventRow.__table__)
meta_table = cast(Table, MetaRow.__table__)
