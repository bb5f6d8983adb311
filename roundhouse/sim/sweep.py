"""Run several simulation cases in parallel processes and collect their results in case order."""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

from roundhouse.sim.case import Case, CaseResult, run_case


def run_cases(cases: Sequence[Case], *, workers: int | None = None, progress: bool = False) -> list[CaseResult]:
    """Results of ``cases`` in the same order; one process per case, up to ``workers`` at a time.

    A single case runs in this process (with its progress bar if asked); parallel cases do not draw
    progress bars (their lines would interleave).
    """
    if len(cases) == 1:
        return [run_case(cases[0], progress=progress)]
    limit = workers if workers is not None else min(len(cases), os.cpu_count() or 1)
    if limit <= 1:
        return [run_case(case) for case in cases]
    with ProcessPoolExecutor(max_workers=limit) as pool:
        return list(pool.map(run_case, cases))
