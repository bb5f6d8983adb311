"""The gradient noise scale: the estimator on a toy model, and its way from the training client to the
policy's ``JobState`` (channel slot, ``JobMetrics``, the job's aggregate, the scheduler's copy)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from roundhouse.train import GradientNoiseScale, Job, JobEnv, squared_norm
from schemas.job import JobSpec
from schemas.metrics import JobMetrics
from services.metrics.aggregates import FoldOptions, JobAggregate, fold
from services.runtime.kv import KVEntry
from services.scheduler.book import JobBook
from services.scheduler.metrics import apply_metrics
from services.worker.channel import Channel


def _toy_problem(torch: Any, seed: int = 0) -> tuple[Any, Any, Any, float]:
    """Linear least squares at a point away from the optimum: data, labels, weights, and the exact
    noise scale ``tr(S) / |G|^2`` of its per-example gradients over the whole data set."""
    gen = torch.Generator().manual_seed(seed)
    n, d = 4096, 8
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    truth = torch.randn(d, generator=gen, dtype=torch.float64)
    y = x @ truth + 0.5 * torch.randn(n, generator=gen, dtype=torch.float64)
    w = truth + 0.3 * torch.randn(d, generator=gen, dtype=torch.float64)
    per_example = 2 * (x @ w - y).unsqueeze(1) * x  # d/dw of (x.w - y)^2, one row per example
    mean = per_example.mean(0)
    exact = float(((per_example - mean) ** 2).sum(1).mean() / mean.pow(2).sum())
    return x, y, w, exact


def _grad_sqr(x: Any, y: Any, w: Any, rows: Any) -> float:
    weights = w.clone().requires_grad_(True)
    loss = ((x[rows] @ weights - y[rows]) ** 2).mean()
    loss.backward()
    return squared_norm([weights.grad])


def test_the_estimate_matches_the_exact_noise_scale_of_a_toy_model() -> None:
    torch = pytest.importorskip("torch", reason="the toy model needs torch (the train extra)")
    x, y, w, exact = _toy_problem(torch)
    gen = torch.Generator().manual_seed(1)
    small, big = 16, 128
    estimator = GradientNoiseScale()  # AdaptDL's smoothing, 0.999
    for _ in range(600):
        rows = torch.randint(0, 4096, (big,), generator=gen)
        # Data-parallel training has both for free: one replica's micro-batch and the all-reduced batch.
        estimator.update(_grad_sqr(x, y, w, rows[:small]), small, _grad_sqr(x, y, w, rows), big)
    assert estimator.updates == 600
    assert estimator.noise_scale is not None
    assert exact > 1.0  # a noisy problem: the check below is not trivially met
    assert estimator.noise_scale == pytest.approx(exact, rel=0.2)


def test_no_estimate_until_both_halves_are_positive() -> None:
    estimator = GradientNoiseScale()
    assert estimator.noise_scale is None
    estimator.update(small_sqr=1.0, small_batch=1, big_sqr=2.0, big_batch=2)  # variance estimate < 0
    assert estimator.var is not None
    assert estimator.var < 0
    assert estimator.noise_scale is None
    with pytest.raises(ValueError, match="small_batch < big_batch"):
        estimator.update(1.0, 8, 1.0, 8)
    with pytest.raises(ValueError, match="finite"):
        estimator.update(math.nan, 1, 1.0, 2)


def test_the_client_reports_it_through_the_channel(tmp_path: Path) -> None:
    agent = Channel.create(tmp_path / "c.chan")
    job = Job(JobEnv(job_id="j1", channel=agent.path, checkpoint_dir=tmp_path), channel=Channel.open(agent.path))
    assert agent.grad_noise_scale is None  # 0 in a fresh channel: unknown
    job.report(loss=1.0, batch_size=256, grad_noise_scale=1234.5)
    assert (agent.grad_noise_scale, agent.samples_per_iteration) == (1234.5, 256)
    job.report(grad_noise_scale=math.inf)  # not finite: the last good value stays
    assert agent.grad_noise_scale == 1234.5


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, 1e13], ids=["negative", "nan", "inf", "huge"])
def test_job_metrics_refuses_a_wild_noise_scale(bad: float) -> None:
    with pytest.raises(ValidationError):
        JobMetrics(job_id="j", iteration=1, grad_noise_scale=bad)


def test_the_aggregate_keeps_the_latest_noise_scale_and_batch_size() -> None:
    def sample(ts: float, noise: float | None, batch: int | None) -> JobMetrics:
        return JobMetrics(job_id="j", rank=0, iteration=int(ts), ts=ts, grad_noise_scale=noise, batch_size=batch)

    agg = fold(None, [sample(2, 300.0, 512), sample(1, 100.0, 256)], FoldOptions())
    assert (agg.grad_noise_scale, agg.batch_size) == (300.0, 512)  # the newest, whatever the order
    agg = fold(agg, [sample(3, None, None)], FoldOptions())
    assert (agg.grad_noise_scale, agg.batch_size) == (300.0, 512)  # a sample without them keeps them


def test_the_scheduler_copies_them_into_the_policys_job_state() -> None:
    book = JobBook()
    book.arrived("j", JobSpec(name="j", command=["x"]), submit_time=0.0).commit()  # type: ignore[union-attr]
    state = book.entry("j").state  # type: ignore[union-attr]
    assert (state.grad_noise_scale, state.batch_size) == (None, None)
    aggregate = JobAggregate(job_id="j", iteration=5, samples=1, grad_noise_scale=812.5, batch_size=384)
    assert apply_metrics(book, KVEntry("j", aggregate.model_dump_json().encode(), revision=1), 0.0)
    assert (state.grad_noise_scale, state.batch_size) == (812.5, 384)
    silent = JobAggregate(job_id="j", iteration=6, samples=2)  # a later aggregate without them keeps them
    apply_metrics(book, KVEntry("j", silent.model_dump_json().encode(), revision=2), 1.0)
    assert (state.grad_noise_scale, state.batch_size) == (812.5, 384)
