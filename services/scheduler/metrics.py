"""Training progress for policies: the ``job-metrics`` KV bucket folded into the book's ``JobState``s.

The metrics service keeps one aggregate per job (key = job id, JSON: ``iteration``, ``loss``,
``iteration_time_s``, ``loss_history`` as ``[[ts, loss], ...]``; ``services.metrics.aggregates``).
The leader watches the bucket and copies those fields into the job's ``JobState`` (``loss``,
``loss_history``, ``iteration_time_s``, ``iterations_done``), which is what loss-aware policies
(Hermes, loss-based termination, SLAQ) rank by. They are progress hints, kept in memory; the store
gets ``iterations_done`` from the workers' facts at every stop.
"""

from __future__ import annotations

import json
import logging
import math

from services.runtime.kv import KVEntry
from services.scheduler.book import JobBook

log = logging.getLogger("roundhouse.scheduler.metrics")

BUCKET = "job-metrics"
BUCKET_TTL_S = 7 * 24 * 3600.0
"""The metrics service's default entry TTL: whichever service opens the bucket first creates it."""
MAX_HISTORY = 512


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def apply_metrics(book: JobBook, entry: KVEntry) -> bool:
    """Copy one aggregate into its job's state; returns whether a job of the book was updated."""
    if entry.deleted:
        return False
    job = book.entry(entry.key)
    if job is None:
        return False
    try:
        data = json.loads(entry.value)
    except ValueError:
        log.warning("job-metrics/%s is not JSON; ignored", entry.key)
        return False
    if not isinstance(data, dict):
        return False
    state = job.state
    loss = _number(data.get("loss"))
    if loss is not None:
        state.loss = loss
    step = _number(data.get("iteration_time_s"))
    if step is not None and step > 0:
        state.iteration_time_s = step
    iteration = data.get("iteration")
    if isinstance(iteration, int) and not isinstance(iteration, bool) and iteration > state.iterations_done:
        state.iterations_done = iteration
    history = data.get("loss_history")
    if isinstance(history, list):
        samples: list[tuple[float, float]] = []
        for item in history[-MAX_HISTORY:]:
            if isinstance(item, list | tuple) and len(item) == 2:
                ts, value = _number(item[0]), _number(item[1])
                if ts is not None and value is not None:
                    samples.append((ts, value))
        state.loss_history = samples
    return True
