"""GPU packing in the simulator (``services.core.simulation.packing``) with the ``gandiva`` policy.

Numbers are derived from ``services.core.packing``'s model in the comments: a job of utilization
``u_i`` and sensitivity ``s_i`` on a GPU with jobs of total utilization ``U <= 1`` runs at
``1 / (1 + s_i * (U - u_i))`` of its solo speed."""

from __future__ import annotations

import dataclasses

import pytest

from roundhouse.sim.case import Case, packing_options, run_case
from roundhouse.sim.cluster import uniform_cluster
from roundhouse.sim.synthetic import GpuCounts, PhillySynthetic
from services.core import ADMISSION, PLACEMENT, SCHEDULING
from services.core.costs import CostModel, ModelCosts
from services.core.packing import DEFAULT_PROFILES, MAX_JOBS_PER_GPU, PackingModel
from services.core.protocols import Trigger
from services.core.simulation.engine import Outcome, SimConfig, SimulationError, Simulator
from services.core.simulation.forward import ForwardSettings, run_forward, take_snapshot
from services.core.simulation.invariants import InvariantError, check_invariants
from services.core.simulation.packing import PackingSimulator
from services.core.simulation.workload import TraceJob
from services.core.state import ClusterState
from services.scheduler.eta import EtaSettings, options, predict, prepare
from tests.unit.policies.builders import cluster, job, jobs_of

FREE = CostModel.free()
PACKING = PackingModel()


def tj(index: int, arrival: float, duration: float, model: str, gpus: int = 1) -> TraceJob:
    return TraceJob(index=index, arrival_s=arrival, gpus=gpus, duration_s=duration, model=model)


def packing_sim(
    jobs: list[TraceJob],
    *,
    gpus: int = 1,
    packing: PackingModel | None = PACKING,
    profiles: bool = True,
    **config: object,
) -> PackingSimulator:
    options: dict[str, object] = {"round_s": 60.0, "costs": FREE, "debug": True, "extra_triggers": Trigger.CHURN}
    options.update(config)
    return PackingSimulator(
        jobs,
        ClusterState.uniform(1, gpus),
        admission=ADMISSION.create("accept-all"),
        scheduling=SCHEDULING.create("rr", quantum_s=60.0),
        placement=PLACEMENT.create("gandiva", profiles=PACKING.policy_profiles() if profiles else None),
        config=SimConfig(**options),  # type: ignore[arg-type]
        packing=packing,
    )


def test_two_light_jobs_share_one_gpu_at_the_modelled_slowdown() -> None:
    # Two A3C jobs (u = 0.25, s = 0.3) on one GPU: U = 0.5, each runs at 1 / (1 + 0.3 * 0.25) of its
    # speed, so 1000 s of work each ends at 1075 s, together; alone one after the other: 2000 s.
    sim = packing_sim([tj(0, 0.0, 1000.0, "a3c"), tj(1, 0.0, 1000.0, "a3c")])
    out = sim.run()
    assert out.completed == 2
    assert sim.packed_launches == 1
    assert list(out.jct) == pytest.approx([1075.0, 1075.0])
    # The GPU counts once: held and productive for the whole 1075 s, not 2 x 1075 GPU-seconds.
    assert out.busy_gpu_s == pytest.approx(1075.0)
    assert out.productive_gpu_s == pytest.approx(1075.0)


def test_a_leaving_co_tenant_gives_the_other_its_full_speed_back() -> None:
    # A3C (u .25, s .3) with 500 s of work and Recoder (u .3, s .5) with 1000 s. Packed:
    # A3C at 1 / (1 + .3 * .3) = 1/1.09 -> done at 545 s; Recoder at 1 / (1 + .5 * .25) = 1/1.125
    # -> 545 / 1.125 = 484.44 s of work by then, the other 515.56 s alone at full speed: ends at 1060.56.
    sim = packing_sim([tj(0, 0.0, 500.0, "a3c"), tj(1, 0.0, 1000.0, "recoder")])
    out = sim.run()
    assert sorted(out.jct) == pytest.approx([545.0, 545.0 + 1000.0 - 545.0 / 1.125])
    assert out.busy_gpu_s == pytest.approx(max(out.jct))


def test_jobs_report_their_mini_batch_times() -> None:
    # Solo iteration times are the profiles'; packed, they stretch by 1 / rate (what introspection reads).
    sim = packing_sim([tj(0, 0.0, 1000.0, "a3c"), tj(1, 0.0, 1000.0, "a3c")], max_time_s=30.0)
    sim.run()
    solo = DEFAULT_PROFILES["a3c"].iteration_s
    assert [job.iteration_time_s for job in sim.active.values()] == pytest.approx([solo * 1.075] * 2)


def test_a_pair_that_loses_to_time_slicing_is_unpacked() -> None:
    # Two LSTM jobs fit (memory 2 x 4.5 GB, U = 1.0) so gandiva packs them at 0, but each runs at
    # 1 / (1 + 2.5 * 0.5) = 0.444 of its speed: 0.89 < 1, worse than time-slicing. The next round
    # (60 s) reads their mini-batch times, marks the pair failed and runs one of them at a time.
    jobs = [tj(0, 0.0, 5000.0, "lstm"), tj(1, 0.0, 5000.0, "lstm")]
    sim = packing_sim(jobs, max_time_s=90.0)
    sim.run()
    assert sim.packed_launches == 1
    assert [len(holders) for holders in sim.cluster.gpu_jobs] == [1]
    assert sim.placement.failed_pairs == {frozenset({"0", "1"})}  # type: ignore[attr-defined]
    assert sim.cluster.shared_gpus == set()


def test_memory_that_does_not_fit_is_never_shared() -> None:
    # A Transformer (13 GB) runs on the 16 GB GPU; a second one would need 26 GB: the engine would
    # refuse such a plan; an A3C (1.5 GB) fits beside it (whether it is worth packing is the policy's
    # call: utilizations 0.9 + 0.25 > 1, so gandiva does not).
    jobs = [tj(0, 0.0, 1000.0, "transformer"), tj(1, 0.0, 1000.0, "transformer"), tj(2, 0.0, 1000.0, "a3c")]
    sim = packing_sim(jobs, max_time_s=1.0)
    sim.run()
    assert sim.cluster.gpu_jobs[0] == ("0",)
    assert sim._may_share(sim._jobs["1"], 0) is False
    assert sim._may_share(sim._jobs["2"], 0) is True


def test_without_a_packing_plan_a_busy_gpu_is_still_refused() -> None:
    # Packing off in the simulator: the policy's packed plan is the error it always was.
    sim = packing_sim([tj(0, 0.0, 1000.0, "a3c"), tj(1, 0.0, 1000.0, "a3c")], packing=None)
    with pytest.raises(SimulationError, match="which is not free"):
        sim.run()


def test_invariants_accept_only_gpus_a_packing_plan_shared() -> None:
    cluster = ClusterState.uniform(1, 2)
    cluster.assign("a", (0,))
    cluster.assign("b", (0,))
    with pytest.raises(InvariantError, match="double-booked"):
        check_invariants({}, [], {}, cluster, 0.0)
    cluster.mark_shared((0,))
    assert cluster.shared_gpus == {0}
    cluster.release("b", (0,))
    assert cluster.shared_gpus == set()


def _outcome_fields(out: Outcome) -> tuple[object, ...]:
    return (
        list(out.jct),
        list(out.responsiveness),
        list(out.run),
        out.busy_gpu_s,
        out.productive_gpu_s,
        out.rounds,
        out.all_preemptions,
        out.end_time,
    )


def test_packing_off_is_the_engine_bit_for_bit() -> None:
    # A Gandiva run without profiles (so no packed plans): PackingSimulator(packing=None) and the
    # engine give identical outcomes, float for float.
    cluster = uniform_cluster("2x4")
    workload = list(PhillySynthetic(jobs_per_hour=40.0, seed=3, gpu_counts=GpuCounts.gavel(), num_jobs=16))

    def run(cls: type[Simulator], **extra: object) -> Outcome:
        return cls(
            workload,
            uniform_cluster("2x4"),
            admission=ADMISSION.create("accept-all"),
            scheduling=SCHEDULING.create("rr", quantum_s=60.0),
            placement=PLACEMENT.create("gandiva"),
            config=SimConfig(round_s=60.0, extra_triggers=Trigger.CHURN),
            **extra,  # type: ignore[arg-type]
        ).run()

    assert cluster.total_gpus == 8
    assert _outcome_fields(run(PackingSimulator, packing=None)) == _outcome_fields(run(Simulator))


def test_packing_a_synthetic_burst_keeps_invariants_and_counts_gpus_once() -> None:
    # 20 jobs at twice the capacity of 2x4 GPUs, debug on (invariants after every event, GPU time
    # productive <= busy <= capacity): packing happens and every job completes.
    workload = list(PhillySynthetic(jobs_per_hour=20.0, seed=1, gpu_counts=GpuCounts.gavel(), num_jobs=20))
    sim = PackingSimulator(
        workload,
        uniform_cluster("2x4"),
        admission=ADMISSION.create("accept-all"),
        scheduling=SCHEDULING.create("rr", quantum_s=60.0),
        placement=PLACEMENT.create("gandiva", profiles=PACKING.policy_profiles()),
        config=SimConfig(round_s=60.0, extra_triggers=Trigger.CHURN, debug=True),
        packing=PACKING,
    )
    out = sim.run()
    assert out.completed == 20
    assert sim.packed_launches > 0
    assert out.productive_gpu_s <= out.busy_gpu_s <= out.total_gpus * out.end_time


def test_the_forward_simulation_runs_packed_plans_when_told_the_scheduler_packs() -> None:
    # The ETA's forward run from a live snapshot: an A3C job runs on the only GPU, another waits.
    # gandiva with profiles packs the waiting one beside it; the plain engine refuses that plan, the
    # packing run (ForwardSettings.packing, set from SchedulerConfig.packing) runs it: both end at
    # 1075 s of packed progress (as in the first test), not one after the other.
    jobs = jobs_of(
        job("a", on=[0], duration=1000, submit=0, seq=1, model="a3c"),
        job("b", duration=1000, submit=0, seq=2, queued_since=0, model="a3c"),
    )
    snapshot = take_snapshot(jobs, cluster(1, 1, running=[jobs["a"]]), 0.0)

    def forward(packing: bool) -> Outcome:
        settings = ForwardSettings(costs=FREE, triggers=Trigger.TIMER | Trigger.CHURN, round_s=60.0, packing=packing)
        out, _ = run_forward(
            snapshot, admission=ADMISSION.create("accept-all"), scheduling=SCHEDULING.create("rr", quantum_s=60.0),
            placement=PLACEMENT.create("gandiva", profiles=PACKING.policy_profiles()), settings=settings,
        )  # fmt: skip
        return out

    with pytest.raises(SimulationError, match="which is not free"):
        forward(packing=False)
    assert sorted(forward(packing=True).jct) == pytest.approx([1075.0, 1075.0])


def test_locality_migration_in_the_simulator_ends_the_spread_job_sooner() -> None:
    # 2 servers of 4. At 0: seven 1-GPU jobs fill GPUs 0-6 (3 and 6 are short: 5 s and 50 s). At 10
    # a 2-GPU job arrives and gets GPUs 3 and 7, on two servers: it runs at half speed (spread
    # slowdown 2, no other cost). At 50 GPU 6 frees: with locality it moves to GPUs 6-7 (one server)
    # having done 20 s of its 1000 s, and ends at 50 + 980 = 1030; without, at 10 + 2000 = 2010.
    costs = CostModel(models={}, default=ModelCosts(checkpoint_s=0.0, restore_s=0.0, relaunch_s=0.0,
                                                     spread_slowdown=2.0))  # fmt: skip
    durations = [10_000.0, 10_000.0, 10_000.0, 5.0, 10_000.0, 10_000.0, 50.0]
    jobs = [TraceJob(index=i, arrival_s=0.0, gpus=1, duration_s=d) for i, d in enumerate(durations)]
    jobs.append(TraceJob(index=7, arrival_s=10.0, gpus=2, duration_s=1000.0))

    def finish_of_the_wide_job(locality: bool) -> float:
        sim = Simulator(
            jobs, ClusterState.uniform(2, 4), admission=ADMISSION.create("accept-all"),
            scheduling=SCHEDULING.create("rr", quantum_s=60.0),
            placement=PLACEMENT.create("gandiva", locality=locality),
            config=SimConfig(round_s=60.0, extra_triggers=Trigger.CHURN, costs=costs, debug=True, record_jobs=True),
        )  # fmt: skip
        out = sim.run()
        (k,) = [k for k, index in enumerate(out.job_index) if index == 7]
        return out.submit[k] + out.jct[k]

    assert finish_of_the_wide_job(locality=False) == pytest.approx(2010.0)
    assert finish_of_the_wide_job(locality=True) == pytest.approx(1030.0)


def test_a_simulation_case_packs_with_packing_on() -> None:
    # roundhouse simulate --packing: gandiva gets the model's profiles and PackingSimulator runs the
    # packed plans; the same profiles without --packing make plans the engine refuses.
    case = Case(workload="philly-synthetic", gpus="gavel", cluster="2x4", jobs_per_hour=20.0, num_jobs=20,
                scheduler="rr", scheduler_options={"quantum_s": 60.0}, placement="gandiva", round_s=60.0,
                round_on=("churn",), packing=True, debug=True)  # fmt: skip
    assert run_case(case).report["jobs"] == 20
    with pytest.raises(SimulationError, match="which is not free"):
        run_case(dataclasses.replace(case, packing=False, placement_options={"profiles": PACKING.policy_profiles()}))
    assert packing_options("consolidated", {}, PACKING) == {}  # takes no profiles: unchanged
    assert packing_options("gandiva", {}, PACKING) == {"profiles": PACKING.policy_profiles()}
    assert packing_options("gandiva", {"profiles": {}}, PACKING) == {"profiles": {}}


def test_a_gpu_is_never_packed_beyond_the_live_bound() -> None:
    # Three A3C jobs (1.5 GB each) would fit a 16 GB GPU together, but the live scheduler and worker
    # take at most MAX_JOBS_PER_GPU (2) jobs per GPU: the simulator refuses the third as they do.
    assert MAX_JOBS_PER_GPU == 2
    sim = packing_sim([tj(i, 0.0, 1000.0, "a3c") for i in range(3)], max_time_s=1.0)
    sim.run()
    assert sorted(sim.cluster.gpu_jobs[0]) == ["0", "1"]
    assert PACKING.fits(["a3c"] * 3, sim.cluster.gpus[0].memory_mb)
    assert sim._may_share(sim._jobs["2"], 0) is False


def test_the_eta_keeps_a_running_packed_pair_packed() -> None:
    # The live scheduler packs (EtaSettings.packing): a and b (A3C, 1000 s left each) run packed on
    # the only GPU, c (A3C, submitted first, e.g. resubmitted after a suspension) waits under FIFO,
    # which never preempts, and the GPU holds two jobs, the most it takes: c starts once the pair
    # ends, at 1000 * (1 + 0.3 * 0.25) = 1075 s of packed progress (the first test's rate). Before,
    # the forward run could not put b back beside a (its GPU was not free), simulated b as waiting
    # and FIFO then packed c beside a at once: an ETA of now.
    now = 10_000.0
    pair = [
        job(name, on=[0], duration=1000, submit=now - 50 + seq, seq=seq, model="a3c", started=now, executed=0.0)
        for name, seq in (("a", 1), ("b", 2))
    ]
    waiting = job("c", duration=1000, submit=now - 100, seq=0, queued_since=now - 100, model="a3c")
    live = cluster(1, 1, running=pair)
    live.mark_shared((0,))
    eta_settings = EtaSettings(
        scheduling="fifo", placement="gandiva", placement_options=options({"profiles": PACKING.policy_profiles()}),
        round_s=60.0, packing=True,
    )  # fmt: skip
    table = predict(prepare(jobs_of(*pair, waiting), live, now, eta_settings))
    eta = table.etas["c"].start
    assert eta is not None
    assert eta - now == pytest.approx(1075.0)
