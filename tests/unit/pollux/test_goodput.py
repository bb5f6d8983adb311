"""The goodput model (services.core.goodput): throughput, efficiency, batch choice, speed-ups, run times."""

from __future__ import annotations

import math

import pytest

from services.core.goodput import PROFILES, GoodputProfile, PerfParams, profile_for

# A hand-checkable profile: compute 0.1 s + 0.001 s per example, all-reduce 0.05 s in a node and
# 0.2 s across nodes (no retrogression), no overlap (gamma 1: times add).
PERF = PerfParams(alpha_c=0.1, beta_c=0.001, alpha_n=0.2, beta_n=0.0, alpha_r=0.05, beta_r=0.0, gamma=1.0)


def profile(noise: tuple[float, ...] = (1_000.0,)) -> GoodputProfile:
    return GoodputProfile(
        perf=PERF,
        init_batch_size=100,
        max_batch_size=1_600,
        local_bsz=(50, 200),
        total_progress=10_000,
        noise_scale=noise,
    )


def test_step_time_adds_compute_network_and_accumulation() -> None:
    assert PERF.step_time(1, 1, 100, 0) == pytest.approx(0.2)  # one GPU: no all-reduce
    assert PERF.step_time(1, 4, 100, 0) == pytest.approx(0.25)  # in a node: + 0.05
    assert PERF.step_time(2, 8, 100, 0) == pytest.approx(0.4)  # across nodes: + 0.2
    assert PERF.step_time(1, 4, 100, 2) == pytest.approx(0.25 + 2 * 0.2)  # two local micro-batches first
    overlapped = PerfParams(0.1, 0.001, 0.2, 0.0, 0.05, 0.0, gamma=10.0)
    # (0.2^10 + 0.2^10)^(1/10): within 8% of max(0.2, 0.2), where gamma 1 gives their sum 0.4
    assert overlapped.step_time(2, 8, 100, 0) == pytest.approx(0.2 * 2**0.1)


def test_efficiency_is_one_at_the_initial_batch_and_falls_with_batch_size() -> None:
    p = profile()
    assert p.efficiency(100, 1_000.0) == 1.0
    assert p.efficiency(1_100, 1_000.0) == pytest.approx(1_100 / 2_100)
    assert p.efficiency(1_100, 1e9) == pytest.approx(1.0, rel=1e-5)  # huge noise: big batches cost nothing


def test_goodput_counts_iterations_at_the_initial_batch_size() -> None:
    p = profile()
    # 4 GPUs x 100 examples in 0.25 s = 16 iterations of 100 per second, at efficiency 1100/1400.
    assert p.goodput(1, 4, 100, 0, 1_000.0) == pytest.approx(16 * 1_100 / 1_400)


def test_best_batch_grows_with_the_noise_scale_and_respects_the_limits() -> None:
    p = profile()
    chosen = [p.best(1, 4, noise) for noise in (10.0, 1_000.0, 100_000.0)]
    assert all(c is not None for c in chosen)
    sizes = [c.batch_size for c in chosen if c is not None]
    assert sizes == sorted(sizes)
    assert sizes[0] < sizes[-1]
    for c in chosen:
        assert c is not None
        assert 50 <= c.atomic_bsz <= 200
        assert c.batch_size <= 1_600
        assert c.batch_size == 4 * c.atomic_bsz * (c.accum_steps + 1)
    assert p.max_replicas == 32  # 1600 / 50
    assert p.best(1, 33, 1_000.0) is None
    assert p.speedup(1, 33, 1_000.0) == 0.0


def test_speedups_are_relative_to_one_gpu_and_nodes_cost() -> None:
    p = profile()
    assert p.speedup(1, 1, 1_000.0) == pytest.approx(1.0)
    assert p.speedup(1, 4, 1_000.0) > p.speedup(2, 4, 1_000.0) > 1.0  # the same GPUs on two nodes are slower
    assert p.speedup(1, 4, 100_000.0) > p.speedup(1, 4, 10.0)  # a larger noise scale makes GPUs worth more
    assert p.speedup(1, 0, 1_000.0) == 0.0


def test_run_times_integrate_the_goodput() -> None:
    constant = profile()
    config = constant.best(1, 4, 1_000.0)
    assert config is not None
    assert constant.seconds(1, 4) == pytest.approx(10_000 / config.goodput)
    assert constant.seconds(1, 4, 400) == pytest.approx(10_000 / constant.goodput(1, 4, 100, 0, 1_000.0))
    # constant noise: the mean speed-up from anywhere is the speed-up
    assert constant.mean_speedup(1, 4, 0.3) == pytest.approx(constant.speedup(1, 4, 1_000.0), rel=1e-6)


def test_progress_fraction_inverts_the_one_gpu_run_time() -> None:
    growing = profile((10.0, 100.0, 10_000.0))
    total = growing.seconds(1, 1)
    for fraction in (0.0, 0.25, 0.5, 0.9, 1.0):
        done = total - growing.remaining_seconds(1, 1, fraction)
        assert growing.progress_fraction(done) == pytest.approx(fraction, abs=1e-9)
    assert growing.noise_scale_at(0.75) == pytest.approx(5_050.0)
    # the noise scale grows, so 8 GPUs pay off more late in training than early
    assert growing.mean_speedup(1, 4, 0.9) > growing.mean_speedup(1, 4, 0.0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"local_bsz": (0, 10)}, "local_bsz"),
        ({"init_batch_size": 2_000}, "batch sizes"),
        ({"total_progress": math.inf}, "total_progress"),
        ({"noise_scale": ()}, "noise_scale"),
    ],
    ids=["local-batch", "init-above-max", "infinite-work", "no-noise"],
)
def test_profiles_are_checked(change: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {
        "perf": PERF, "init_batch_size": 100, "max_batch_size": 1_600, "local_bsz": (50, 200),
        "total_progress": 1.0, "noise_scale": (1.0,),
    }  # fmt: skip
    with pytest.raises(ValueError, match=message):
        GoodputProfile(**{**fields, **change})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gamma"):
        PerfParams(0.1, 0.001, 0.2, 0.0, 0.05, 0.0, gamma=0.5)


def test_every_pollux_model_has_a_profile_that_scales() -> None:
    assert set(PROFILES) == {"bert", "cifar10", "ncf", "imagenet", "deepspeech2", "yolov3"}
    assert profile_for("CIFAR10") is PROFILES["cifar10"]
    assert profile_for("resnet50") is None
    assert profile_for(None) is None
    for name, p in PROFILES.items():
        late = p.noise_scale_at(1.0)
        assert p.speedup(1, 4, late) > 1.0, name
        assert 0 < p.seconds(1, 1) < math.inf, name
