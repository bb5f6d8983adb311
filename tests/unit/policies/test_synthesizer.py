"""Blox §5.2 automatic scheduler synthesizer: candidate set, cadence and the choice of the best."""

from __future__ import annotations

import math

import pytest

from services.core import ADMISSION, SCHEDULING
from services.scheduler.policies.synthesizer import CANDIDATES, Combination, choose_best, should_synthesize

BY_LABEL = {str(c): c for c in CANDIDATES}


def results() -> dict[Combination, float]:
    """Every candidate at 1000 (the cases override some)."""
    return dict.fromkeys(CANDIDATES, 1000.0)


def test_candidates_are_blox_nine_and_build_from_the_registries() -> None:
    assert [str(c) for c in CANDIDATES] == [
        f"{s}+{a}" for s in ("fifo", "srtf", "las") for a in ("accept-all", "accept-1.2x", "accept-1.4x")
    ]
    for c in CANDIDATES:
        assert SCHEDULING.create(c.scheduling).name == c.scheduling
        assert ADMISSION.create(c.admission, **c.admission_kwargs()) is not None
    assert BY_LABEL["las+accept-1.4x"].admission_kwargs() == {"factor": 1.4}


CASES: list[tuple[str, dict[Combination, float], dict[str, object], str]] = [
    ("lowest average JCT wins", {**results(), BY_LABEL["srtf+accept-1.2x"]: 900.0}, {}, "srtf+accept-1.2x"),
    (
        "a max metric picks the highest",
        {**results(), BY_LABEL["las+accept-all"]: 1200.0},
        {"metric": "utilization"},
        "las+accept-all",
    ),
    ("exact tie: the canonical order decides (fifo+accept-all first)", results(), {}, "fifo+accept-all"),
    (
        "exact tie: the policy running now stays",
        results(),
        {"current": BY_LABEL["las+accept-1.2x"]},
        "las+accept-1.2x",
    ),
    (
        # best 900; 1% of 900 = 9: 905 is tied with it, so the current one stays
        "within rel_tolerance of the best, the current one stays",
        {**results(), BY_LABEL["srtf+accept-all"]: 900.0, BY_LABEL["las+accept-all"]: 905.0},
        {"current": BY_LABEL["las+accept-all"], "rel_tolerance": 0.01},
        "las+accept-all",
    ),
    (
        "outside the tolerance it switches",
        {**results(), BY_LABEL["srtf+accept-all"]: 900.0, BY_LABEL["las+accept-all"]: 910.0},
        {"current": BY_LABEL["las+accept-all"], "rel_tolerance": 0.01},
        "srtf+accept-all",
    ),
    (
        "a custom metric needs its direction",
        {**results(), BY_LABEL["fifo+accept-1.4x"]: 5000.0},
        {"metric": "gpu_hours_saved", "direction": "max"},
        "fifo+accept-1.4x",
    ),
]


@pytest.mark.parametrize(("values", "options", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_choose_best(values: dict[Combination, float], options: dict[str, object], expected: str) -> None:
    snapshot = dict(values)
    assert str(choose_best(values, **options)) == expected  # type: ignore[arg-type]
    assert values == snapshot


@pytest.mark.parametrize(
    ("values", "options", "match"),
    [
        ({c: 1.0 for c in CANDIDATES[:-1]}, {}, "no avg_jct_s result"),
        ({**dict.fromkeys(CANDIDATES, 1.0), CANDIDATES[0]: math.nan}, {}, "not a finite"),
        (dict.fromkeys(CANDIDATES, 1.0), {"metric": "mystery"}, "direction"),
        (dict.fromkeys(CANDIDATES, 1.0), {"rel_tolerance": -1.0}, "rel_tolerance"),
    ],
    ids=["missing candidate", "NaN result", "unknown metric", "negative tolerance"],
)
def test_choose_best_rejects(values: dict[Combination, float], options: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        choose_best(values, **options)  # type: ignore[arg-type]


def test_every_ten_rounds() -> None:
    assert [r for r in range(25) if should_synthesize(r)] == [0, 10, 20]
    assert [r for r in range(7) if should_synthesize(r, every=3)] == [0, 3, 6]
    with pytest.raises(ValueError, match="positive"):
        should_synthesize(1, every=0)
