"""Folding job metrics into aggregates (pure; hand-computed expectations)."""

from __future__ import annotations

import pytest

from schemas.metrics import JobMetrics
from services.metrics.aggregates import FoldOptions, JobAggregate, convergence, fold

OPTIONS = FoldOptions(alpha=0.5, quantum_s=10.0, max_history=3, max_quanta=4)


def sample(ts: float, iteration: int, loss: float | None = None, *, it_s: float | None = None,
           lease: str | None = "l1", rank: int | None = 0) -> JobMetrics:  # fmt: skip
    return JobMetrics(job_id="j", lease_id=lease, rank=rank, iteration=iteration, loss=loss,
                      iteration_time_s=it_s, ts=ts)  # fmt: skip


def test_latest_iteration_and_loss_and_ewma_of_iteration_time() -> None:
    agg = fold(None, [sample(1, 10, 2.0, it_s=1.0), sample(2, 20, 1.5, it_s=2.0)], OPTIONS)
    agg = fold(agg, [sample(3, 30, 1.0, it_s=4.0)], OPTIONS)
    assert (agg.iteration, agg.loss, agg.samples, agg.last_ts) == (30, 1.0, 3, 3)
    # EWMA with alpha 0.5: 1.0, then 1.0 + 0.5 * (2.0 - 1.0) = 1.5, then 1.5 + 0.5 * (4.0 - 1.5) = 2.75
    assert agg.iteration_time_s == pytest.approx(2.75)


def test_loss_history_is_bounded_and_oldest_first() -> None:
    agg = fold(None, [sample(t, t, float(10 - t)) for t in (4, 1, 3, 2)], OPTIONS)
    assert agg.loss_history == [(2, 8.0), (3, 7.0), (4, 6.0)]
    assert agg.loss == 6.0  # the newest sample wins, whatever the arrival order


def test_the_first_quantum_window_survives_the_history_bound() -> None:
    options = FoldOptions(quantum_s=10.0, max_history=8, max_quanta=2)
    agg = fold(None, [sample(t, t, 100.0 - t) for t in range(30)], options)
    # A quarter of the bound (2) holds the first window's oldest samples; the rest the newest.
    assert [ts for ts, _ in agg.loss_history] == [0, 1, 24, 25, 26, 27, 28, 29]
    assert [(q.start_ts, q.count) for q in agg.quanta] == [(0, 10), (20, 10)]  # first and newest


def test_a_quantum_ends_on_a_new_lease_or_after_quantum_s() -> None:
    samples = [sample(0, 1, 5.0), sample(4, 2, 3.0), sample(9, 3, 4.0),  # quantum 1: min 3, max 5
               sample(10, 4, 2.5), sample(12, 5, 2.0),                   # quantum 2 (10 s passed)
               sample(13, 5, 2.2, lease="l2")]  # fmt: skip               # quantum 3 (resumed)
    agg = fold(None, samples, OPTIONS)
    assert [(q.lease_id, q.min_loss, q.max_loss, q.count) for q in agg.quanta] == [
        ("l1", 3.0, 5.0, 3), ("l1", 2.0, 2.5, 2), ("l2", 2.2, 2.2, 1),
    ]  # fmt: skip
    assert agg.quanta[0].representative_loss == 4.0
    # Hermes Eq. 3 on the last quantum: (2.25 - 2.2) / 1
    assert convergence(agg) == pytest.approx(0.05)


def test_only_rank_zero_speaks_for_the_job() -> None:
    agg = fold(None, [sample(1, 5, 1.0), sample(2, 6, 9.0, rank=3)], OPTIONS)
    assert (agg.iteration, agg.loss, agg.samples) == (5, 1.0, 1)
    with pytest.raises(ValueError, match="rank-0"):
        fold(None, [sample(1, 1, 1.0, rank=1)], OPTIONS)


def test_the_aggregate_round_trips_as_kv_json() -> None:
    agg = fold(None, [sample(1, 1, 1.0, it_s=0.5)], OPTIONS)
    assert JobAggregate.model_validate_json(agg.model_dump_json()) == agg


@pytest.mark.parametrize("bad", [{"alpha": 0.0}, {"alpha": 1.5}, {"quantum_s": 0.0}, {"max_quanta": 1}])
def test_fold_options_are_checked(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        FoldOptions(**bad)  # type: ignore[arg-type]
