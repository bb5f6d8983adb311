"""Fulcrum (seed 002) Algorithm 1: weights, refresh, equivalence with the printed algorithm, and the
``fulcrum`` placement policy (room, spreading, decay, determinism, no mutation)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from services.core import PLACEMENT
from services.core.decisions import Ranking
from services.core.state import JobState
from services.placement.policies.fulcrum import Fulcrum, FulcrumBalancer
from tests.unit.policies.builders import allocation, assert_unchanged, cluster, frozen, job, jobs_of


def balancer_with(loads: list[float], **kw: object) -> FulcrumBalancer:
    b = FulcrumBalancer(len(loads), **kw)  # type: ignore[arg-type]
    b.set_loads(loads)
    return b


WEIGHT_CASES = [
    # maxLoad 3: weights 3-3, 3-1, 3-0, 3-2
    ("max minus load", "max-minus-load", [3.0, 1.0, 0.0, 2.0], [0.0, 2.0, 3.0, 1.0]),
    ("g = 1/(1+load)", "inverse", [3.0, 1.0, 0.0, 2.0], [0.25, 0.5, 1.0, 1 / 3]),
]


@pytest.mark.parametrize(
    ("weight", "loads", "expected"), [c[1:] for c in WEIGHT_CASES], ids=[c[0] for c in WEIGHT_CASES]
)
def test_weights(weight: str, loads: list[float], expected: list[float]) -> None:
    b = balancer_with(loads, weight=weight)
    assert [b.weight_of(i) for i in range(4)] == pytest.approx(expected)


def test_draw_frequencies_follow_the_weights() -> None:
    # weights 0, 2, 3, 1 of 6: probabilities 0, 1/3, 1/2, 1/6; the most loaded worker never wins
    b = balancer_with([3.0, 1.0, 0.0, 2.0], seed=3)
    counts = Counter(b.draw() for _ in range(6000))
    assert counts[0] == 0
    assert counts[1] / 6000 == pytest.approx(1 / 3, abs=0.03)
    assert counts[2] / 6000 == pytest.approx(1 / 2, abs=0.03)
    assert counts[3] / 6000 == pytest.approx(1 / 6, abs=0.03)


def literal(load: list[float], rng: random.Random) -> int:
    """Algorithm 1 as printed (``rand = u * totalwt``), except that equal loads draw uniformly
    (the documented choice: the printed algorithm would always return worker 0)."""
    max_load = max(load)
    total = sum(max_load - x for x in load)
    if total == 0:
        return rng.randrange(len(load))
    target = rng.random() * total
    acc = 0.0
    for i, x in enumerate(load):
        acc += max_load - x
        if acc >= target:
            return i
    return len(load) - 1


def test_same_choices_as_the_printed_algorithm() -> None:
    # The balancer draws from its generator exactly as the oracle does: replay the same stream.
    n = 37
    b = FulcrumBalancer(n, seed=11)
    b.update_load(5)  # loads differ from the start
    shadow = random.Random(11)
    load = [0.0] * n
    load[5] = 1.0
    for step in range(3000):
        chosen = b.draw()
        assert chosen == literal(load, shadow), f"draw {step}"
        b.update_load(chosen)
        load[chosen] += 1.0
        if step % 100 == 99:
            b.refresh(0.5)
            load = [x * 0.5 for x in load]
    assert b.loads == pytest.approx(load)


def test_refresh_decays_and_equal_loads_draw_uniformly() -> None:
    b = FulcrumBalancer(4, seed=0)
    b.update_load(2)
    b.update_load(2)
    b.refresh(0.5)
    assert b.loads == (0.0, 0.0, 1.0, 0.0)
    equal = FulcrumBalancer(4, seed=0)
    assert set(Counter(equal.draw() for _ in range(400))) == {0, 1, 2, 3}  # not always worker 0


def test_n_jobs_onto_n_empty_nodes_spread_one_per_node() -> None:
    # First draw: all equal, uniform. Then the loaded nodes have weight 0 until every node has one.
    items = [job(f"j{i}", submit=float(i), seq=i) for i in range(4)]
    jobs = jobs_of(*items)
    state = cluster(4, 2)
    before = frozen(jobs, state)
    for seed in range(10):
        placement = PLACEMENT.create("fulcrum", seed=seed).place(Ranking(order=tuple(jobs)), jobs, state, 0.0)
        nodes = sorted(g // 2 for gpus in allocation(placement).values() for g in gpus)
        assert nodes == [0, 1, 2, 3]
    assert_unchanged(before, jobs, state)


def test_only_nodes_with_room() -> None:
    # nodes 0-2 are full; node 3 has 2 free GPUs: the 2-GPU job goes there, the next one waits
    running = [job(f"r{n}", gpus=2, on=(2 * n, 2 * n + 1)) for n in range(3)]
    items: list[JobState] = [*running, job("w", gpus=2, submit=1.0, seq=1), job("x", submit=2.0, seq=2)]
    jobs = jobs_of(*items)
    state = cluster(4, 2, running=running)
    policy = Fulcrum(seed=5, max_draws=0)  # exercise the exact fallback draw
    placement = policy.place(Ranking(order=("r0", "r1", "r2", "w", "x")), jobs, state, 0.0)
    assert allocation(placement) == {"r0": (0, 1), "r1": (2, 3), "r2": (4, 5), "w": (6, 7)}
    assert placement.plan is not None
    assert placement.plan.suspend == ()


def test_loads_decay_once_per_refresh_period() -> None:
    items = [job(f"j{i}", seq=i) for i in range(2)]
    jobs = jobs_of(*items)
    state = cluster(2, 2)
    policy = Fulcrum(seed=1, refresh_s=60.0, decay_rate=0.5)
    policy.place(Ranking(order=tuple(jobs)), jobs, state, 0.0)
    assert sorted(policy.balancer(state).loads) == [1.0, 1.0]
    policy.place(Ranking(order=()), jobs, state, 59.0)
    assert sorted(policy.balancer(state).loads) == [1.0, 1.0]
    policy.place(Ranking(order=()), jobs, state, 130.0)  # two periods: x 0.25
    assert sorted(policy.balancer(state).loads) == [0.25, 0.25]


def test_same_seed_same_decisions() -> None:
    items = [job(f"j{i}", seq=i) for i in range(6)]
    jobs = jobs_of(*items)
    state = cluster(8, 1)

    def run(seed: int) -> list[dict[str, tuple[int, ...]]]:
        policy = Fulcrum(seed=seed)
        return [allocation(policy.place(Ranking(order=tuple(jobs)), jobs, state, float(t))) for t in range(5)]

    assert run(4) == run(4)
    assert run(4) != run(5)


@pytest.mark.parametrize(
    "options",
    [{"decay_rate": 0.0}, {"refresh_s": 0.0}, {"weight": "nope"}, {"max_draws": -1}],
    ids=["zero decay", "zero period", "unknown weight", "negative draws"],
)
def test_rejects_bad_options(options: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"must be|unknown weight"):
        PLACEMENT.create("fulcrum", **options)
