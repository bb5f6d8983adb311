"""Persistent scheduler state: jobs, leases, rounds and applied event ids, on SQLite or PostgreSQL.

``await Store.open(data_dir_or_url)`` gives a store whose writes are batched by one writer task; see
``docs/storage.md``.
"""

from __future__ import annotations

from services.runtime.store.engine import DB_FILENAME, StoreConfig, resolve_target
from services.runtime.store.errors import (
    ConstraintViolationError,
    JobNotFoundError,
    SchemaVersionError,
    StaleWriteError,
    StoreClosedError,
    StoreConfigError,
    StoreError,
)
from services.runtime.store.ops import (
    DeleteLeases,
    InsertJobs,
    PruneAppliedEvents,
    RecordRound,
    SetMeta,
    UpdateJob,
    UpsertLeases,
    WriteOp,
)
from services.runtime.store.records import (
    JobChanges,
    JobRecord,
    LeaseRecord,
    LeaseState,
    RoundRecord,
    WriterStats,
)
from services.runtime.store.repository import Store
from services.runtime.store.tables import SCHEMA_VERSION
from services.runtime.store.term import FencedOutError

__all__ = [
    "DB_FILENAME",
    "SCHEMA_VERSION",
    "ConstraintViolationError",
    "DeleteLeases",
    "FencedOutError",
    "InsertJobs",
    "JobChanges",
    "JobNotFoundError",
    "JobRecord",
    "LeaseRecord",
    "LeaseState",
    "PruneAppliedEvents",
    "RecordRound",
    "RoundRecord",
    "SchemaVersionError",
    "SetMeta",
    "StaleWriteError",
    "Store",
    "StoreClosedError",
    "StoreConfig",
    "StoreConfigError",
    "StoreError",
    "UpdateJob",
    "UpsertLeases",
    "WriteOp",
    "WriterStats",
    "resolve_target",
]
