"""Run several simulation cases in parallel processes and collect their results in case order."""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from functools import partial

from roundhouse.sim.case import Case, CaseResult, run_case


def run_cases(
    cases: Sequence[Case], *, workers: int | None = None, progress: bool = False, record_jobs: bool = False
) -> list[CaseResult]:
    """Results of ``cases`` in the same order; one process per case, up to ``workers`` at a time.

    A single case runs in this process (with its progress bar if asked); parallel cases do not draw
    progress bars (their lines would interleave). ``record_jobs`` keeps per-job records.
    """
    if len(cases) == 1:
        return [run_case(cases[0], progress=progress, record_jobs=record_jobs)]
    limit = workers if workers is not None else min(len(cases), os.cpu_count() or 1)
    run = partial(run_case, record_jobs=record_jobs)
    if limit <= 1:
        return [run(case) for case in cases]
    with ProcessPoolExecutor(max_workers=limit) as pool:
        return list(pool.map(run, cases))
