"""Blox §5.2 automatic scheduler synthesizer: candidate set, cadence and the choice of the best."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from roundhouse.sim.case import Case, run_case
from roundhouse.sim.synthetic import PhillySynthetic
from services.admission.service import AdmissionConfig
from services.core import ADMISSION, PLACEMENT, SCHEDULING
from services.core.simulation.engine import SimConfig, Simulator
from services.core.state import ClusterState, JobState, JobStatus
from services.scheduler.config import SchedulerConfig
from services.scheduler.policies.synthesis import synthesizer_pair
from services.scheduler.policies.synthesizer import CANDIDATES, Combination, choose_best, should_synthesize
from tests.unit.policies.builders import assert_unchanged, cluster, frozen, job, jobs_of

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
        "tied without the current one: the one that keeps its admission policy",
        {**results(), **{BY_LABEL[f"srtf+{a}"]: 900.0 for a in ("accept-all", "accept-1.2x", "accept-1.4x")}},
        {"current": BY_LABEL["las+accept-1.4x"]},
        "srtf+accept-1.4x",
    ),
    (
        "tied without the current one: or the one that keeps its scheduling policy",
        {**results(), BY_LABEL["srtf+accept-all"]: 900.0, BY_LABEL["las+accept-1.2x"]: 900.0},
        {"current": BY_LABEL["las+accept-1.4x"]},
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


# --- the registered policies (services.scheduler.policies.synthesis) ----------------------------------


def long_and_short(now: float = 0.0) -> tuple[dict[str, JobState], ClusterState]:
    """One GPU: a long job running (lots of service), three short ones waiting behind it."""
    running = job("long", on=[0], duration=50_000, executed=1000, service=1000, seq=0)
    shorts = [job(f"s{i}", duration=300, submit=10 + i, seq=1 + i, queued_since=10 + i) for i in range(3)]
    return jobs_of(running, *shorts), cluster(1, 1, running=[running])


def test_round_zero_switches_to_the_best_and_ranks_with_it() -> None:
    scheduling, _ = synthesizer_pair(free_preemption=True)
    jobs, state = long_and_short()
    before = frozen(jobs, state)
    ranking = scheduling.rank(jobs, state, 100.0)
    assert_unchanged(before, jobs, state)
    record = scheduling.synthesis.history[-1]
    # FIFO leaves the long job running: every short job waits 49,000 s; SRTF and LAS run them first
    # and tie, so the canonical order picks SRTF, whose ranking this round is
    assert (record.previous, record.chosen, record.jobs) == ("fifo+accept-all", "srtf+accept-all", 4)
    values = dict(record.values)
    assert values["srtf+accept-all"] == values["las+accept-all"] < values["fifo+accept-all"]
    assert list(ranking.order) == list(SCHEDULING.create("srtf").rank(jobs, state, 100.0).order)


CADENCE = [
    ("Blox: every ten rounds", {}, 25, [0, 10, 20]),
    ("every three rounds", {"every": 3}, 7, [0, 3, 6]),
]


@pytest.mark.parametrize(("options", "rounds", "expected"), [c[1:] for c in CADENCE], ids=[c[0] for c in CADENCE])
def test_synthesis_cadence(options: dict[str, object], rounds: int, expected: list[int]) -> None:
    scheduling, _ = synthesizer_pair(**options)
    jobs, state = long_and_short()
    for r in range(rounds):
        scheduling.rank(jobs, state, 300.0 * r)
    assert [rec.round_index for rec in scheduling.synthesis.history] == expected


def test_a_tie_keeps_the_combination_running_now() -> None:
    scheduling, _ = synthesizer_pair(initial="las+accept-1.4x")
    alone = job("only", on=[0], duration=600)
    scheduling.rank(jobs_of(alone), cluster(1, 1, running=[alone]), 0.0)
    assert str(scheduling.synthesis.current) == "las+accept-1.4x"


def test_admission_delegates_and_its_held_jobs_are_simulated() -> None:
    scheduling, admission = synthesizer_pair(initial="fifo+accept-1.2x", every=1)
    jobs, state = long_and_short()
    scheduling.rank(jobs, state, 0.0)  # no held jobs: the admissions tie and Accept-1.2x stays
    assert str(scheduling.synthesis.current) == "srtf+accept-1.2x"
    offered = [job(f"new{i}", duration=60, submit=20 + i, seq=10 + i, status=JobStatus.HELD) for i in range(2)]
    verdict = admission.admit(offered, jobs, state, 300.0)
    # demand 4 GPUs > 1.2 x 1: Accept-1.2x holds both (exactly what load-threshold does)
    expected = ADMISSION.create("load-threshold", factor=1.2).admit(offered, jobs, state, 300.0)
    assert verdict == expected
    assert verdict.held == ("new0", "new1")
    scheduling.rank(jobs, state, 300.0)
    assert scheduling.synthesis.history[-1].jobs == 4 + 2
    scheduling.rank(jobs, state, 600.0)  # held jobs are reported per round: none this time
    assert scheduling.synthesis.history[-1].jobs == 4


def test_a_job_without_duration_skips_synthesis_and_keeps_the_policy() -> None:
    scheduling, _ = synthesizer_pair(initial="las+accept-all")
    jobs = jobs_of(job("unknown", duration=None), job("known", duration=60, seq=1))
    scheduling.rank(jobs, cluster(1, 1), 0.0)
    record = scheduling.synthesis.history[-1]
    assert str(scheduling.synthesis.current) == "las+accept-all"
    assert "unknown" in record.skipped
    assert record.values == ()


def test_admission_alone_synthesizes_on_time() -> None:
    admission = ADMISSION.create("synthesizer", group="alone", round_s=60.0, every=2)
    synthesis = admission.synthesis  # type: ignore[attr-defined]
    jobs, state = long_and_short()
    for now in (0.0, 60.0, 119.0, 120.0, 200.0, 240.0):
        admission.admit([], jobs, state, now)
    assert [rec.now for rec in synthesis.history] == [0.0, 120.0, 240.0]


PAIRING = [
    ("same group, same options: one decision", ({"group": "p1"}, {"group": "p1"}), True),
    ("other group: separate", ({"group": "p2"}, {"group": "p3"}), False),
    ("same group, other options: separate", ({"group": "p4", "every": 3}, {"group": "p4", "every": 4}), False),
]


@pytest.mark.parametrize(("options", "shared"), [c[1:] for c in PAIRING], ids=[c[0] for c in PAIRING])
def test_registered_policies_pair_by_group(options: tuple[dict[str, object], dict[str, object]], shared: bool) -> None:
    admission = ADMISSION.create("synthesizer", **options[0])
    scheduling = SCHEDULING.create("synthesizer", **options[1])
    assert (admission.synthesis is scheduling.synthesis) is shared  # type: ignore[attr-defined]


def test_a_newer_policy_of_the_same_kind_takes_the_pairing() -> None:
    ADMISSION.create("synthesizer", group="p5")  # e.g. a configuration check's throw-away instance
    admission = ADMISSION.create("synthesizer", group="p5")
    scheduling = SCHEDULING.create("synthesizer", group="p5")
    assert admission.synthesis is scheduling.synthesis  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"metric": "utilization"}, "cannot optimize"),
        ({"every": 0}, "positive"),
        ({"initial": "fifo+accept-2x"}, "initial"),
        ({"workers": 0}, "workers"),
        ({"horizon_s": -5.0}, "horizon_s"),
    ],
    ids=["metric", "every", "initial", "workers", "horizon"],
)
def test_bad_options(options: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SCHEDULING.create("synthesizer", **options)


def test_runs_in_the_simulator_by_name() -> None:
    case = Case(scheduler="synthesizer", admission="synthesizer", cluster="2x2", jobs_per_hour=3.0, num_jobs=25)
    report = run_case(case).report
    assert report["jobs"] == 25
    assert report["unfinished"] == 0
    assert report["rounds"] > 10


def test_runs_in_the_simulator_as_a_pair() -> None:
    scheduling, admission = synthesizer_pair(initial="las+accept-1.2x")
    out = Simulator(
        PhillySynthetic(jobs_per_hour=3.0, seed=2, num_jobs=25),
        ClusterState.uniform(2, 2),
        admission=admission,
        scheduling=scheduling,
        placement=PLACEMENT.create("consolidated"),
        config=SimConfig(debug=True),
    ).run()
    assert out.completed == 25
    history = scheduling.synthesis.history
    assert history[0].round_index == 0
    assert all(rec.round_index % 10 == 0 for rec in history)
    assert len(history) >= out.rounds // 10
    shares = scheduling.synthesis.time_shares(out.end_time)
    assert sum(shares.values()) == pytest.approx(out.end_time - history[0].now)


def test_the_services_configure_it_by_name_with_options() -> None:
    scheduler = SchedulerConfig(policy="synthesizer", policy_options={"metric": "avg_responsiveness_s", "every": 5})
    admission = AdmissionConfig(policy="synthesizer", policy_options={"round_s": 60.0})
    assert (scheduler.policy, admission.policy) == ("synthesizer", "synthesizer")
    with pytest.raises(ValidationError, match="cannot optimize"):
        SchedulerConfig(policy="synthesizer", policy_options={"metric": "utilization"})
