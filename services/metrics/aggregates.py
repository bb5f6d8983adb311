"""Per-job aggregates of the metrics a training job reports: what loss- and speed-aware policies read.

The metrics service folds each job's ``JobMetrics`` samples into one :class:`JobAggregate` and keeps
it in the KV bucket ``job-metrics`` (key = job id, value = this model as JSON), which the scheduler
watches to fill ``JobState.iterations_done``, ``loss``, ``loss_history`` and ``iteration_time_s``.

What is kept, and why:

* ``iteration``: the latest iteration reported (attained iterations; after a resume from an older
  checkpoint it goes back with the job, as its progress did);
* ``iteration_time_s`` and ``throughput``: exponentially weighted moving averages (weight ``alpha``
  on the new sample), smoothing the client's own recent means for runtime estimates (Optimus,
  SRTF's ``estimates.py``);
* ``loss`` and a bounded ``loss_history`` of ``(ts, loss)``, oldest first: the newest samples plus
  those of the job's first ``quantum_s`` window (Hermes measures its milestones against it);
* ``batch_size`` and ``grad_noise_scale``: the latest reported (Pollux's goodput model,
  ``services.core.goodput``, needs the job's current gradient noise scale);
* ``quanta``: per time quantum, the (min, max) loss and the number of losses, which Hermes
  (Son et al. 2021, §3.3, Eq. 2-3) needs: the representative loss of quantum i is
  ``(max + min) / 2`` and its convergence ``C(i) = (loss(i-1) - loss(i)) / |L(i)|``. A quantum
  ends when the job's lease changes (it was preempted and resumed: a new execution cycle) or after
  ``quantum_s`` seconds (Hermes' 10 s default), whichever comes first. The first quantum is always
  kept, with the newest ``max_quanta - 1``.

Only rank 0 (or a sample without a rank) speaks for the job: in data-parallel training every rank
sees the same iteration and loss, and one reporter keeps the averages unbiased. Folding is a pure
function, so replicas of the service merge their samples into the stored value with
compare-and-set (``service.py``) and get the same result in any order of flushes, up to the EWMA's
order sensitivity.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from schemas.metrics import JobMetrics


class Quantum(BaseModel):
    """The losses one job reported during one time quantum (Hermes, Eq. 2)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lease_id: str | None = None
    start_ts: float
    end_ts: float
    min_loss: float
    max_loss: float
    count: int = Field(ge=1)

    @property
    def representative_loss(self) -> float:
        """Hermes Eq. 2: the mid-point of the quantum's losses, robust to noise."""
        return (self.max_loss + self.min_loss) / 2


JOB_BUCKET = "job-metrics"
"""The KV bucket holding one ``JobAggregate`` per job (written by the metrics service, read by the scheduler)."""
JOB_BUCKET_TTL_S = 7 * 24 * 3600.0
"""Default entry TTL: whichever service opens the bucket first creates it with this."""


class JobAggregate(BaseModel):
    """One job's aggregated metrics: the JSON value of its key in the ``job-metrics`` bucket."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str
    iteration: int = Field(default=0, ge=0, description="Latest iteration reported (attained iterations).")
    samples: int = Field(default=0, ge=0, description="Samples folded in.")
    last_ts: float = Field(default=0.0, description="ts of the newest sample folded in.")
    lease_id: str | None = None
    loss: float | None = None
    iteration_time_s: float | None = Field(default=None, description="EWMA of seconds per iteration.")
    throughput: float | None = Field(default=None, description="EWMA of samples per second.")
    batch_size: int | None = Field(default=None, ge=1, description="Latest total batch size reported.")
    grad_noise_scale: float | None = Field(default=None, ge=0, description="Latest gradient noise scale reported.")
    loss_history: list[tuple[float, float]] = Field(default_factory=list, description="(ts, loss), oldest first.")
    quanta: list[Quantum] = Field(default_factory=list, description="Per-quantum losses, oldest first.")


@dataclass(frozen=True, slots=True, kw_only=True)
class FoldOptions:
    alpha: float = 0.3
    """EWMA weight of a new sample (0 < alpha <= 1)."""
    quantum_s: float = 10.0
    """Longest time quantum (Hermes: 10 s)."""
    max_history: int = 256
    """Loss samples kept in ``loss_history`` (a client reports a few per second: two 10 s quanta fit)."""
    max_quanta: int = 16
    """Quanta kept (Hermes compares the last two)."""

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")
        if self.quantum_s <= 0 or self.max_history < 1 or self.max_quanta < 2:
            raise ValueError("quantum_s must be > 0, max_history >= 1 and max_quanta >= 2")


def _ewma(old: float | None, new: float | None, alpha: float) -> float | None:
    if new is None:
        return old
    return new if old is None else old + alpha * (new - old)


def speaks_for_job(sample: JobMetrics) -> bool:
    """Whether a sample counts (rank 0 or unranked; see the module doc)."""
    return sample.rank is None or sample.rank == 0


def fold(aggregate: JobAggregate | None, samples: Iterable[JobMetrics], options: FoldOptions) -> JobAggregate:
    """``aggregate`` (None: a job seen for the first time) with ``samples`` folded in by ``ts``.

    Samples older than the aggregate's newest still count toward the averages and quanta but do not
    overwrite the latest iteration, loss or lease."""
    ordered = sorted((s for s in samples if speaks_for_job(s)), key=lambda s: s.ts)
    if not ordered:
        if aggregate is None:
            raise ValueError("fold() needs an aggregate or at least one rank-0 sample")
        return aggregate
    base = aggregate or JobAggregate(job_id=ordered[0].job_id)
    iteration, last_ts, lease_id, loss = base.iteration, base.last_ts, base.lease_id, base.loss
    batch_size, noise_scale = base.batch_size, base.grad_noise_scale
    iteration_time, throughput = base.iteration_time_s, base.throughput
    history = list(base.loss_history)
    quanta = list(base.quanta)
    for sample in ordered:
        iteration_time = _ewma(iteration_time, sample.iteration_time_s, options.alpha)
        throughput = _ewma(throughput, sample.throughput, options.alpha)
        if sample.ts >= last_ts:
            last_ts, iteration = sample.ts, sample.iteration
            if sample.lease_id is not None:
                lease_id = sample.lease_id
            if sample.loss is not None:
                loss = sample.loss
            if sample.batch_size is not None:
                batch_size = sample.batch_size
            if sample.grad_noise_scale is not None:
                noise_scale = sample.grad_noise_scale
        if sample.loss is not None:
            history.append((sample.ts, sample.loss))
            _add_to_quanta(quanta, sample, options.quantum_s)
    history.sort()
    return JobAggregate(
        job_id=base.job_id,
        iteration=iteration,
        samples=base.samples + len(ordered),
        last_ts=last_ts,
        lease_id=lease_id,
        loss=loss,
        iteration_time_s=iteration_time,
        throughput=throughput,
        batch_size=batch_size,
        grad_noise_scale=noise_scale,
        loss_history=_retain(history, options.quantum_s, options.max_history),
        quanta=quanta if len(quanta) <= options.max_quanta else [quanta[0], *quanta[-(options.max_quanta - 1) :]],
    )


def _retain(history: list[tuple[float, float]], quantum_s: float, limit: int) -> list[tuple[float, float]]:
    """The newest samples, plus (up to a quarter of ``limit``) the samples of the job's first
    ``quantum_s`` window: Hermes measures its loss milestones against that first window (§3.3)."""
    if len(history) <= limit:
        return history
    first_window_end = history[0][0] + quantum_s
    head = [h for h in history[: limit // 4] if h[0] < first_window_end]
    return head + history[len(history) - (limit - len(head)) :]


def _add_to_quanta(quanta: list[Quantum], sample: JobMetrics, quantum_s: float) -> None:
    assert sample.loss is not None
    loss, ts = sample.loss, sample.ts
    current = quanta[-1] if quanta else None
    if current is not None and ts < current.start_ts:
        return  # older than the open quantum: its own quantum is closed; the averages took it
    if (
        current is None
        or (sample.lease_id is not None and sample.lease_id != current.lease_id)
        or ts - current.start_ts >= quantum_s
    ):
        quanta.append(Quantum(lease_id=sample.lease_id, start_ts=ts, end_ts=ts, min_loss=loss, max_loss=loss, count=1))
        return
    quanta[-1] = Quantum(
        lease_id=current.lease_id,
        start_ts=current.start_ts,
        end_ts=max(current.end_ts, ts),
        min_loss=min(current.min_loss, loss),
        max_loss=max(current.max_loss, loss),
        count=current.count + 1,
    )


def convergence(aggregate: JobAggregate) -> float | None:
    """Hermes Eq. 3 for the latest quantum: ``(loss(i-1) - loss(i)) / |L(i)|``; None before two quanta."""
    if len(aggregate.quanta) < 2:
        return None
    previous, current = aggregate.quanta[-2], aggregate.quanta[-1]
    return (previous.representative_loss - current.representative_loss) / current.count
