"""The ETA of queued jobs (services/scheduler/eta.py): pure, on a snapshot of policy-level jobs."""

from __future__ import annotations

import asyncio
import pickle
from dataclasses import dataclass, field
from typing import Any

import pytest

from services.core.state import UNAVAILABLE, JobState, JobStatus
from services.scheduler.eta import (
    DURATIONS,
    GUESSED,
    EtaRefresher,
    EtaRequest,
    EtaSettings,
    EtaTable,
    fallback_durations,
    predict,
    prepare,
)
from services.scheduler.eta_leader import policy_in_force
from services.scheduler.queries import NO_ETA_YET, eta_fields
from tests.unit.policies.builders import assert_unchanged, cluster, frozen, job, jobs_of

NOW = 10_000.0


def running(job_id: str, gpu: int, *, duration: float | None, executed: float, seq: int, **kw: object) -> JobState:
    state = job(job_id, on=[gpu], duration=duration, executed=executed, submit=0, seq=seq, **kw)  # type: ignore[arg-type]
    state.first_start_time = NOW - executed
    state.last_start_time = NOW - executed
    return state


def waiting(job_id: str, *, duration: float | None, seq: int, gpus: int = 1, **kw: object) -> JobState:
    return job(job_id, gpus=gpus, duration=duration, submit=NOW - 100 + seq, seq=seq, queued_since=NOW - 100,
               **kw)  # type: ignore[arg-type]  # fmt: skip


def settings(policy: str = "fifo", **kw: Any) -> EtaSettings:
    base: dict[str, object] = {"scheduling": policy, "round_s": 60.0, "fill_between_rounds": True}
    base.update(kw)
    return EtaSettings(**base)  # type: ignore[arg-type]


@dataclass
class Case:
    name: str
    jobs: list[JobState]
    expect: dict[str, float | None]
    """Job -> expected ETA in seconds from NOW (None: no ETA)."""
    quality: dict[str, str] = field(default_factory=dict)
    gpus: int = 1
    settings: EtaSettings = field(default_factory=settings)
    order: tuple[str, ...] = ()


CASES = [
    Case(
        # a has 900 of 3000 s left to run: b starts when a ends (a fill round at the completion)
        "a queued job behind a running one starts when it ends",
        [running("a", 0, duration=3000, executed=2100, seq=1), waiting("b", duration=500, seq=2)],
        {"b": 900},
        {"b": DURATIONS},
    ),
    Case(
        "FIFO queues one behind the other",
        [running("a", 0, duration=1000, executed=0, seq=1), waiting("b", duration=500, seq=2),
         waiting("c", duration=500, seq=3)],
        {"b": 1000, "c": 1500},
    ),
    Case(
        "SRTF starts the shortest first",
        [running("a", 0, duration=1000, executed=0, seq=1), waiting("b", duration=500, seq=2),
         waiting("c", duration=100, seq=3)],
        # c preempts a at once (remaining 100 < 1000) and starts once a's checkpoint is written (10 s,
        # the default cost), then b (500 < 1000 left of a) at c's end
        {"c": 10, "b": 110},
        settings=settings("srtf", fill_between_rounds=False, round_s=1.0),
    ),
    Case(
        "a free GPU means now",
        [waiting("b", duration=500, seq=1)],
        {"b": 0},
        gpus=2,
    ),
    Case(
        "a job wider than the cluster has no ETA",
        [waiting("b", duration=500, seq=1, gpus=4)],
        {"b": None},
        gpus=2,
    ),
    Case(
        "past the horizon: no ETA",
        [running("a", 0, duration=10_000, executed=0, seq=1), waiting("b", duration=500, seq=2)],
        {"b": None},
        settings=settings(horizon_s=3600.0),
    ),
    Case(
        # a declares nothing; its user's other job declares 2000 s: a is expected to run 2000 s in all
        "a running job without a duration takes its user's median; those behind it are guessed",
        [running("a", 0, duration=None, executed=500, seq=1), waiting("b", duration=2000, seq=2)],
        {"b": 1500},
        {"b": GUESSED},
    ),
    Case(
        # c declares nothing but starts after b, so b's ETA rests on declared durations only
        "a guessed job later in the queue does not lower the quality of those ahead",
        [running("a", 0, duration=1000, executed=0, seq=1), waiting("b", duration=500, seq=2),
         waiting("c", duration=None, seq=3)],
        {"b": 1000, "c": 1500},
        {"b": DURATIONS, "c": GUESSED},
    ),
    Case(
        "beyond max_jobs: no ETA; the kept ones follow the last round's order",
        [running("a", 0, duration=1000, executed=0, seq=1), waiting("b", duration=500, seq=2),
         waiting("c", duration=500, seq=3)],
        {"c": 1000, "b": None},
        settings=settings(max_jobs=1),
        order=("a", "c", "b"),
    ),
    Case(
        "the time scale divides durations (an emulated cluster's speed-up)",
        [running("a", 0, duration=3000, executed=50, seq=1), waiting("b", duration=500, seq=2)],
        {"b": 100},
        settings=settings(time_scale=20.0, round_s=3.0),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_eta_case(case: Case) -> None:
    jobs = jobs_of(*case.jobs)
    state = cluster(nodes=1, per_node=case.gpus, running=[j for j in case.jobs if j.is_running])
    before = frozen(jobs, state)
    request = prepare(jobs, state, NOW, case.settings, order=case.order)
    assert_unchanged(before, jobs, state)
    table = pickle.loads(pickle.dumps(predict(pickle.loads(pickle.dumps(request)))))  # it crosses processes
    assert table.now == NOW
    for job_id, expected in case.expect.items():
        if expected is None:
            fields = eta_fields(job_id, NOW, table)
            assert set(fields) == {"eta_reason"}, (job_id, fields)
            assert fields["eta_reason"], job_id
            assert fields["eta_reason"] != NO_ETA_YET, job_id
        else:
            eta = table.etas[job_id]
            assert eta.start == pytest.approx(NOW + expected, abs=1.0), (job_id, eta)
            assert eta.reason is None
    for job_id, quality in case.quality.items():
        assert table.etas[job_id].quality == quality, job_id
    assert not {j.job_id for j in case.jobs if j.is_running} & set(table.etas)  # running jobs: no ETA


def test_beyond_max_jobs_says_why() -> None:
    jobs = jobs_of(running("a", 0, duration=1000, executed=0, seq=1), waiting("b", duration=5, seq=2),
                   waiting("c", duration=5, seq=3))  # fmt: skip
    table = predict(prepare(jobs, cluster(nodes=1, per_node=1, running=[jobs["a"]]), NOW, settings(max_jobs=1)))
    assert "c" not in table.etas
    assert eta_fields("c", NOW, table) == {
        "eta_reason": "beyond the first 1 queued jobs the ETA simulates (scheduler setting eta_max_jobs)"
    }


def test_no_queued_job_simulates_nothing() -> None:
    jobs = jobs_of(running("a", 0, duration=1000, executed=0, seq=1))
    table = predict(prepare(jobs, cluster(nodes=1, per_node=1, running=[jobs["a"]]), NOW, settings()))
    assert table.etas == {}
    assert table.simulated_s == 0.0


@pytest.mark.parametrize(
    ("jobs", "expect"),
    [
        pytest.param([job("x", user="u", kind="BE")], {"x": 3600.0}, id="nothing declared: the default"),
        pytest.param(
            [job("x", user="u"), job("y", user="u", duration=100), job("z", user="u", duration=300),
             job("w", user="v", duration=9000)],
            {"x": 200.0}, id="the median of the same user's jobs of the class",
        ),
        pytest.param([job("x", user="u"), job("w", user="v", duration=9000)], {"x": 9000.0},
                     id="else the median of the class"),
        pytest.param([job("x", user="u", kind="TE"), job("w", user="u", duration=9000)], {"x": 3600.0},
                     id="another class does not count"),
        pytest.param([job("x", executed=5000)], {"x": 10_000.0}, id="a job that ran longer runs as long again"),
    ],
)
def test_fallback_durations(jobs: list[JobState], expect: dict[str, float]) -> None:
    assert fallback_durations(jobs, 3600.0) == expect


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"horizon_s": 0.0}, "horizon_s"), ({"max_jobs": 0}, "max_jobs"), ({"default_duration_s": -1.0}, "default"),
     ({"time_scale": float("nan")}, "time_scale")],
)
def test_settings_reject_nonsense(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        settings(**kw)


def test_eta_fields_of_a_reply() -> None:
    table = predict(prepare(jobs_of(waiting("b", duration=5, seq=1)), cluster(nodes=1, per_node=1), NOW, settings()))
    assert eta_fields("b", NOW + 30, table) == {"eta_s": 0.0, "eta_time": NOW, "eta_quality": DURATIONS}
    assert eta_fields("new", NOW, table) == {"eta_reason": NO_ETA_YET}
    assert eta_fields("b", NOW, None) == {"eta_reason": NO_ETA_YET}
    assert "off" in str(eta_fields("b", NOW, table, enabled=False)["eta_reason"])


def test_the_synthesizer_is_simulated_as_its_combination_in_force() -> None:
    from services.core.registry import SCHEDULING

    synthesizer = SCHEDULING.create("synthesizer")
    name, opts = policy_in_force(synthesizer, "synthesizer", ())
    assert name != "synthesizer"
    assert name in SCHEDULING.names()
    assert opts == ()
    assert policy_in_force(SCHEDULING.create("las"), "las", (("x", 1),)) == ("las", (("x", 1),))


def test_refresher_runs_off_the_loop_and_only_when_asked() -> None:
    jobs = jobs_of(running("a", 0, duration=1000, executed=0, seq=1), waiting("b", duration=5, seq=2))
    request = prepare(jobs, cluster(nodes=1, per_node=1, running=[jobs["a"]]), NOW, settings(), epoch=3)
    pending: list[EtaRequest | None] = [None, request]

    async def scenario() -> tuple[EtaTable | None, EtaTable | None, EtaTable | None]:
        refresher = EtaRefresher(lambda: pending.pop(0) if pending else None, interval_s=1.0, executor="thread")
        try:
            first = await refresher.refresh()  # nothing due
            second = await refresher.refresh()
            third = await refresher.refresh()  # nothing due again: the table stays
        finally:
            await refresher.stop()
        assert refresher.table is second
        assert refresher.runs == 1
        return first, second, third

    first, second, third = asyncio.run(scenario())
    assert first is None
    assert third is None
    assert second is not None
    assert second.epoch == 3
    assert second.elapsed_s > 0
    assert second.etas["b"].start == pytest.approx(NOW + 1000, abs=1)


def test_refresher_survives_a_failing_snapshot() -> None:
    def broken() -> EtaRequest | None:
        raise RuntimeError("boom")

    async def scenario() -> EtaRefresher:
        refresher = EtaRefresher(broken, interval_s=1.0, executor="thread")
        assert await refresher.refresh() is None
        return refresher

    refresher = asyncio.run(scenario())
    assert refresher.failures == 1
    assert refresher.next_wait_s >= 1.0


def test_refresher_backs_off_after_failures_and_recovers() -> None:
    jobs = jobs_of(waiting("b", duration=5, seq=1))
    request = prepare(jobs, cluster(nodes=1, per_node=1), NOW, settings())
    outcomes: list[EtaRequest | Exception] = [RuntimeError("1"), RuntimeError("2"), RuntimeError("3"), request]

    def take() -> EtaRequest | None:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def scenario() -> list[float]:
        refresher = EtaRefresher(take, interval_s=1.0, executor="thread")
        waits = []
        try:
            for _ in range(4):
                await refresher.refresh()
                waits.append(refresher.next_wait_s)
        finally:
            await refresher.stop()
        assert refresher.table is not None
        return waits

    waits = asyncio.run(scenario())
    assert waits[:3] == [1.0, 2.0, 4.0]
    assert waits[3] < 2.0  # a success ends the back-off


def test_held_jobs_are_not_simulated() -> None:
    held = waiting("h", duration=5, seq=2)
    held.status = JobStatus.HELD
    jobs = jobs_of(waiting("b", duration=5, seq=1), held)
    table = predict(prepare(jobs, cluster(nodes=1, per_node=1), NOW, settings()))
    assert set(table.etas) == {"b"}


@pytest.mark.parametrize("policy", ["fifo", "srtf", "las"])
def test_without_later_arrivals_the_eta_is_the_simulators_own_start(policy: str) -> None:
    """The ETA of jobs that all wait now equals their first start in a plain simulation of the same
    jobs arriving at once (the same engine, policies and rounds): what the snapshot translation
    (durations, first starts cleared, order) must preserve."""
    from services.core.registry import ADMISSION, PLACEMENT, SCHEDULING
    from services.core.simulation.engine import SimConfig, Simulator
    from services.core.simulation.workload import TraceJob

    sizes = [(1, 900.0), (2, 300.0), (4, 1200.0), (1, 60.0), (2, 2400.0), (1, 450.0), (4, 100.0), (2, 700.0)]
    queued = [waiting(f"j{i}", duration=d, gpus=g, seq=i) for i, (g, d) in enumerate(sizes)]
    for state in queued:  # all submitted now, as the simulation's arrivals at 0
        state.submit_time = state.queued_since = NOW
        state.admit_time = NOW
    st = settings(policy, round_s=60.0, fill_between_rounds=True)
    table = predict(prepare(jobs_of(*queued), cluster(nodes=1, per_node=4), NOW, st))

    trace = [TraceJob(index=i, arrival_s=0.0, gpus=g, duration_s=d) for i, (g, d) in enumerate(sizes)]
    simulator = Simulator(
        trace, cluster(nodes=1, per_node=4), admission=ADMISSION.create("accept-all"),
        scheduling=SCHEDULING.create(policy), placement=PLACEMENT.create("consolidated"),
        config=SimConfig(round_s=60.0, fill_between_rounds=True, record_jobs=True),
    )  # fmt: skip
    out = simulator.run()
    starts = dict(zip(out.job_index, out.first_start, strict=True))
    assert len(starts) == len(sizes)
    for i in range(len(sizes)):
        eta = table.etas[f"j{i}"]
        assert eta.start is not None
        assert eta.start - NOW == pytest.approx(starts[i], abs=1e-6), (i, eta, starts)


@pytest.mark.parametrize(
    ("jobs", "withheld", "expect"),
    [
        pytest.param(
            [running("a", 0, duration=1000, executed=0, seq=1), waiting("b", duration=500, seq=2)],
            (1,), {"b": 1000.0}, id="a drained node's free GPU does not start a queued job",
        ),
        pytest.param(
            [running("a", 0, duration=1000, executed=0, seq=1), running("c", 1, duration=200, executed=0, seq=2),
             waiting("b", duration=500, seq=3)],
            (1,), {"b": 1000.0}, id="a job running on a drained node ends there; its GPU stays withheld",
        ),
        pytest.param(
            [running("a", 0, duration=1000, executed=0, seq=1), waiting("b", duration=500, seq=2)],
            (), {"b": 0.0}, id="nothing withheld: the free GPU means now",
        ),
        pytest.param(
            [waiting("b", duration=500, seq=1)], (0, 1), {"b": None}, id="every node drained: no ETA",
        ),
    ],
)
def test_withheld_gpus_do_not_shorten_an_eta(
    jobs: list[JobState], withheld: tuple[int, ...], expect: dict[str, float | None]
) -> None:
    by_id = jobs_of(*jobs)
    state = cluster(nodes=2, per_node=1, running=[j for j in jobs if j.is_running])
    request = prepare(by_id, state, NOW, settings(horizon_s=3600.0), withheld=withheld)
    assert request.snapshot.withheld == frozenset(withheld)
    table = predict(pickle.loads(pickle.dumps(request)))
    for job_id, expected in expect.items():
        if expected is None:
            assert table.etas[job_id].start is None, table.etas[job_id]
            assert table.etas[job_id].reason
        else:
            assert table.etas[job_id].start == pytest.approx(NOW + expected, abs=1.0), table.etas[job_id]


def test_a_rounds_unavailable_marker_is_withheld_in_the_snapshot() -> None:
    """A round's cluster (the synthesizer's input) holds a drained node's free GPUs with the
    UNAVAILABLE marker: the snapshot withholds them without being told."""
    jobs = jobs_of(running("a", 0, duration=1000, executed=0, seq=1), waiting("b", duration=500, seq=2))
    state = cluster(nodes=2, per_node=1, running=[jobs["a"]])
    state.assign(UNAVAILABLE, (1,))
    request = prepare(jobs, state, NOW, settings())
    assert request.snapshot.withheld == frozenset({1})
    assert predict(request).etas["b"].start == pytest.approx(NOW + 1000, abs=1.0)


def test_a_marked_nodes_running_jobs_gpus_are_withheld_too() -> None:
    """The marker holds a drained node's free GPUs only; the GPU its job runs on stays closed after."""
    jobs = jobs_of(running("a", 0, duration=1000, executed=0, seq=1), running("x", 1, duration=1000, executed=0, seq=2),
                   running("c", 2, duration=200, executed=0, seq=3), waiting("b", duration=500, seq=4))  # fmt: skip
    state = cluster(nodes=2, per_node=2, running=[jobs["a"], jobs["x"], jobs["c"]])
    state.assign(UNAVAILABLE, (3,))
    request = prepare(jobs, state, NOW, settings())
    assert request.snapshot.withheld == frozenset({2, 3})
    assert predict(request).etas["b"].start == pytest.approx(NOW + 1000, abs=1.0)
