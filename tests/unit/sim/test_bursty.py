"""Bursty workloads (Blox §5.1 daily spike, §5.2 bursts) merged into a base stream."""

from __future__ import annotations

from itertools import islice

import pytest

from roundhouse.sim.bursty import DAY_S, HOUR_S, SpikedWorkload, Spikes, daily_spike, with_spikes
from roundhouse.sim.synthetic import PhillySynthetic
from services.core.simulation.workload import TraceJob, WorkloadError, checked_in_order


def _base(num_jobs: int = 800, seed: int = 3) -> PhillySynthetic:
    return PhillySynthetic(jobs_per_hour=8.0, seed=seed, num_jobs=num_jobs)


def _in_window(job: TraceJob, spikes: Spikes) -> bool:
    phase = job.arrival_s % spikes.period_s
    return spikes.offset_s <= phase < spikes.offset_s + spikes.window_s


def test_daily_spike_adds_sixteen_jobs_per_day_in_one_hour_and_reindexes() -> None:
    base = list(_base())
    spikes = daily_spike()
    merged = list(checked_in_order(with_spikes(base, spikes, seed=3)))  # indexes 0.. and arrivals sorted
    days = int(base[-1].arrival_s // DAY_S)
    windows_passed = sum(1 for d in range(days + 1) if d * DAY_S + spikes.offset_s + HOUR_S <= base[-1].arrival_s)
    assert windows_passed >= 3
    extra = len(merged) - len(base)
    assert windows_passed * 16 <= extra <= (windows_passed + 1) * 16
    # every extra job sits in a spike window: window counts exceed the base's by exactly the extras
    assert sum(_in_window(j, spikes) for j in merged) - sum(_in_window(j, spikes) for j in base) == extra
    assert merged[-1].arrival_s == base[-1].arrival_s  # the merged stream ends with the base stream


def test_base_jobs_are_unchanged_apart_from_their_index() -> None:
    base = list(_base(400))
    merged = list(with_spikes(base, daily_spike(), seed=3))
    base_keys = [(j.arrival_s, j.gpus, j.duration_s, j.model) for j in base]
    # base jobs come first on equal arrivals, so they appear in order as a subsequence
    remaining = iter((j.arrival_s, j.gpus, j.duration_s, j.model) for j in merged)
    assert all(key in remaining for key in base_keys)


def test_seeded_and_reiterable() -> None:
    workload = SpikedWorkload(_base(300), daily_spike(), seed=5)
    first = [(j.index, j.arrival_s, j.duration_s, j.model) for j in workload]
    again = [(j.index, j.arrival_s, j.duration_s, j.model) for j in workload]
    other = [(j.index, j.arrival_s, j.duration_s, j.model) for j in SpikedWorkload(_base(300), daily_spike(), seed=6)]
    assert first == again
    assert first != other


def test_endless_base_stays_endless() -> None:
    jobs = list(islice(with_spikes(PhillySynthetic(jobs_per_hour=8.0), daily_spike()), 1000))
    assert [j.index for j in jobs] == list(range(1000))


def test_rate_bursts_with_short_uniform_durations() -> None:
    # Blox §5.2: two times the load of short jobs (10 min - 1 h) for two hours, every few hours
    spikes = Spikes(
        period_s=6 * HOUR_S, window_s=2 * HOUR_S, offset_s=4 * HOUR_S, rate_per_hour=16.0, duration_range_s=(600, 3600)
    )
    extras = list(islice(spikes.jobs(seed=1), 400))
    assert all(600 <= j.duration_s <= 3600 for j in extras)
    assert all(_in_window(j, spikes) for j in extras)
    per_window: dict[int, int] = {}
    for job in extras:
        per_window[int(job.arrival_s // spikes.period_s)] = per_window.get(int(job.arrival_s // spikes.period_s), 0) + 1
    full = [n for w, n in per_window.items() if w < max(per_window)]
    assert 24 <= sum(full) / len(full) <= 40  # Poisson mean 32 per 2 h window


def test_zero_jobs_per_window_is_the_base() -> None:
    base = list(_base(100))
    assert list(with_spikes(base, daily_spike(jobs=0))) == base


@pytest.mark.parametrize(
    "options",
    [
        {"jobs_per_window": 1, "rate_per_hour": 1.0},
        {},
        {"jobs_per_window": 1, "window_s": 2 * DAY_S},
        {"jobs_per_window": 1, "offset_s": 23.5 * HOUR_S},
        {"rate_per_hour": 0.0},
        {"jobs_per_window": 1, "duration_range_s": (0.0, 10.0)},
    ],
)
def test_rejects_bad_options(options: dict[str, object]) -> None:
    with pytest.raises(WorkloadError):
        Spikes(**options)  # type: ignore[arg-type]
