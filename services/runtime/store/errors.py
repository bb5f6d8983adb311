"""Exceptions raised by the store. Each names what went wrong and what the caller can do about it."""

from __future__ import annotations


class StoreError(Exception):
    """Base of every error the store raises on purpose."""


class StoreConfigError(StoreError, ValueError):
    """The store target (URL or data directory) or an option is not usable."""


class SchemaVersionError(StoreError):
    """The database was created by a different (usually newer) version of Roundhouse."""

    def __init__(self, found: str, expected: int, where: str) -> None:
        super().__init__(
            f"database {where} has schema version {found}, this Roundhouse expects {expected}; "
            "point --db at a fresh data directory or upgrade Roundhouse"
        )
        self.found = found
        self.expected = expected


class StoreClosedError(StoreError, RuntimeError):
    """A write was submitted after ``Store.close()`` or after the writer task stopped."""


class StaleWriteError(StoreError):
    """An optimistic update lost: the row's version is not the one the caller read.

    Another writer (typically a scheduler replica from an older or newer leadership term) changed the
    job in between. Re-read the job with ``Store.get_job`` and decide again; never retry blindly.
    """

    def __init__(self, job_id: str, expected_version: int, actual_version: int) -> None:
        super().__init__(
            f"job {job_id!r} is at version {actual_version}, the update expected {expected_version}; "
            "re-read it and retry the decision"
        )
        self.job_id = job_id
        self.expected_version = expected_version
        self.actual_version = actual_version


class JobNotFoundError(StoreError, LookupError):
    """An update named a job that is not in the store."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id!r} is not in the store; add it with add_jobs before updating it")
        self.job_id = job_id


class ConstraintViolationError(StoreError):
    """A write broke a database constraint (duplicate key, unknown job for a lease, bad status).

    Only the request that contained the offending operation fails; other writes batched with it are
    committed. The database's own message is kept as ``__cause__``.
    """
