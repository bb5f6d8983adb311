"""Run several simulation cases in parallel and collect their results in case order.

Local processes by default (a :class:`~concurrent.futures.ProcessPoolExecutor`); with ``ray_address``,
tasks on an existing Ray cluster (:class:`roundhouse.sim.ray_runner.RayExecutor`). Both are
``concurrent.futures`` executors driven by the same code below: the same case function, the same
in-order ``map``; only the dispatch differs, so a case's report does not depend on where it ran.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import Executor
from functools import partial

from roundhouse.sim.case import Case, CaseResult, run_case
from services.runtime.child_pool import process_pool


def _executor(cases: int, workers: int | None, ray_address: str | None) -> Executor | None:
    """Where a sweep's cases run; None: one after another in this process."""
    if ray_address is not None:
        from roundhouse.sim.ray_runner import RayExecutor  # ray (an optional extra) only when asked for

        return RayExecutor(ray_address)
    limit = workers if workers is not None else min(cases, os.cpu_count() or 1)
    # Workers that exit with this process: a sweep killed with SIGKILL leaves none running.
    return process_pool(limit, start_method=None) if limit > 1 else None


def run_cases(
    cases: Sequence[Case],
    *,
    workers: int | None = None,
    progress: bool = False,
    record_jobs: bool = False,
    ray_address: str | None = None,
) -> list[CaseResult]:
    """Results of ``cases`` in the same order; one process per case, up to ``workers`` at a time,
    or one Ray task per case on the cluster at ``ray_address`` (which decides how many run at once).

    A single local case runs in this process (with its progress bar if asked); parallel cases do
    not draw progress bars (their lines would interleave). ``record_jobs`` keeps per-job records.
    """
    if len(cases) == 1 and ray_address is None:
        return [run_case(cases[0], progress=progress, record_jobs=record_jobs)]
    run = partial(run_case, record_jobs=record_jobs)
    executor = _executor(len(cases), workers, ray_address)
    if executor is None:
        return [run(case) for case in cases]
    with executor:
        return list(executor.map(run, cases))
