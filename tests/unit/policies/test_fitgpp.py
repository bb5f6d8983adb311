"""FitGpp (seed 000): the victim score (Eq. 1-2), the LRTP/RAND baselines, the TE/BE ranking and the
``preempting`` placement that calls a victim policy when a TE job does not fit."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from services.core import PLACEMENT, SCHEDULING, VICTIM
from services.core.decisions import Ranking
from services.core.registry import UnknownPolicyError
from services.core.round import diff_plan
from services.core.state import JobState
from services.placement.policies.fitgpp import FitGppVictim
from tests.unit.policies.builders import allocation, assert_unchanged, cluster, frozen, job, jobs_of


def fjob(
    job_id: str,
    *,
    cpus: float = 1.0,
    mem: float = 4.0,
    grace: float = 30.0,
    limit: int | None = None,
    preemptions: int = 0,
    **kw: Any,
) -> JobState:
    """``builders.job`` plus the FitGpp spec fields (CPU, RAM, grace period, P) and ``PC_j``."""
    base = job(job_id, **kw)
    spec = base.spec.model_copy(
        update={"cpus": cpus, "memory_gb": mem, "grace_period_s": grace, "max_preemptions": limit}
    )
    return dataclasses.replace(base, spec=spec, preemptions=preemptions)


# Two nodes of 4 GPUs, 32 CPUs, 256 GiB. Node 0 is full: a (2 GPUs, 8 CPUs, 64 GiB), b and c
# (1 GPU, 4 CPUs, 32 GiB each); node 1 is full with d (4 GPUs, 16 CPUs, 128 GiB). Free: 16 CPUs and
# 128 GiB on each node, no GPU. Relative demands: a (.25, .25, .5) |a| = .6124; b, c
# (.125, .125, .25) |b| = .3062; d (.5, .5, 1) |d| = 1.2247 = max. Size terms: a .5, b c .25, d 1.
def full(ga: float = 60.0, gb: float = 60.0, gc: float = 60.0, gd: float = 60.0, **c_kw: Any) -> list[JobState]:
    return [
        fjob("a", gpus=2, on=(0, 1), cpus=8, mem=64, grace=ga, submit=0.0, seq=0),
        fjob("b", gpus=1, on=(2,), cpus=4, mem=32, grace=gb, submit=1.0, seq=1),
        fjob("c", gpus=1, on=(3,), cpus=4, mem=32, grace=gc, submit=2.0, seq=2, **c_kw),
        fjob("d", gpus=4, on=(4, 5, 6, 7), cpus=16, mem=128, grace=gd, submit=3.0, seq=3),
    ]


FITGPP_CASES: list[tuple[str, dict[str, Any], list[JobState], JobState, tuple[str, ...]]] = [
    (
        # equal GPs: every score is size + 4; b and c tie at .25 + 4 -> the later-submitted c
        "equal grace periods: the smallest demand, ties to the latest submitted",
        {},
        full(),
        fjob("te", kind="TE", cpus=4, mem=32),
        ("c",),
    ),
    (
        # max GP 600: a .5 + 4 * .1 = .9; b c .25 + 4 = 4.25; d 1 + .4 = 1.4
        "a long grace period outweighs a small demand (s = 4)",
        {},
        full(gb=600.0, gc=600.0),
        fjob("te", kind="TE", cpus=4, mem=32),
        ("a",),
    ),
    (
        "s = 0 ignores grace periods",
        {"s": 0.0},
        full(gb=600.0, gc=600.0),
        fjob("te", kind="TE", cpus=4, mem=32),
        ("c",),
    ),
    (
        # b, c free 1 GPU on node 0: 0 + 1 < 2; a (.5 + 4) beats d (1 + 4)
        "D_TE <= D_j + N: a 2-GPU TE job rules out the 1-GPU jobs",
        {},
        full(),
        fjob("te", kind="TE", gpus=2, cpus=4, mem=32),
        ("a",),
    ),
    (
        # CPUs free after preempting: b or c 16 + 4 = 20, a 16 + 8 = 24, d 16 + 16 = 32 -> only d
        "CPU demand counts: 25 CPUs rule out every job on node 0",
        {},
        full(),
        fjob("te", kind="TE", cpus=25, mem=32),
        ("d",),
    ),
    (
        "PC_j < P: the policy's P = 1 excludes a job preempted once",
        {"max_preemptions": 1},
        full(preemptions=1),
        fjob("te", kind="TE", cpus=4, mem=32),
        ("b",),
    ),
    (
        "PC_j < P: the job's own max_preemptions wins over the default",
        {"max_preemptions": 5},
        full(limit=1, preemptions=1),
        fjob("te", kind="TE", cpus=4, mem=32),
        ("b",),
    ),
    (
        "TE jobs are never victims",
        {},
        [fjob("t1", kind="TE", gpus=4, on=(0, 1, 2, 3)), fjob("t2", kind="TE", gpus=4, on=(4, 5, 6, 7))],
        fjob("te", kind="TE"),
        (),
    ),
    (
        "no single BE job makes room: nothing is preempted",
        {},
        full(),
        fjob("te", kind="TE", gpus=4, cpus=40),
        (),
    ),
]


@pytest.mark.parametrize(
    ("options", "running", "needed", "expected"), [c[1:] for c in FITGPP_CASES], ids=[c[0] for c in FITGPP_CASES]
)
def test_fitgpp_victim(
    options: dict[str, Any], running: list[JobState], needed: JobState, expected: tuple[str, ...]
) -> None:
    policy = VICTIM.create("fitgpp", **options)
    jobs = jobs_of(*running, needed)
    state = cluster(2, 4, running=running)
    before = frozen(jobs, state)

    assert policy.choose(needed, running, state, 0.0) == expected
    assert_unchanged(before, jobs, state)


def test_fitgpp_scores_are_eq1() -> None:
    running = full(gb=600.0, gc=600.0)
    scores = FitGppVictim().scores(running, cluster(2, 4, running=running))
    assert scores == pytest.approx({"a": 0.9, "b": 4.25, "c": 4.25, "d": 1.4})
    assert math.isclose(FitGppVictim(s=1.0).scores(running, cluster(2, 4, running=running))["d"], 1.1)


# LRTP: x (remaining 1000 s) and y (5000 s) share node 0, z (3000 s) fills node 1.
LRTP_RUNNING = [
    fjob("x", gpus=2, on=(0, 1), duration=1000.0, submit=0.0),
    dataclasses.replace(fjob("y", gpus=2, on=(2, 3), duration=6000.0, submit=1.0, seq=1), executed_time=1000.0),
    fjob("z", gpus=4, on=(4, 5, 6, 7), duration=3000.0, submit=2.0, seq=2),
]

LRTP_CASES: list[tuple[str, JobState, tuple[str, ...]]] = [
    # y (5000 left) first: node 0 then has 2 free GPUs < 3; z (3000) next: node 1 has 4 -> fits.
    # Both are kept, though z alone would have done (Appendix A: "until they can prepare enough").
    ("longest remaining first, until the TE job fits; wasted victims kept", fjob("te", kind="TE", gpus=3), ("y", "z")),
    ("the first victim already makes room", fjob("te", kind="TE", gpus=2), ("y",)),
    ("even every BE job does not make room: nothing", fjob("te", kind="TE", gpus=4, cpus=64), ()),
]


@pytest.mark.parametrize(("needed", "expected"), [c[1:] for c in LRTP_CASES], ids=[c[0] for c in LRTP_CASES])
def test_lrtp_victims(needed: JobState, expected: tuple[str, ...]) -> None:
    policy = VICTIM.create("lrtp")
    jobs = jobs_of(*LRTP_RUNNING, needed)
    state = cluster(2, 4, running=LRTP_RUNNING)
    before = frozen(jobs, state)
    assert policy.choose(needed, LRTP_RUNNING, state, 0.0) == expected
    assert_unchanged(before, jobs, state)


def test_fitgpp_picks_one_job_where_lrtp_takes_two() -> None:
    needed = fjob("te", kind="TE", gpus=3)
    state = cluster(2, 4, running=LRTP_RUNNING)
    assert VICTIM.create("fitgpp").choose(needed, LRTP_RUNNING, state, 0.0) == ("z",)


def test_rand_is_seeded_and_prepares_room() -> None:
    running = [fjob(f"r{i}", on=(i,), seq=i) for i in range(8)]  # eight 1-GPU BE jobs
    state = cluster(2, 4, running=running)
    needed = fjob("te", kind="TE", gpus=2)
    jobs = jobs_of(*running, needed)
    before = frozen(jobs, state)
    draws = set()
    for seed in range(20):
        policy = VICTIM.create("rand", seed=seed)
        victims = policy.choose(needed, running, state, 5.0)
        assert victims == policy.choose(needed, running, state, 5.0), "same seed, same draw"
        nodes = [int(v[1:]) // 4 for v in victims]
        # stops as soon as one node has 2 free GPUs: the last victim completes the pair
        assert nodes.count(nodes[-1]) == 2
        assert len(set(nodes[:-1])) == len(nodes) - 1
        draws.add(victims)
    assert len(draws) > 5, "different seeds give different draws"
    assert_unchanged(before, jobs, state)


def test_rand_with_one_candidate_takes_it() -> None:
    running = [fjob("t", kind="TE", gpus=3, on=(0, 1, 2)), fjob("only", on=(3,))]
    state = cluster(1, 4, running=running)
    assert VICTIM.create("rand", seed=7).choose(fjob("te", kind="TE"), running, state, 0.0) == ("only",)


RANK_ITEMS = [
    fjob("be-new", submit=0.0, seq=0),
    fjob("te-late", kind="TE", submit=5.0, seq=5),
    fjob("be-preempted", submit=3.0, seq=3, preemptions=1, preempted=10.0, queued_since=10.0),
    fjob("te-early", kind="TE", submit=4.0, seq=4),
    fjob("be-running", submit=1.0, seq=1, on=(0,), started=2.0),
]


def test_ranking_te_fifo_then_preempted_be_then_be_fifo() -> None:
    policy = SCHEDULING.create("fitgpp")
    jobs = jobs_of(*RANK_ITEMS)
    state = cluster(1, 4, running=[j for j in RANK_ITEMS if j.gpus])
    before = frozen(jobs, state)
    ranking = policy.rank(jobs, state, 20.0)
    assert list(ranking.order) == ["te-early", "te-late", "be-running", "be-preempted", "be-new"]
    assert ranking.preempt is False
    assert_unchanged(before, jobs, state)
    key = policy.sort_key  # type: ignore[attr-defined]
    assert [j.job_id for j in sorted(RANK_ITEMS, key=lambda j: key(j, 20.0))] == list(ranking.order)


# One node of 4 GPUs. be1 (GP 60 s) and be2 (GP 600 s) hold 2 GPUs each; FitGpp scores 1 + 4 x .1
# and 1 + 4: be1 goes. LRTP: be2 has more left (900 s vs 100 s): be2 goes.
ONE_NODE = [
    fjob("be1", gpus=2, on=(0, 1), grace=60.0, duration=100.0, submit=0.0, seq=0),
    fjob("be2", gpus=2, on=(2, 3), grace=600.0, duration=900.0, submit=1.0, seq=1),
]

# (id, options, jobs, (ranking policy, nodes), expected allocation, suspended)
PLACE_CASES: list[
    tuple[str, dict[str, Any], list[JobState], tuple[str, int], dict[str, tuple[int, ...]], tuple[str, ...]]
] = [
    (
        "TE arrival preempts the fitgpp victim and takes its GPUs",
        {},
        [*ONE_NODE, fjob("te", kind="TE", gpus=2, submit=5.0, seq=5)],
        ("fitgpp", 1),
        {"be2": (2, 3), "te": (0, 1)},
        ("be1",),
    ),
    (
        "victim='lrtp' preempts the job with the longest remaining time",
        {"victim": "lrtp"},
        [*ONE_NODE, fjob("te", kind="TE", gpus=2, submit=5.0, seq=5)],
        ("fitgpp", 1),
        {"be1": (0, 1), "te": (2, 3)},
        ("be2",),
    ),
    (
        # v frees the 4 CPUs the TE job needs; GPU 2 was free all along. The TE job takes v's GPU 3,
        # so it starts only when v's grace period is over (the owner holds v's GPUs that long).
        "the TE job takes the victim's GPUs before GPUs that were already free",
        {},
        [
            fjob("hog", gpus=2, on=(0, 1), cpus=28, grace=600.0),
            fjob("v", on=(3,), cpus=4, grace=30.0, submit=1.0, seq=1),
            fjob("te", kind="TE", cpus=4, submit=5.0, seq=5),
        ],
        ("fitgpp", 1),
        {"hog": (0, 1), "te": (3,)},
        ("v",),
    ),
    (
        "a waiting BE job never preempts",
        {},
        [*ONE_NODE, fjob("be3", gpus=2, submit=5.0, seq=5)],
        ("fitgpp", 1),
        {"be1": (0, 1), "be2": (2, 3)},
        (),
    ),
    (
        # node 0 has 2 free GPUs but 2 free CPUs: the 4-CPU job goes to node 1
        "free GPUs are not enough: CPUs must fit on the node too",
        {},
        [fjob("hog", gpus=2, on=(0, 1), cpus=30), fjob("w", cpus=4, submit=1.0, seq=1)],
        ("fitgpp", 2),
        {"hog": (0, 1), "w": (4,)},
        (),
    ),
    (
        "FIFO: a blocked BE job stops the BE jobs behind it",
        {},
        [fjob("r", gpus=3, on=(0, 1, 2)), fjob("big", gpus=2, submit=1.0, seq=1), fjob("small", submit=2.0, seq=2)],
        ("fitgpp", 1),
        {"r": (0, 1, 2)},
        (),
    ),
    (
        "backfill lets a later BE job use what a blocked one cannot",
        {"backfill": True},
        [fjob("r", gpus=3, on=(0, 1, 2)), fjob("big", gpus=2, submit=1.0, seq=1), fjob("small", submit=2.0, seq=2)],
        ("fitgpp", 1),
        {"r": (0, 1, 2), "small": (3,)},
        (),
    ),
    (
        # FIFO ranking puts be-new (launched on 2, 3) before te; fitgpp then prefers be-new
        # (GP 30 s: 1 + 4 x .05) over be-old (GP 600 s: 1 + 4): be-new simply is not launched.
        "a victim launched earlier in the same walk is just not launched",
        {},
        [
            fjob("be-old", gpus=2, on=(0, 1), grace=600.0),
            fjob("be-new", gpus=2, grace=30.0, submit=1.0, seq=1),
            fjob("te", kind="TE", gpus=2, submit=2.0, seq=2),
        ],
        ("fifo", 1),
        {"be-old": (0, 1), "te": (2, 3)},
        (),
    ),
]


@pytest.mark.parametrize(
    ("options", "items", "setup", "expected", "suspended"),
    [c[1:] for c in PLACE_CASES],
    ids=[c[0] for c in PLACE_CASES],
)
def test_preempting_placement(
    options: dict[str, Any],
    items: list[JobState],
    setup: tuple[str, int],
    expected: dict[str, tuple[int, ...]],
    suspended: tuple[str, ...],
) -> None:
    ranker, nodes = setup
    policy = PLACEMENT.create("preempting", **options)
    jobs = jobs_of(*items)
    state = cluster(nodes, 4, running=[j for j in items if j.gpus])
    ranking = SCHEDULING.create(ranker).rank(jobs, state, 10.0)
    before = frozen(jobs, state)

    placement = policy.place(ranking, jobs, state, 10.0)

    assert allocation(placement) == expected
    plan = diff_plan(placement, ranking, jobs)
    assert plan.suspend == suspended
    assert {k: tuple(sorted(v)) for k, v in plan.launch.items()} == {
        k: v for k, v in expected.items() if not jobs[k].gpus
    }
    assert_unchanged(before, jobs, state)


def test_preempting_ignores_rank_preemption() -> None:
    items = [*ONE_NODE, fjob("be3", gpus=2, submit=5.0, seq=5)]
    jobs = jobs_of(*items)
    state = cluster(1, 4, running=ONE_NODE)
    placement = PLACEMENT.create("preempting").place(Ranking(order=("be3", "be1", "be2")), jobs, state, 0.0)
    assert allocation(placement) == {"be1": (0, 1), "be2": (2, 3)}


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"victim": "lrtp", "s": 2.0}, ValueError, "do not apply"),
        ({"victim": "nope"}, UnknownPolicyError, "valid"),
        ({"preempt_for": ("XX",)}, ValueError, "job classes"),
        ({"s": -1.0}, ValueError, "s must be"),
    ],
    ids=["s only for fitgpp", "unknown victim", "unknown class", "negative s"],
)
def test_preempting_rejects_bad_options(options: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        PLACEMENT.create("preempting", **options)


@dataclasses.dataclass(slots=True, kw_only=True)
class OwnerState(JobState):
    """An owner's subclass with a required field of its own (the simulator's ``SimJobState`` is one)."""

    token: object


def owned(j: JobState) -> OwnerState:
    return OwnerState(**{f.name: getattr(j, f.name) for f in dataclasses.fields(JobState)}, token=object())


def test_preempting_accepts_owner_subclasses_of_job_state() -> None:
    # same as "a victim launched earlier in the same walk": the launched be-new is copied as a
    # running JobState for the victim policy without calling the subclass's constructor
    items = [
        owned(fjob("be-old", gpus=2, on=(0, 1), grace=600.0)),
        owned(fjob("be-new", gpus=2, grace=30.0, submit=1.0, seq=1)),
        owned(fjob("te", kind="TE", gpus=2, submit=2.0, seq=2)),
    ]
    jobs = jobs_of(*items)
    state = cluster(1, 4, running=items[:1])
    ranking = SCHEDULING.create("fifo").rank(jobs, state, 0.0)
    placement = PLACEMENT.create("preempting").place(ranking, jobs, state, 0.0)
    assert allocation(placement) == {"be-old": (0, 1), "te": (2, 3)}
