"""Linear programs for policies, solved by HiGHS through SciPy's ``linprog(method="highs")``.

Policies state an LP as a :class:`LinearProgram` (a sparse ``A_ub x <= b_ub`` in coordinate form,
an objective to minimise, per-variable bounds) and call :func:`solve`. SciPy and NumPy are never
imported with this module: the services and the CLI import every policy module at start-up (the
registries' decorators), and SciPy costs ~0.3 s to import. :func:`solve` imports them on first use,
and a policy that will solve calls :func:`load_solver` when it is built, so the import (which reads
the clock and opens files) happens before its first decision, never inside one: only a process that
runs an LP policy pays for it.

Pure and deterministic: HiGHS' dual simplex on the same input returns the same vertex (the solver
is single-threaded here; its random seed is HiGHS' fixed default).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


class LpError(RuntimeError):
    """The solver did not return an optimum (infeasible, unbounded, or a numerical failure)."""


@dataclass(slots=True)
class LinearProgram:
    """``minimise c.x`` subject to ``A_ub x <= b_ub`` and ``lower <= x <= upper``.

    Build it row by row with :meth:`add_row`; ``A_ub`` is kept as coordinate triplets so a problem
    of 500 jobs x 3 types (1,500 variables, ~1,000 rows, ~4,500 non-zeros) costs no dense matrix.
    """

    n_vars: int
    c: list[float] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    upper: list[float | None] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    cols: list[int] = field(default_factory=list)
    vals: list[float] = field(default_factory=list)
    b_ub: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.c:
            self.c = [0.0] * self.n_vars
        if not self.lower:
            self.lower = [0.0] * self.n_vars
        if not self.upper:
            self.upper = [None] * self.n_vars

    def add_row(self, coefficients: Sequence[tuple[int, float]], bound: float) -> None:
        """Add ``sum(coef * x[var] for var, coef in coefficients) <= bound``."""
        row = len(self.b_ub)
        for var, coef in coefficients:
            if coef != 0.0:
                self.rows.append(row)
                self.cols.append(var)
                self.vals.append(coef)
        self.b_ub.append(bound)


@dataclass(frozen=True, slots=True)
class LpSolution:
    objective: float
    x: tuple[float, ...]


def load_solver() -> None:
    """Import SciPy's LP solver now (see the module docstring: policies call it from ``__init__``)."""
    import scipy.optimize
    import scipy.sparse  # noqa: F401


def solve(problem: LinearProgram) -> LpSolution:
    """Solve ``problem`` with HiGHS; raise :class:`LpError` unless it is optimal."""
    import numpy as np
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    a_ub = None
    b_ub = None
    if problem.b_ub:
        a_ub = coo_matrix(
            (np.asarray(problem.vals, dtype=float), (np.asarray(problem.rows), np.asarray(problem.cols))),
            shape=(len(problem.b_ub), problem.n_vars),
        ).tocsr()
        b_ub = np.asarray(problem.b_ub, dtype=float)
    bounds = list(zip(problem.lower, problem.upper, strict=True))
    result = linprog(np.asarray(problem.c, dtype=float), A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
    if result.status != 0 or result.x is None:
        raise LpError(f"LP of {problem.n_vars} variables and {len(problem.b_ub)} rows: {result.message}")
    return LpSolution(objective=float(result.fun), x=tuple(float(v) for v in result.x))
