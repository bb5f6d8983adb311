"""Training progress for policies: the ``job-metrics`` KV bucket folded into the book's ``JobState``s.

The metrics service keeps one aggregate per job (key = job id, JSON: ``iteration``, ``loss``,
``iteration_time_s``, ``loss_history`` as ``[[ts, loss], ...]``; ``services.metrics.aggregates``).
The leader watches the bucket and copies those fields into the job's ``JobState`` (``loss``,
``loss_history``, ``iteration_time_s``, ``iterations_done``), which is what loss-aware policies
(Hermes, loss-based termination, SLAQ) rank by. They are progress hints, kept in memory; the store
gets ``iterations_done`` from the workers' facts at every stop (and, raised to it, at a periodic
checkpoint: ``JobBook.checkpointed``), and only the job's current run moves it here (a run lost
past its checkpoint has that progress taken back by the book). An aggregate that shows the first
iteration of a job's current run also marks when that run resumed (``Lease.progress_at``, read
into ``JobState.resumed_at`` by the snapshot; ``resume.py``).
"""

from __future__ import annotations

import logging
import math

from pydantic import ValidationError

from services.metrics.aggregates import JOB_BUCKET as BUCKET
from services.metrics.aggregates import JOB_BUCKET_TTL_S as BUCKET_TTL_S
from services.metrics.aggregates import JobAggregate
from services.runtime.kv import KVEntry
from services.scheduler.book import JobBook
from services.scheduler.resume import progress_at

log = logging.getLogger("roundhouse.scheduler.metrics")

MAX_HISTORY = 512


def apply_metrics(book: JobBook, entry: KVEntry, now: float) -> bool:
    """Copy one aggregate, seen at ``now``, into its job's state (and the first progress of its
    current run into its lease); returns whether a job of the book was updated."""
    if entry.deleted:
        return False
    job = book.entry(entry.key)
    if job is None:
        return False
    try:
        aggregate = JobAggregate.model_validate_json(entry.value)
    except ValidationError as exc:
        log.warning("job-metrics/%s is not a job aggregate (%s); ignored", entry.key, exc.errors()[0]["msg"])
        return False
    state = job.state
    if aggregate.loss is not None and math.isfinite(aggregate.loss):
        state.loss = aggregate.loss
    step = aggregate.iteration_time_s
    if step is not None and math.isfinite(step) and step > 0:
        state.iteration_time_s = step
    # Pollux's statistical efficiency (services.core.goodput): the latest the job reported.
    if aggregate.grad_noise_scale is not None and math.isfinite(aggregate.grad_noise_scale):
        state.grad_noise_scale = aggregate.grad_noise_scale
    if aggregate.batch_size is not None:
        state.batch_size = aggregate.batch_size
    lease = job.lease
    # Only the job's current run (or a sample naming no lease) moves its progress: a released run's
    # aggregate (the watch replays it after a failover; a lost node may flush late) would bring
    # back the iterations the book took off when that run was lost past its checkpoint.
    if aggregate.lease_id is None or (lease is not None and aggregate.lease_id == lease.lease_id):
        state.iterations_done = max(state.iterations_done, aggregate.iteration)
    state.loss_history = [
        (ts, loss) for ts, loss in aggregate.loss_history[-MAX_HISTORY:] if math.isfinite(ts) and math.isfinite(loss)
    ]
    if lease is not None and lease.progress_at is None:
        launched = state.last_start_time if state.last_start_time is not None else lease.granted_at
        lease.progress_at = progress_at(aggregate, lease, launched, now)
    return True


__all__ = ["BUCKET", "BUCKET_TTL_S", "MAX_HISTORY", "apply_metrics"]
