"""``query.jobs``: the leader's view of jobs, for ``roundhouse jobs``.

Unfinished jobs come from the leader's book (current to the last applied event, running jobs'
attained service to ``now``); finished ones, when asked for, from the store. Results are sorted by
job id and paged with ``after`` / ``limit``.
"""

from __future__ import annotations

from collections.abc import Iterable

from schemas.control import JobsQuery, JobsReply, JobView
from services.core.state import JobState
from services.runtime.store import JobRecord
from services.scheduler.book import JobBook, JobEntry


def _view_from_entry(entry: JobEntry, now: float) -> JobView:
    state = entry.state
    lease = entry.lease
    service = state.attained_service
    placement: dict[str, list[int]] = {}
    if lease is not None:
        placement = {node: list(gpus) for node, gpus in lease.parts}
        start = state.last_start_time if state.last_start_time is not None else now
        service = entry.service0 + lease.gpu_count * max(0.0, now - start)
    return _view(state, service, placement, entry.reason)


def _view(state: JobState, service: float, placement: dict[str, list[int]], reason: str | None) -> JobView:
    spec = state.spec
    return JobView(
        job_id=state.job_id,
        name=spec.name,
        user=spec.user,
        job_class=spec.job_class,
        status=state.status.value,
        gpus=spec.gpus,
        placement=placement,
        submit_time=state.submit_time,
        first_start_time=state.first_start_time,
        finish_time=state.finish_time,
        attained_service_s=service,
        iterations_done=state.iterations_done,
        preemptions=state.preemptions,
        reason=reason,
    )


def answer(query: JobsQuery, book: JobBook, finished: Iterable[JobRecord], now: float, epoch: int) -> JobsReply:
    """Build the reply to ``query`` from the book and the finished jobs read from the store."""
    wanted_ids = set(query.job_ids)
    statuses = set(query.statuses)
    views: dict[str, JobView] = {}

    def keep(job_id: str, status: str, user: str) -> bool:
        if wanted_ids and job_id not in wanted_ids:
            return False
        if statuses and status not in statuses:
            return False
        if query.user is not None and user != query.user:
            return False
        return query.after is None or job_id > query.after

    for job_id, entry in book.jobs.items():
        state = entry.state
        if keep(job_id, state.status.value, state.spec.user):
            views[job_id] = _view_from_entry(entry, now)
    for record in finished:
        if record.job_id in views or not keep(record.job_id, record.status.value, record.spec.user):
            continue
        state = record.to_state()
        views[record.job_id] = _view(state, record.attained_service, {}, None)
    ordered = [views[j] for j in sorted(views)]
    truncated = len(ordered) > query.limit
    return JobsReply(jobs=ordered[: query.limit], truncated=truncated, epoch=epoch)
