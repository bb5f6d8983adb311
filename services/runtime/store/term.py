"""Leadership terms in the store: an epoch floor that never goes back, and a fence on every write.

The scheduler's epoch (the fencing token of every lease command) must grow from term to term even if
all NATS data is lost and the election's KV revisions start again at 1: workers remember the highest
epoch they saw and refuse anything older. So the store keeps the last term's epoch (``meta`` key
:data:`TERM_KEY`): a new leader **claims** ``max(candidate, stored + 1)`` and writes it back in one
transaction (:func:`claim_term`).

The same row fences writes: once a store is fenced to an epoch, every write transaction first runs
``UPDATE meta SET value = value WHERE key = TERM_KEY AND value = <epoch>`` (:func:`check_fence`), which
locks the row (PostgreSQL) or runs under the database write lock (SQLite) and matches no row once a
newer term has claimed: the whole transaction then fails with :class:`FencedOutError` and nothing of
it is written. A deposed leader that wakes up (paused, partitioned) can therefore change nothing,
whatever it still holds in memory; Kueue gets the same from resourceVersion, Chubby from sequencers.
"""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.runtime.store.engine import WRITER_OPTIONS
from services.runtime.store.errors import StaleWriteError, StoreError
from services.runtime.store.tables import meta_table

TERM_KEY = "scheduler.term"


class FencedOutError(StaleWriteError):
    """A write from a term that is no longer the store's: a newer leader has claimed a higher epoch.

    A ``StaleWriteError``: whoever handles a lost optimistic update as "another leader moved on"
    (the scheduler steps down) handles this the same way."""

    def __init__(self, epoch: int) -> None:
        StoreError.__init__(
            self,
            f"this replica's term (epoch {epoch}) is over: a newer leader claimed the store; "
            "nothing of this write was committed",
        )
        self.job_id = ""
        self.expected_version = epoch
        self.actual_version = -1
        self.epoch = epoch


async def claim_term(engine: AsyncEngine, candidate: int) -> int:
    """Claim the next term: ``max(candidate, stored epoch + 1)``, written before it is returned."""
    async with engine.connect() as conn:
        await conn.execution_options(**WRITER_OPTIONS)
        async with conn.begin():
            stored = (
                await conn.execute(
                    select(meta_table.c.value).where(meta_table.c.key == TERM_KEY).with_for_update()
                )
            ).scalar_one_or_none()
            floor = int(stored) if stored is not None else 0
            epoch = max(candidate, floor + 1)
            if stored is None:
                await conn.execute(meta_table.insert().values(key=TERM_KEY, value=str(epoch)))
            else:
                await conn.execute(
                    update(meta_table).where(meta_table.c.key == TERM_KEY).values(value=str(epoch))
                )
    return epoch


async def check_fence(conn: AsyncConnection, epoch: int) -> None:
    """Inside a write transaction: fail it unless ``epoch`` is still the store's term."""
    result = await conn.execute(
        update(meta_table)
        .where(meta_table.c.key == TERM_KEY, meta_table.c.value == str(epoch))
        .values(value=meta_table.c.value)
    )
    if result.rowcount != 1:
        raise FencedOutError(epoch)
