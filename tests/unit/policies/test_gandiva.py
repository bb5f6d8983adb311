"""Gandiva (seed 001): affinity homes, oversubscription and time-slicing, packing kept only when it
beats time-slicing, defragmenting migration, grow-shrink."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from services.core import PLACEMENT
from services.core.decisions import Ranking
from services.core.state import ClusterState, JobState
from services.placement.policies.gandiva import Gandiva
from tests.unit.policies.builders import allocation, assert_unchanged, cluster, frozen, job, jobs_of


def place(
    items: list[JobState], order: list[str], state: ClusterState, now: float = 0.0, **options: Any
) -> tuple[Any, dict[str, tuple[int, ...]], tuple[str, ...]]:
    policy = PLACEMENT.create("gandiva", **options)
    jobs = jobs_of(*items)
    before = frozen(jobs, state)
    placement = policy.place(Ranking(order=tuple(order)), jobs, state, now)
    assert_unchanged(before, jobs, state)
    assert placement.plan is not None
    return policy, allocation(placement), placement.plan.suspend


def test_affinity_same_size_then_empty_server() -> None:
    # servers of 4: s0 has a 2-GPU job (affinity 2), s1 a 1-GPU job (affinity 1), s2 is empty
    a, b = job("a", gpus=2, on=(0, 1)), job("b", on=(4,))
    items = [a, b, job("c", gpus=2, seq=1), job("d", seq=2), job("e", gpus=4, seq=3)]
    _, alloc, suspended = place(items, ["a", "b", "c", "d", "e"], cluster(3, 4, running=[a, b]), defrag_threshold=None)
    # c joins the 2-GPU server, d the 1-GPU server, e takes the empty one
    assert alloc == {"a": (0, 1), "b": (4,), "c": (2, 3), "d": (5,), "e": (8, 9, 10, 11)}
    assert suspended == ()


OVERSUBSCRIBED = [job("a", gpus=2, on=(0, 1)), job("b", gpus=2, on=(2, 3), seq=1)]


def test_oversubscription_time_slices_the_server() -> None:
    # no free GPU: c is homed on the least-shared GPUs 0-1 (height 2) and, ranked first, runs there
    items = [*OVERSUBSCRIBED, job("c", gpus=2, seq=2)]
    policy, alloc, suspended = place(items, ["c", "a", "b"], cluster(1, 4, running=OVERSUBSCRIBED))
    assert policy.homes["c"] == (0, 1)
    assert alloc == {"c": (0, 1), "b": (2, 3)}
    assert suspended == ("a",)
    # the next round the ranking rotates back (round robin): a runs again, c waits
    _, alloc2, _ = place(items, ["a", "b", "c"], cluster(1, 4, running=OVERSUBSCRIBED))
    assert alloc2 == {"a": (0, 1), "b": (2, 3)}


def test_a_time_sliced_job_moves_to_a_gpu_that_became_free() -> None:
    # round 1: four jobs fill the server, e is homed on GPU 0 with a and, ranked first, runs there
    running = [job("a", on=(0,)), job("b", on=(1,), seq=1), job("c", on=(2,), seq=2), job("d", on=(3,), seq=3)]
    e = job("e", seq=4)
    policy = PLACEMENT.create("gandiva", defrag_threshold=None)
    first = policy.place(
        Ranking(order=("e", "a", "b", "c", "d")), jobs_of(*running, e), cluster(1, 4, running=running), 0.0
    )
    assert allocation(first) == {"e": (0,), "b": (1,), "c": (2,), "d": (3,)}
    # round 2: d has finished; a waits for GPU 0 (shared with e) while GPU 3 is free: a moves there
    e_running = job("e", on=(0,), seq=4)
    now_running = [e_running, running[1], running[2]]
    items = [job("a"), *now_running]
    second = policy.place(
        Ranking(order=("b", "c", "e", "a")), jobs_of(*items), cluster(1, 4, running=now_running), 60.0
    )
    assert allocation(second) == {"a": (3,), "b": (1,), "c": (2,), "e": (0,)}
    assert isinstance(policy, Gandiva)
    assert policy.homes["a"] == (3,)
    # a job that runs keeps its home even if shared (moving it would be a migration, not a resume)
    assert policy.homes["e"] == (0,)


def test_a_job_wider_than_a_server_is_oversubscribed_across_servers() -> None:
    # two full 4-GPU servers; an 8-GPU job is homed on both (height 2) and, ranked first, runs
    running = [job(f"r{g}", on=(g,), seq=g) for g in range(8)]
    items = [*running, job("w", gpus=8, seq=8)]
    order = ["w", *(f"r{g}" for g in range(8))]
    policy, alloc, suspended = place(items, order, cluster(2, 4, running=running))
    assert policy.homes["w"] == tuple(range(8))
    assert alloc == {"w": tuple(range(8))}
    assert len(suspended) == 8
    # with max_height 1 it waits, as before
    policy1, alloc1, _ = place(items, order, cluster(2, 4, running=running), max_height=1)
    assert "w" not in policy1.homes
    assert "w" not in alloc1


def test_max_height_1_disables_oversubscription() -> None:
    items = [*OVERSUBSCRIBED, job("c", gpus=2, seq=2)]
    policy, alloc, _ = place(items, ["c", "a", "b"], cluster(1, 4, running=OVERSUBSCRIBED), max_height=1)
    assert "c" not in policy.homes
    assert alloc == {"a": (0, 1), "b": (2, 3)}


def modeled(j: JobState, model: str, iteration: float | None = None) -> JobState:
    spec = j.spec.model_copy(update={"model": model})
    return dataclasses.replace(j, spec=spec, iteration_time_s=iteration)


SMALL = {"gpu_util": 0.3, "gpu_mem_mb": 4000, "solo_iteration_s": 1.0}
BIG = {"gpu_util": 0.6, "gpu_mem_mb": 4000}


@pytest.mark.parametrize(
    ("profiles", "packed"),
    [
        ({"m": SMALL}, True),  # 0.3 + 0.3 <= 1 and 8000 MB <= 16384 MB
        ({"m": BIG}, False),  # 0.6 + 0.6 > 1
        ({"m": {**SMALL, "gpu_mem_mb": 9000}}, False),  # 18000 MB does not fit in 16384 MB
        ({}, False),  # no profiles, no packing
    ],
    ids=["low utilization packs", "utilization too high", "memory does not fit", "no profiles"],
)
def test_packing_when_utilization_and_memory_fit(profiles: dict[str, Any], packed: bool) -> None:
    running = [modeled(j, "m") for j in OVERSUBSCRIBED]
    items = [*running, modeled(job("c", gpus=2, seq=2), "m")]
    _, alloc, suspended = place(items, ["a", "b", "c"], cluster(1, 4, running=running), profiles=profiles)
    assert ("c" in alloc) is packed
    if packed:
        assert alloc == {"a": (0, 1), "b": (2, 3), "c": (0, 1)}
    assert suspended == ()


@pytest.mark.parametrize(
    ("packed_iteration", "kept"),
    [(1.5, True), (2.5, False)],  # solo 1.0 each: 2 x 1/1.5 = 1.33 > 1 keeps; 2 x 1/2.5 = 0.8 undoes
    ids=["packed throughput beats time-slicing", "packing slower than time-slicing is undone"],
)
def test_packing_is_kept_only_if_it_beats_time_slicing(packed_iteration: float, kept: bool) -> None:
    a = modeled(job("a", on=(0,)), "m", packed_iteration)
    c = modeled(job("c", on=(0,), seq=1), "m", packed_iteration)
    state = cluster(1, 1, running=[a, c])  # both on GPU 0: packed last round
    policy, alloc, suspended = place([a, c], ["a", "c"], state, profiles={"m": SMALL})
    assert ("c" in alloc) is kept
    assert suspended == (() if kept else ("c",))
    assert (frozenset({"a", "c"}) in policy.failed_pairs) is not kept


def test_defragmentation_moves_jobs_off_the_emptiest_server() -> None:
    # s0: a alone (3 free >= threshold 3); s1: b, c (2 free, affinity 1); s2 idle -> a moves to s1
    running = [job("a", on=(0,)), job("b", on=(4,), seq=1), job("c", on=(5,), seq=2)]
    _, alloc, suspended = place(running, ["a", "b", "c"], cluster(3, 4, running=running))
    assert alloc == {"a": (6,), "b": (4,), "c": (5,)}
    assert suspended == ("a",)  # a migration: suspend, then launch on GPU 6


def test_grow_after_idle_period_and_shrink_for_a_new_job() -> None:
    e = job("e", on=(0,), max_gpus=4)
    state = cluster(1, 4, running=[e])
    policy = PLACEMENT.create("gandiva", grow_after_s=60.0)
    jobs = jobs_of(e)
    assert allocation(policy.place(Ranking(order=("e",)), jobs, state, 0.0)) == {"e": (0,)}  # idle 0 s
    assert allocation(policy.place(Ranking(order=("e",)), jobs, state, 30.0)) == {"e": (0,)}
    grown = policy.place(Ranking(order=("e",)), jobs, state, 100.0)  # idle since 0: 100 s >= 60 s
    assert allocation(grown) == {"e": (0, 1, 2, 3)}
    assert grown.plan is not None
    assert grown.plan.suspend == ("e",)  # growing relaunches the job
    # e now holds all four GPUs; f arrives and is homed on GPU 1: e gives it up at once
    e4 = dataclasses.replace(e, gpus=(0, 1, 2, 3))
    f = job("f", seq=1)
    jobs2 = jobs_of(e4, f)
    shrunk = policy.place(Ranking(order=("e", "f")), jobs2, cluster(1, 4, running=[e4]), 110.0)
    assert allocation(shrunk) == {"e": (0, 2, 3), "f": (1,)}


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"max_height": 0}, "max_height"),
        ({"defrag_threshold": 0}, "defrag_threshold"),
        ({"grow_after_s": -1.0}, "grow_after_s"),
        ({"profiles": {"m": {"gpu_util": 2.0}}}, "gpu_util"),
        ({"profiles": {"m": {"util": 0.5}}}, "unknown keys"),
    ],
    ids=["zero height", "zero threshold", "negative idle period", "utilization above 1", "typo in profile"],
)
def test_rejects_bad_options(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PLACEMENT.create("gandiva", **options)


def test_locality_migration_consolidates_a_spread_job_once_its_server_has_room() -> None:
    # servers of 4: x, y, z fill GPUs 0-2; a (2 GPUs) was spread over GPUs 3 and 4; b and c hold
    # 5 and 6, GPU 7 is free. Without a's own GPU 4, server 1 has 4 and 7 free: a moves there.
    running = [job("x", on=(0,)), job("y", on=(1,), seq=1), job("z", on=(2,), seq=2),
               job("a", gpus=2, on=(3, 4), seq=3), job("b", on=(5,), seq=4), job("c", on=(6,), seq=5)]  # fmt: skip
    order = ["x", "y", "z", "a", "b", "c"]
    policy, alloc, suspended = place(running, order, cluster(2, 4, running=running), locality=True)
    assert alloc["a"] == (4, 7)  # it keeps GPU 4 and takes 7
    assert suspended == ("a",)  # a migration: suspend, then launch on one server
    assert policy.consolidated == 1
    # off (the default): a stays spread
    _, alloc_off, suspended_off = place(running, order, cluster(2, 4, running=running))
    assert alloc_off["a"] == (3, 4)
    assert suspended_off == ()


def test_locality_migration_waits_while_no_server_has_room() -> None:
    running = [job("x", on=(0,)), job("y", on=(1,), seq=1), job("z", on=(2,), seq=2),
               job("a", gpus=2, on=(3, 4), seq=3), job("b", on=(5,), seq=4), job("c", on=(6,), seq=5),
               job("d", on=(7,), seq=6)]  # fmt: skip
    policy, alloc, suspended = place(running, ["x", "y", "z", "a", "b", "c", "d"], cluster(2, 4, running=running),
                                     locality=True)  # fmt: skip
    assert alloc["a"] == (3, 4)
    assert suspended == ()
    assert policy.consolidated == 0
