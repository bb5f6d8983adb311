"""FitGpp on the live cluster (issue 5, Live services): a TE submission preempts a BE job within its grace period.

Real processes throughout: the bundled nats-server, the five services (``fitgpp`` ranking,
``preempting`` placement with the ``fitgpp`` victim policy) and one worker agent with 2 fake GPUs,
whose jobs are ``curve_job.py`` processes under ``roundhouse.train``.

Two BE jobs fill the GPUs (``long`` with a 30 s grace period, ``victim`` with 8 s and a checkpoint
that takes 1 s), a third BE job (``queued``) waits behind them. Then a TE job arrives. FitGpp
(seed 000, Eq. 1-2) must suspend the BE job with the lowest score ``||D|| / max||D|| + s * GP /
max GP``: both demand the same, so the one with the shorter grace period, ``victim``. The TE job
must start on the arrival (churn), after the victim's checkpoint and within its grace period; the
victim goes back to the head of the BE queue (it resumes before ``queued``, which arrived later),
continues from its checkpoint and completes; no iteration of any job is lost or run twice.

With ``P = 1`` (the paper's setting, ``max_preemptions``), a second TE job arriving once the victim
runs again must preempt ``long`` instead: the victim has been preempted once (``PC_j < P`` fails),
however low its score. That needs the preemption count in the placement service's view.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from roundhouse.local import LocalClusterConfig
from schemas.job import JobClass
from tests.e2e.live_cluster import curve_spec, events, iterations, live_cluster, read_log
from tests.helpers import eventually

GRACE_VICTIM_S = 8.0
GRACE_LONG_S = 30.0
CHECKPOINT_S = 1.0
MARGIN_S = 4.0
"""Allowed beyond the grace period: the round, the grant and the TE process's start (a Python start
takes seconds on a loaded machine). Still far below ``long``'s 30 s grace, which must not be waited for."""

SAME_ROUND_S = 2.5
"""Jobs granted in one round start their processes in any order, within milliseconds on an idle
machine and seconds on a loaded one; rounds are 5 s apart. "Resumes before queued" means: never in
a later round than ``queued``."""

ITERATIONS = {"long": 300, "victim": 140, "queued": 30, "te": 30, "te2": 30}
"""At 0.05 s an iteration: long 15 s, victim 7 s, queued and the TE jobs 1.5 s."""


@pytest.mark.timeout(150)
async def test_te_job_preempts_the_fitgpp_victim_within_its_grace_period(tmp_path: Path) -> None:
    config = LocalClusterConfig(
        state_dir=tmp_path / "state", workers=1, gpus_per_worker=2, scheduler="fitgpp", placement="preempting",
        round_s=5.0,
        extra_args={
            "placement": ["--policy-options", '{"victim": "fitgpp", "s": 4.0, "max_preemptions": 1}'],
            "worker": ["--heartbeat-s", "0.5", "--cpus", "16", "--memory-gb", "64"],
        },
    )  # fmt: skip
    async with live_cluster(tmp_path, config) as live:
        ids: dict[str, str] = {}
        specs = {
            "long": curve_spec(live, "long", iterations=ITERATIONS["long"], grace_period_s=GRACE_LONG_S),
            "victim": curve_spec(live, "victim", iterations=ITERATIONS["victim"], checkpoint_s=CHECKPOINT_S,
                                 grace_period_s=GRACE_VICTIM_S),
            "queued": curve_spec(live, "queued", iterations=ITERATIONS["queued"], grace_period_s=8),
        }  # fmt: skip
        for name, spec in specs.items():  # in this order: FIFO among the BE jobs
            ids[name] = await live.submit(spec)

        # Both GPUs busy with the first two BE jobs (each has finished some iterations).
        await eventually(
            lambda: all(len(iterations(read_log(live.log_of(n)))) >= 10 for n in ("long", "victim")),
            timeout_s=30, what="the two BE jobs running",
        )  # fmt: skip
        assert read_log(live.log_of("queued")) == [], "the third BE job must wait: both GPUs are taken"

        ids["te"] = await live.submit(curve_spec(live, "te", iterations=ITERATIONS["te"],
                                                 job_class=JobClass.TE, grace_period_s=8))  # fmt: skip
        submitted = live.submitted[ids["te"]]
        await eventually(lambda: events(read_log(live.log_of("te")), "start"), timeout_s=GRACE_VICTIM_S + 10,
                         what="the TE job's process started")  # fmt: skip
        te_start = events(read_log(live.log_of("te")), "start")[0]["t"]

        # The victim runs again (after the TE job); a second TE job arrives.
        await eventually(lambda: len(events(read_log(live.log_of("victim")), "start")) == 2, timeout_s=20,
                         what="the victim resumed")  # fmt: skip
        ids["te2"] = await live.submit(curve_spec(live, "te2", iterations=ITERATIONS["te2"],
                                                  job_class=JobClass.TE, grace_period_s=8))  # fmt: skip
        await eventually(lambda: events(read_log(live.log_of("te2")), "start"), timeout_s=GRACE_LONG_S + 10,
                         what="the second TE job's process started")  # fmt: skip
        te2_start = events(read_log(live.log_of("te2")), "start")[0]["t"]

        final = await live.wait_finished(list(ids.values()), timeout_s=60)

    by_name = {name: final[job_id] for name, job_id in ids.items()}
    assert all(v.status == "completed" for v in by_name.values()), by_name
    # FitGpp chose the BE job with the shorter grace period, and only that one.
    # and, with P = 1, the second time the other one: the victim is not preempted twice.
    assert by_name["victim"].preemptions == 1, by_name["victim"]
    assert by_name["long"].preemptions == 1, by_name["long"]
    assert [by_name[n].preemptions for n in ("queued", "te", "te2")] == [0, 0, 0], by_name

    logs = {name: read_log(live.log_of(name)) for name in ids}
    # The TE job started within the victim's grace period, after the victim's checkpoint.
    waited = te_start - submitted
    assert waited < GRACE_VICTIM_S + MARGIN_S, f"TE job started {waited:.2f} s after its submission"
    victim_runs = events(logs["victim"], "start")
    assert len(victim_runs) == 2, logs["victim"]
    first_pid = victim_runs[0]["pid"]
    last_before = max(r["t"] for r in logs["victim"] if r.get("pid") == first_pid and "i" in r)
    assert te_start >= last_before + CHECKPOINT_S, "the TE job started before the victim's checkpoint was written"
    stopped = events(logs["victim"], "stopped")
    assert len(stopped) == 1
    assert stopped[0]["pid"] == first_pid

    # Back at the head of the queue: the victim resumes (from its checkpoint) before the later BE job.
    resumed = victim_runs[1]
    assert resumed["from"] == stopped[0]["at"] > 0
    te_done = events(logs["te"], "finished")[0]["t"]
    queued_start = events(logs["queued"], "start")[0]["t"]
    assert te_done <= resumed["t"] < queued_start + SAME_ROUND_S, (te_done, resumed["t"], queued_start)
    # The second TE job: within long's grace period; long, preempted, also resumes before queued.
    assert te2_start - live.submitted[ids["te2"]] < GRACE_LONG_S + MARGIN_S
    long_runs = events(logs["long"], "start")
    assert len(long_runs) == 2, long_runs
    assert long_runs[1]["t"] < queued_start + SAME_ROUND_S, (long_runs[1]["t"], queued_start)

    # Nothing lost or run twice; the jobs never preempted ran in one process each.
    for name, count in ITERATIONS.items():
        assert iterations(logs[name]) == list(range(count)), f"{name}: iterations lost or repeated"
        if name not in ("victim", "long"):
            assert len(events(logs[name], "start")) == 1, f"{name} was started more than once"
    print(f"\nTE job: submitted -> process started in {waited:.2f} s (victim grace {GRACE_VICTIM_S:.0f} s, "
          f"checkpoint {CHECKPOINT_S:.0f} s)")  # fmt: skip
