"""Where the store lives and how connections are set up: SQLite in a data directory, or PostgreSQL.

SQLite connections get, on every connect: WAL journal (readers never block the writer),
``synchronous=NORMAL`` (in WAL mode a commit survives a process crash; a power loss may drop the last
few commits, which JetStream redelivers since consumers ack only after commit), enforced foreign keys,
and a busy timeout. pysqlite's implicit transaction handling is turned off and SQLAlchemy emits BEGIN
itself, so transactions and SAVEPOINTs behave as documented (SQLAlchemy docs, "pysqlite: Serializable
isolation / Savepoints / Transactional DDL"); the writer begins with ``BEGIN IMMEDIATE`` so it takes
the write lock up front and waits on ``busy_timeout`` instead of failing on a lock upgrade.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry

from services.runtime.store.errors import StoreConfigError

DB_FILENAME = "roundhouse.db"
"""The SQLite file created inside a data directory."""

BEGIN_OPTION = "roundhouse_sqlite_begin"
"""Execution option naming the statement that opens a SQLite transaction on that connection."""
WRITER_OPTIONS: dict[str, str] = {BEGIN_OPTION: "BEGIN IMMEDIATE"}

_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreConfig:
    """Tuning of the store. The defaults suit one scheduler on one host."""

    max_batch_rows: int = 10_000
    """The writer commits once it has gathered this many rows (a request is never split)."""
    linger_s: float = 0.001
    """After draining the queue, wait this long once for more requests before committing (0: never)."""
    sqlite_synchronous: str = "NORMAL"
    sqlite_wal_autocheckpoint: int = 10_000
    """WAL pages (4 KiB) between automatic checkpoints. SQLite's default (1000) checkpoints, and
    fsyncs, every other large batch; 10,000 (~40 MiB of WAL) keeps checkpoints off the write path."""
    busy_timeout_s: float = 5.0
    """SQLite: how long a connection waits for another process's write lock before failing."""
    postgres_idle_in_transaction_s: float = 10.0
    """PostgreSQL: the server ends a session that sits this long inside a transaction without
    sending anything (``idle_in_transaction_session_timeout``; 0: never). A scheduler frozen
    (SIGSTOP, a VM pause) in the middle of a write would otherwise hold its row locks, the term row's
    among them, for as long as it is frozen, and the replica that took over could write nothing:
    every write of the store is a short batch, so a live writer never comes near this bound. The
    frozen one's transaction is rolled back, and its commit fails when it wakes up (docs/failure.md)."""
    pool_size: int = 5
    echo: bool = False

    def __post_init__(self) -> None:
        if self.max_batch_rows < 1:
            raise StoreConfigError(f"max_batch_rows must be >= 1, got {self.max_batch_rows}")
        if self.linger_s < 0:
            raise StoreConfigError(f"linger_s must be >= 0, got {self.linger_s}")
        if self.sqlite_synchronous.upper() not in _SYNCHRONOUS:
            raise StoreConfigError(f"sqlite_synchronous must be one of {_SYNCHRONOUS}, got {self.sqlite_synchronous!r}")
        if self.sqlite_wal_autocheckpoint < 0:
            raise StoreConfigError(f"sqlite_wal_autocheckpoint must be >= 0, got {self.sqlite_wal_autocheckpoint}")
        if self.busy_timeout_s < 0:
            raise StoreConfigError(f"busy_timeout_s must be >= 0, got {self.busy_timeout_s}")
        if self.postgres_idle_in_transaction_s < 0:
            raise StoreConfigError(
                f"postgres_idle_in_transaction_s must be >= 0, got {self.postgres_idle_in_transaction_s}"
            )


def resolve_target(target: str | os.PathLike[str]) -> URL:
    """Turn ``--db`` into an async SQLAlchemy URL.

    A path (anything without ``://``) is a data directory, created if missing, holding
    ``roundhouse.db``. ``sqlite:///file`` and ``postgresql://`` / ``postgres://`` URLs get the async
    driver (aiosqlite, asyncpg) when they name none.
    """
    text = os.fspath(target)
    if "://" not in text:
        if not text:
            raise StoreConfigError("empty store target; pass a data directory or a database URL")
        directory = Path(text).expanduser()
        if directory.exists() and not directory.is_dir():
            raise StoreConfigError(f"store target {directory} exists and is not a directory; pass a data directory")
        directory.mkdir(parents=True, exist_ok=True)
        return URL.create("sqlite+aiosqlite", database=str(directory.resolve() / DB_FILENAME))
    try:
        url = make_url(text)
    except ArgumentError as exc:
        raise StoreConfigError(f"cannot parse database URL: {exc}") from exc
    # Split the name by hand: asking SQLAlchemy loads the dialect, and "postgres" has none.
    backend, _, driver = url.drivername.partition("+")
    if backend == "sqlite":
        if not url.database or url.database == ":memory:" or url.database.startswith("file::memory:"):
            raise StoreConfigError(
                "in-memory SQLite cannot be shared by the writer and readers; pass a data directory instead"
            )
        return url.set(drivername="sqlite+aiosqlite")
    if backend in ("postgresql", "postgres"):
        return url if driver == "asyncpg" and backend == "postgresql" else url.set(drivername="postgresql+asyncpg")
    raise StoreConfigError(
        f"unsupported database {backend!r}; use a data directory (SQLite) or postgresql+asyncpg://user@host/db"
    )


def create_engine(url: URL, config: StoreConfig, *, schema: str | None) -> AsyncEngine:
    """An async engine for ``url``; ``schema`` (PostgreSQL only) becomes the connections' search_path."""
    if url.get_backend_name() == "sqlite":
        if schema is not None:
            raise StoreConfigError("schema= applies to PostgreSQL only; SQLite has one namespace per file")
        # LIFO: the writer, which checks a connection out per batch, keeps getting the one whose
        # page cache is warm.
        engine = create_async_engine(url, echo=config.echo, pool_size=config.pool_size, pool_use_lifo=True)
        _install_sqlite_hooks(engine, config)
        return engine
    settings = {"idle_in_transaction_session_timeout": str(round(config.postgres_idle_in_transaction_s * 1000))}
    if schema is not None:
        settings["search_path"] = schema
    connect_args: dict[str, object] = {"server_settings": settings}
    return create_async_engine(
        url, echo=config.echo, pool_size=config.pool_size, pool_pre_ping=True, connect_args=connect_args
    )


def _install_sqlite_hooks(engine: AsyncEngine, config: StoreConfig) -> None:
    pragmas = (
        "PRAGMA journal_mode=WAL",
        f"PRAGMA synchronous={config.sqlite_synchronous.upper()}",
        "PRAGMA foreign_keys=ON",
        f"PRAGMA busy_timeout={int(config.busy_timeout_s * 1000)}",
        f"PRAGMA wal_autocheckpoint={config.sqlite_wal_autocheckpoint}",
    )

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
        # Hand transaction control to SQLAlchemy (see the module docstring).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            for pragma in pragmas:
                cursor.execute(pragma)
        finally:
            cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(connection: Connection) -> None:
        connection.exec_driver_sql(str(connection.get_execution_options().get(BEGIN_OPTION, "BEGIN")))
