"""Conformance: every registered policy of every kind, on every scenario, keeps the policy contract.

The policies come from the registries (``services.core.ADMISSION``, ``SCHEDULING``, ``PLACEMENT``,
``VICTIM``), so a policy added with its decorator is picked up here without touching this file; a
policy that cannot be built with its defaults needs its options in ``OPTIONS`` below (the suite
fails and says so otherwise). For each policy and each snapshot of ``scenarios.py``:

* **purity**: jobs, cluster (every slot, private indexes included), offered jobs, the running list
  and the ranking's maps are unchanged after the call; the call reads no clock and opens no file;
* **determinism**: a second policy built the same way, on deep copies of the same inputs, decides
  the same (policies that keep history between rounds, such as ``hermes`` or ``gandiva``
  placement, are deterministic for the same sequence of calls: each check starts a fresh one);
  ``test_decisions_do_not_depend_on_the_hash_seed`` repeats every decision in two processes;
* **validity**: an admission gives every offered job exactly one verdict; a ranking orders every
  given job once and terminates or resizes only given jobs; a placement puts only given jobs on
  existing GPUs, one job per GPU (so a launch uses free GPUs or GPUs of jobs it suspends), each
  with a GPU count its spec, its elastic range or the ranking's target allows; victims are running
  jobs, each named once;
* **fast paths equal the reference**: a sort-keyed scheduling policy's incremental order
  (``services.core.ordering.KeyedOrder``, as the simulator keeps it) equals ``rank()``, now and
  later (expiring keys); a ``Placement.plan`` hint equals ``diff_plan`` without it; the declared
  promises hold (``preemptive=False`` rankings never preempt, ``keeps_running`` placements change
  nothing when nobody waits, ``accepts_all`` admissions accept everything).

The live differential check — a round recorded on the live path (the scheduler, the bus and the
placement service) gives the same ranking and plan as the simulator's round functions
(``services.core.round``) on the same snapshot — runs every registered placement policy in
``tests/integration/test_round_differential.py`` (it needs a real nats-server).
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from services.core import ADMISSION, PLACEMENT, SCHEDULING, VICTIM, Registry
from services.core.decisions import Admission, Placement, Plan, Ranking
from services.core.ordering import KeyedOrder
from services.core.protocols import (
    AdmissionPolicy,
    PlacementPolicy,
    SchedulingPolicy,
    Trigger,
    VictimPolicy,
    accepts_all,
    is_preemptive,
    is_sort_keyed,
    keeps_running,
)
from services.core.round import diff_plan
from services.core.state import ClusterState, JobState
from tests.unit.conformance.scenarios import BUILDERS, Scenario

# Options for policies that cannot be built with their defaults, or whose defaults would leave the
# scenarios nothing to decide. Keyed by (kind, registered name); every other policy is built as
# ``REGISTRY.create(name)``. Add an entry when you add a policy that needs one.
OPTIONS: dict[tuple[str, str], dict[str, Any]] = {
    # The synthesizer's scheduling and admission halves pair up by group within a process
    # (services.scheduler.policies.synthesis); separate groups keep each check's instances apart.
    ("scheduling", "synthesizer"): {"group": "conformance-scheduling"},
    ("admission", "synthesizer"): {"group": "conformance-admission"},
    # No limit by default (it would accept everything); a quota makes it hold jobs.
    ("admission", "user-quota"): {"max_gpus": 3},
}

REGISTRIES: dict[str, Registry[Any]] = {
    "admission": ADMISSION,
    "scheduling": SCHEDULING,
    "placement": PLACEMENT,
    "victim": VICTIM,
}
PROTOCOLS: dict[str, type] = {
    "admission": AdmissionPolicy,
    "scheduling": SchedulingPolicy,
    "placement": PlacementPolicy,
    "victim": VictimPolicy,
}
SCENARIOS = sorted(BUILDERS)


def build(kind: str, name: str) -> Any:
    """The policy ``name`` of ``kind``, with its options from ``OPTIONS``; a clear failure otherwise."""
    options = OPTIONS.get((kind, name), {})
    try:
        return REGISTRIES[kind].create(name, **options)
    except (TypeError, ValueError) as exc:
        given = f"options {options}" if options else "its default options"
        pytest.fail(
            f"{kind} policy {name!r} cannot be built with {given}: {exc}. The conformance suite builds every "
            f"registered policy: add the options it needs to OPTIONS[({kind!r}, {name!r})] in {__file__}.",
            pytrace=False,
        )


def _names_where(kind: str, declares: Callable[[Any], bool]) -> list[str]:
    """Registered ``kind`` names whose policy (built with defaults) ``declares`` a fast path; a policy
    that cannot be built is included, so that its test fails with ``build``'s message."""
    names = []
    for name in REGISTRIES[kind].names():
        try:
            policy = REGISTRIES[kind].create(name, **OPTIONS.get((kind, name), {}))
        except (TypeError, ValueError):
            names.append(name)
            continue
        if declares(policy):
            names.append(name)
    return names


def _sort_keyed_names() -> list[str]:
    return _names_where("scheduling", is_sort_keyed)


def _has_key_parts(policy: Any) -> bool:
    return is_sort_keyed(policy) and callable(getattr(policy, "key_parts", None))


def _cases(kind: str) -> list[Any]:
    return [pytest.param(name, scenario, id=f"{name}@{scenario}") for name in REGISTRIES[kind].names()
            for scenario in SCENARIOS]


# --- purity helpers ------------------------------------------------------------------------------
def _cluster_state(cluster: ClusterState) -> dict[str, Any]:
    return {slot: copy.deepcopy(getattr(cluster, slot)) for slot in ClusterState.__slots__}


class Inputs:
    """A deep copy of what a policy was given, to compare after the call."""

    def __init__(self, jobs: Mapping[str, JobState], cluster: ClusterState, *extra: Any) -> None:
        self.jobs = [(job_id, copy.deepcopy(job)) for job_id, job in jobs.items()]
        self.cluster = _cluster_state(cluster)
        self.extra = copy.deepcopy(extra)

    def assert_unchanged(self, jobs: Mapping[str, JobState], cluster: ClusterState, *extra: Any) -> None:
        now = list(jobs.items())
        assert [j for j, _ in now] == [j for j, _ in self.jobs], "the policy added, removed or reordered jobs"
        for (job_id, before), (_, after) in zip(self.jobs, now, strict=True):
            assert after == before, f"the policy mutated job {job_id!r}"
        after_cluster = _cluster_state(cluster)
        for slot, before_value in self.cluster.items():
            assert after_cluster[slot] == before_value, f"the policy mutated ClusterState.{slot}"
        assert list(extra) == list(self.extra), "the policy mutated its other inputs"


def _forbidden(what: str) -> Callable[..., Any]:
    def call(*_: Any, **__: Any) -> Any:
        raise AssertionError(f"a policy must not {what} (pass `now`, do no I/O)")

    return call


@contextlib.contextmanager
def pure_call() -> Iterator[None]:
    """Inside: reading the wall clock or opening a file fails the test."""
    clock = _forbidden("read the clock")
    with contextlib.ExitStack() as stack:
        for name in ("time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns"):
            stack.enter_context(mock.patch.object(time, name, clock))
        stack.enter_context(mock.patch.object(builtins, "open", _forbidden("open files")))
        yield


def _copies(scenario: Scenario) -> Scenario:
    """The same snapshot as new objects (so a second policy cannot lean on object identity)."""
    return copy.deepcopy(scenario)


# --- normal forms of decisions ---------------------------------------------------------------------
def ranking_form(ranking: Ranking) -> tuple[Any, ...]:
    return (
        list(ranking.order),
        dict(ranking.terminate),
        dict(ranking.gpu_targets),
        ranking.preempt,
        None if ranking.running is None else list(ranking.running),
        None if ranking.waiting is None else list(ranking.waiting),
    )


def plan_form(plan: Plan) -> tuple[Any, ...]:
    """Order-free: which jobs launch where, which are suspended, which end."""
    return (
        {j: tuple(sorted(g)) for j, g in plan.launch.items()},
        sorted(plan.suspend),
        dict(plan.terminate),
    )


def placement_form(placement: Placement) -> tuple[Any, ...]:
    allocation = {j: tuple(g) for j, g in placement.allocation.items()}
    plan = None if placement.plan is None else (dict(placement.plan.launch), tuple(placement.plan.suspend),
                                                 dict(placement.plan.terminate))
    return allocation, plan


def admission_form(verdict: Admission) -> tuple[Any, ...]:
    return tuple(verdict.accepted), tuple(verdict.held), dict(verdict.rejected)


# --- the registries ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(REGISTRIES))
def test_every_kind_has_registered_policies(kind: str) -> None:
    assert REGISTRIES[kind].names(), f"no {kind} policy is registered: is the package installed?"


@pytest.mark.parametrize(
    ("kind", "name"), [pytest.param(k, n, id=f"{k}-{n}") for k, r in sorted(REGISTRIES.items()) for n in r.names()]
)
def test_builds_and_has_the_protocol(kind: str, name: str) -> None:
    policy = build(kind, name)
    protocol = PROTOCOLS[kind]
    assert isinstance(policy, protocol), f"{kind} policy {name!r} lacks a member of {protocol.__name__}"
    assert isinstance(getattr(policy, "name", None), str), "a policy has a str `name`"
    if kind == "scheduling":
        assert isinstance(getattr(policy, "triggers", None), Trigger), "a scheduling policy declares `triggers`"


def test_a_policy_without_options_in_the_table_fails_with_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    registry: Registry[Any] = Registry("scheduling", group=None)

    @registry.register("needs-a-knob")
    class NeedsAKnob:
        def __init__(self, *, knob: float) -> None:
            self.knob = knob

    monkeypatch.setitem(REGISTRIES, "scheduling", registry)
    with pytest.raises(pytest.fail.Exception, match=r"OPTIONS\[\('scheduling', 'needs-a-knob'\)\]"):
        build("scheduling", "needs-a-knob")
    monkeypatch.setitem(OPTIONS, ("scheduling", "needs-a-knob"), {"knob": 1.0})
    assert build("scheduling", "needs-a-knob").knob == 1.0


# --- scheduling ----------------------------------------------------------------------------------
def check_ranking(ranking: Ranking, jobs: Mapping[str, JobState], cluster: ClusterState, policy: Any) -> None:
    order = list(ranking.order)
    assert len(order) == len(set(order)), "a job is ranked twice"
    assert set(order) == set(jobs), "the ranking must order every given job, and only those"
    assert set(ranking.terminate) <= set(jobs), "terminates a job it was not given"
    assert all(isinstance(r, str) and r for r in ranking.terminate.values()), "a termination needs a reason"
    for job_id, gpus in ranking.gpu_targets.items():
        assert job_id in jobs, f"a GPU target for {job_id!r}, which it was not given"
        assert 1 <= gpus <= cluster.total_gpus, f"GPU target {gpus} for {job_id!r}"
    if ranking.running is not None:
        assert list(ranking.running) == [j for j in order if jobs[j].is_running]
    if ranking.waiting is not None:
        assert list(ranking.waiting) == [j for j in order if not jobs[j].is_running]
    if ranking.key is not None:
        assert sorted(order, key=ranking.key) == order
    if not is_preemptive(policy):
        assert ranking.preempt is False, "declares preemptive = False but ranked with preempt=True"


@pytest.mark.parametrize(("name", "scenario"), _cases("scheduling"))
def test_scheduling(name: str, scenario: str) -> None:
    s = BUILDERS[scenario]()
    policy = build("scheduling", name)
    before = Inputs(s.jobs, s.cluster)
    with pure_call():
        ranking = policy.rank(s.jobs, s.cluster, s.now)
    before.assert_unchanged(s.jobs, s.cluster)
    check_ranking(ranking, s.jobs, s.cluster, policy)
    again = _copies(s)
    with pure_call():
        second = build("scheduling", name).rank(again.jobs, again.cluster, again.now)
    assert ranking_form(second) == ranking_form(ranking), "not deterministic: a second instance ranked otherwise"


def _service_line(now: float) -> Callable[[JobState], tuple[float, float]]:
    # A snapshot stands still: every running job's attained service is a + gpus x now at ``now``.
    def line(job: JobState) -> tuple[float, float]:
        return job.attained_service - len(job.gpus) * now, now - 1.0

    return line


@pytest.mark.parametrize(
    ("name", "scenario", "grouped"),
    [pytest.param(n, s, False, id=f"{n}@{s}-resorted") for n in _sort_keyed_names() for s in SCENARIOS]
    + [pytest.param(n, s, True, id=f"{n}@{s}-grouped") for n in _names_where("scheduling", _has_key_parts)
       for s in SCENARIOS],
)
def test_the_incremental_order_equals_rank(name: str, scenario: str, grouped: bool) -> None:
    """The simulator keeps a sort-keyed policy's order in a ``KeyedOrder`` instead of calling
    ``rank``; both must give the same order, at ``now`` and at later rounds when waiting jobs' keys
    expire (``key_stable_until``), through every lazy view of the ranking."""
    s = BUILDERS[scenario]()
    policy = build("scheduling", name)
    assert is_sort_keyed(policy)
    keyed = KeyedOrder(policy, service_line=_service_line(s.now) if grouped else None)
    for job in s.jobs.values():
        if job.is_running:
            keyed.mark_running(job)
        else:
            keyed.push(job, s.now)
    # Grouped: the service line is exact at ``now`` only (the snapshot does not advance).
    times = [s.now] if grouped else [s.now, s.now + 600.0, s.now + 3_700_000.0]
    for now in times:
        before = Inputs(s.jobs, s.cluster)
        reference = policy.rank(s.jobs, s.cluster, now)
        fast = keyed.ranking(s.jobs, now)
        before.assert_unchanged(s.jobs, s.cluster)
        expected = list(reference.order)
        assert list(fast.order) == expected, f"at now={now}"
        assert not reference.terminate, "sort_key promises a ranking without terminations"
        assert not reference.gpu_targets, "sort_key promises a ranking without GPU targets"
        assert fast.preempt == reference.preempt
        assert fast.running is not None
        assert fast.waiting is not None
        assert fast.key is not None
        assert list(fast.running) == [j for j in expected if s.jobs[j].is_running]
        assert list(reversed(fast.running)) == [j for j in reversed(expected) if s.jobs[j].is_running]
        assert list(fast.waiting) == [j for j in expected if not s.jobs[j].is_running]
        assert sorted(expected, key=fast.key) == expected


# --- placement -----------------------------------------------------------------------------------
def rankings(s: Scenario) -> list[tuple[str, Ranking]]:
    """What a placement policy may be handed for this snapshot: the ranking of every registered
    scheduling policy, one with preemption off, and an incremental (lazy, hinted) one."""
    out: list[tuple[str, Ranking]] = []
    for name in SCHEDULING.names():
        out.append((name, build("scheduling", name).rank(s.jobs, s.cluster, s.now)))
    if out:
        first = out[0][1]
        out.append((f"{out[0][0]}-nonpreemptive", Ranking(order=tuple(first.order), preempt=False)))
    for name in _sort_keyed_names():
        policy = build("scheduling", name)
        keyed = KeyedOrder(policy, service_line=_service_line(s.now) if _has_key_parts(policy) else None)
        for job in s.jobs.values():
            if job.is_running:
                keyed.mark_running(job)
            else:
                keyed.push(job, s.now)
        out.append((f"{name}-incremental", keyed.ranking(s.jobs, s.now)))
    return out


def check_placement(placement: Placement, ranking: Ranking, s: Scenario) -> None:
    jobs, cluster = s.jobs, s.cluster
    holder: dict[int, str] = {}
    for job_id, given in placement.allocation.items():
        assert job_id in jobs, f"places {job_id!r}, which it was not given"
        assert job_id not in ranking.terminate, f"places {job_id!r}, which the ranking terminates"
        gpus = tuple(given)
        assert len(gpus) == len(set(gpus)), f"gives {job_id!r} a GPU twice: {gpus}"
        for g in gpus:
            assert 0 <= g < cluster.total_gpus, f"gives {job_id!r} GPU {g}, which does not exist"
            assert g not in holder, f"GPU {g} goes to both {holder[g]!r} and {job_id!r}"
            holder[g] = job_id
        spec = jobs[job_id].spec
        allowed = {spec.gpus, ranking.gpu_targets.get(job_id, spec.gpus)}
        if spec.max_gpus is not None:
            allowed |= set(range(spec.gpus, spec.max_gpus + 1))
        assert len(gpus) in allowed, f"gives {job_id!r} {len(gpus)} GPUs; it may have {sorted(allowed)}"
    plan = diff_plan(Placement(allocation=placement.allocation), ranking, jobs)
    suspended = set(plan.suspend) | set(plan.terminate)
    for job_id, gpus in plan.launch.items():
        for g in gpus:
            others = set(cluster.gpu_jobs[g]) - {job_id}
            assert others <= suspended, f"launches {job_id!r} on GPU {g}, held by {sorted(others)} who stay"


@pytest.mark.parametrize(("name", "scenario"), _cases("placement"))
def test_placement(name: str, scenario: str) -> None:
    s = BUILDERS[scenario]()
    for label, ranking in rankings(s):
        where = f"ranking of {label}"
        policy = build("placement", name)
        before = Inputs(s.jobs, s.cluster, dict(ranking.terminate), dict(ranking.gpu_targets))
        with pure_call():
            placement = policy.place(ranking, s.jobs, s.cluster, s.now)
        before.assert_unchanged(s.jobs, s.cluster, dict(ranking.terminate), dict(ranking.gpu_targets))
        check_placement(placement, ranking, s)
        if placement.plan is not None:
            reference = diff_plan(Placement(allocation=placement.allocation), ranking, s.jobs)
            hinted = diff_plan(placement, ranking, s.jobs)
            assert plan_form(hinted) == plan_form(reference), f"{where}: Placement.plan differs from diff_plan"
        again = _copies(s)
        with pure_call():
            second = build("placement", name).place(copy.deepcopy(ranking) if isinstance(ranking.order, tuple)
                                                    else ranking, again.jobs, again.cluster, again.now)
        assert placement_form(second) == placement_form(placement), f"{where}: not deterministic"


@pytest.mark.parametrize("name", _names_where("placement", keeps_running))
def test_a_placement_that_keeps_running_jobs_changes_nothing_when_nobody_waits(name: str) -> None:
    assert keeps_running(build("placement", name))
    for scenario in SCENARIOS:
        s = BUILDERS[scenario]()
        running = {j.job_id: j for j in s.running}
        for label, ranking in rankings(Scenario(s.name, running, s.cluster, s.now)):
            if ranking.gpu_targets:
                # Owners rely on the promise only with sort-keyed rankings, which carry no GPU targets
                # (an elastic job resized to its target is not "kept").
                continue
            plan = diff_plan(build("placement", name).place(ranking, running, s.cluster, s.now), ranking, running)
            assert not plan.launch, f"{scenario}, ranking of {label}"
            assert not plan.suspend, f"{scenario}, ranking of {label}"


# --- victims -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "scenario"), _cases("victim"))
def test_victim(name: str, scenario: str) -> None:
    s = BUILDERS[scenario]()
    running = s.running
    for needed in [*s.waiting, *s.offered]:
        policy = build("victim", name)
        before = Inputs(s.jobs, s.cluster, needed, running)
        with pure_call():
            chosen = policy.choose(needed, running, s.cluster, s.now)
        before.assert_unchanged(s.jobs, s.cluster, needed, running)
        assert isinstance(chosen, tuple)
        assert len(chosen) == len(set(chosen)), f"names a victim twice: {chosen}"
        assert set(chosen) <= {j.job_id for j in running}, f"for {needed.job_id!r}: {chosen} are not all running"
        again = _copies(s)
        again_needed = copy.deepcopy(needed)
        with pure_call():
            second = build("victim", name).choose(again_needed, again.running, again.cluster, again.now)
        assert second == chosen, f"for {needed.job_id!r}: not deterministic"


# --- admission -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "scenario"), _cases("admission"))
def test_admission(name: str, scenario: str) -> None:
    s = BUILDERS[scenario]()
    policy = build("admission", name)
    before = Inputs(s.jobs, s.cluster, s.offered)
    with pure_call():
        verdict = policy.admit(s.offered, s.jobs, s.cluster, s.now)
    before.assert_unchanged(s.jobs, s.cluster, s.offered)
    answered = [*verdict.accepted, *verdict.held, *verdict.rejected]
    offered = [j.job_id for j in s.offered]
    assert sorted(answered) == sorted(offered), "every offered job needs exactly one verdict, and only those"
    assert all(isinstance(r, str) and r for r in verdict.rejected.values()), "a rejection needs a reason"
    if accepts_all(policy):
        assert list(verdict.accepted) == offered, "declares accepts_all but did not accept every job, in order"
    again = _copies(s)
    with pure_call():
        second = build("admission", name).admit(again.offered, again.jobs, again.cluster, again.now)
    assert admission_form(second) == admission_form(verdict), "not deterministic"


# --- across processes ----------------------------------------------------------------------------
def decisions() -> dict[str, Any]:
    """Every policy's decision on every scenario, as JSON-able values (for the hash-seed check)."""
    out: dict[str, Any] = {}
    for scenario in SCENARIOS:
        s = BUILDERS[scenario]()
        for name in ADMISSION.names():
            out[f"admission/{name}/{scenario}"] = admission_form(
                build("admission", name).admit(s.offered, s.jobs, s.cluster, s.now))
        for name in SCHEDULING.names():
            ranked = build("scheduling", name).rank(s.jobs, s.cluster, s.now)
            out[f"scheduling/{name}/{scenario}"] = ranking_form(ranked)
        for name in PLACEMENT.names():
            for label, ranking in rankings(s):
                placed = build("placement", name).place(ranking, s.jobs, s.cluster, s.now)
                out[f"placement/{name}/{scenario}/{label}"] = placement_form(placed)
        for name in VICTIM.names():
            for needed in [*s.waiting, *s.offered]:
                chosen = build("victim", name).choose(needed, s.running, s.cluster, s.now)
                out[f"victim/{name}/{scenario}/{needed.job_id}"] = chosen
    normal: dict[str, Any] = json.loads(json.dumps(out, default=repr))
    return normal


def _decisions_in_a_process(seed: str) -> Any:
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONHASHSEED": seed}
    code = "import json; from tests.unit.conformance.test_policies import decisions; print(json.dumps(decisions()))"
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_decisions_do_not_depend_on_the_hash_seed() -> None:
    """Set and dict orders of strings change with ``PYTHONHASHSEED``; decisions must not."""
    first, second = _decisions_in_a_process("1"), _decisions_in_a_process("2")
    differ = sorted(k for k in first if first[k] != second.get(k))
    assert not differ, f"decisions that depend on the hash seed: {differ[:10]}"
    assert first.keys() == second.keys()



# --- the checks themselves -------------------------------------------------------------------------
def test_the_checks_catch_what_they_are_for() -> None:
    s = BUILDERS["mixed-2x4"]()
    before = Inputs(s.jobs, s.cluster)
    s.jobs["w-two"].loss_history.append((s.now, 0.1))
    with pytest.raises(AssertionError, match="mutated job 'w-two'"):
        before.assert_unchanged(s.jobs, s.cluster)
    s = BUILDERS["mixed-2x4"]()
    before = Inputs(s.jobs, s.cluster)
    s.cluster.assign("w-te", (7,))
    with pytest.raises(AssertionError, match="mutated ClusterState"):
        before.assert_unchanged(s.jobs, s.cluster)
    with pure_call(), pytest.raises(AssertionError, match="read the clock"):
        time.monotonic()
    with pure_call(), pytest.raises(AssertionError, match="open files"):
        open(__file__)  # noqa: SIM115
    ranking = Ranking(order=tuple(s.jobs))
    kept = {j.job_id: j.gpus for j in s.running}
    with pytest.raises(AssertionError, match="goes to both"):  # GPU 0 stays with r-two
        check_placement(Placement(allocation={**kept, "w-te": (0,)}), ranking, s)
    with pytest.raises(AssertionError, match="goes to both"):
        check_placement(Placement(allocation={"w-te": (7,), "w-suspended": (7,)}), ranking, s)
    with pytest.raises(AssertionError, match="does not exist"):
        check_placement(Placement(allocation={"w-te": (8,)}), ranking, s)
    with pytest.raises(AssertionError, match="may have"):
        check_placement(Placement(allocation={"w-te": (7, 4)}), ranking, s)
