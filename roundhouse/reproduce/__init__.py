"""``roundhouse reproduce``: the seed papers' headline experiments, run with Roundhouse's policies.

Every module in this package except ``base`` registers one or more reproductions when imported;
:func:`load_all` imports them (discovered, so adding a paper means adding a module).
"""

from __future__ import annotations

import pkgutil
from importlib import import_module

from roundhouse.reproduce.base import (
    REPRODUCTIONS,
    Metric,
    Options,
    Reproduction,
    ReproductionError,
    ReproResult,
    relative_change_pct,
    reproduction,
)

_NOT_PAPERS = frozenset({"base"})


def load_all() -> dict[str, Reproduction]:
    """Import every reproduction module; returns the registry, by name, sorted."""
    for module in pkgutil.iter_modules(__path__):
        if module.name not in _NOT_PAPERS and not module.name.startswith("_"):
            import_module(f"{__name__}.{module.name}")
    return dict(sorted(REPRODUCTIONS.items()))


def get(name: str) -> Reproduction:
    known = load_all()
    try:
        return known[name]
    except KeyError:
        raise ReproductionError(f"unknown reproduction {name!r}; valid: {', '.join(known) or '(none)'}") from None


__all__ = [
    "REPRODUCTIONS",
    "Metric",
    "Options",
    "ReproResult",
    "Reproduction",
    "ReproductionError",
    "get",
    "load_all",
    "relative_change_pct",
    "reproduction",
]
