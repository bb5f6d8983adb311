"""Upgrades of a database written by an older Roundhouse to the tables of ``SCHEMA_VERSION``.

``meta.schema_version`` names the version that last wrote the tables. ``Store.open`` runs the steps
below, one per version, in the transaction that creates missing tables and checks the version (on
PostgreSQL under the startup advisory lock, on SQLite with ``BEGIN IMMEDIATE``), and records the new
version in the same transaction: processes opening an old database together upgrade it once, and a
database is never left half upgraded. The version and the tables change together, so a step knows
exactly what it starts from. A database from a *newer* Roundhouse is still refused
(``SchemaVersionError``), and so is an upgraded one opened by an older Roundhouse.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.state import JobStatus
from services.runtime.store.tables import SCHEMA_VERSION, jobs_table

Step = Callable[[AsyncConnection], Awaitable[None]]


async def _add_checkpoint_iteration(conn: AsyncConnection) -> None:
    """1 -> 2: ``jobs.checkpoint_iteration``, the iteration the stored checkpoint holds.

    Version 1 kept only the checkpoint's path, and the scheduler took the resume iteration from
    ``iterations_done``, which follows a run's progress past its checkpoint. The new column is
    filled for unfinished jobs from ``iterations_done``: in version 1 the store got
    ``iterations_done`` only from the facts that also set the path (a suspension with its
    checkpoint, a late checkpoint), never from progress reports or a lost run, so for a job that
    can still resume the stored value *is* its checkpoint's iteration. Finished jobs never resume;
    their ``iterations_done`` may be past their last checkpoint, so theirs is left unknown (NULL).
    """
    column_type = jobs_table.c.checkpoint_iteration.type.compile(dialect=conn.dialect)
    await conn.execute(text(f"ALTER TABLE jobs ADD COLUMN checkpoint_iteration {column_type}"))
    unfinished = ", ".join(f"'{s.value}'" for s in JobStatus if not s.is_final)
    await conn.execute(
        text(
            "UPDATE jobs SET checkpoint_iteration = iterations_done "
            f"WHERE checkpoint_path IS NOT NULL AND status IN ({unfinished})"
        )
    )


async def _add_failure_details(conn: AsyncConnection) -> None:
    """2 -> 3: ``jobs.reason``, ``jobs.exit_code`` and ``jobs.signal``: why a job failed (or was
    cancelled or rejected), kept once it leaves the scheduler's memory (issue 14). Jobs finished
    before the upgrade have none (NULL): version 2 kept the reason in memory only."""
    for column in (jobs_table.c.reason, jobs_table.c.exit_code, jobs_table.c.signal):
        column_type = column.type.compile(dialect=conn.dialect)
        await conn.execute(text(f"ALTER TABLE jobs ADD COLUMN {column.name} {column_type}"))


STEPS: dict[int, Step] = {1: _add_checkpoint_iteration, 2: _add_failure_details}
"""The step upgrading a database from each version (key) to the next."""


def can_upgrade(found: str) -> bool:
    """Whether a database at version ``found``, older than ``SCHEMA_VERSION``, can be upgraded."""
    if not found.isdecimal() or not 1 <= int(found) < SCHEMA_VERSION:
        return False
    return all(v in STEPS for v in range(int(found), SCHEMA_VERSION))


async def upgrade(conn: AsyncConnection, found: str) -> None:
    """Run every step from version ``found`` up to ``SCHEMA_VERSION`` on ``conn`` (in its transaction).
    The caller checks ``can_upgrade`` first and records the new version."""
    for version in range(int(found), SCHEMA_VERSION):
        await STEPS[version](conn)
