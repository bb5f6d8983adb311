"""The twelve attacks of issue 13, tried as an attacker would against a running secured cluster.

The cluster is the one ``roundhouse up`` runs (``LocalCluster``: the bundled nats-server with the
generated ``auth.conf``, every service and three worker agents as child processes, each with its own
credentials), with agents that emulate their jobs so that a job costs a fraction of a second. The
attackers hold what a real one would:

* **the URL only**: every connection is refused;
* **mallory**, a legitimate user of the cluster (her own credentials, issued like everyone's);
* **a compromised node**: the credentials file of one worker node (``<state>/auth/worker/<node>.creds``),
  used against the jobs of another node.

The victim is alice (the user who ran ``up``): a long job filling one node (its *target* node; the
compromised one is another, the third a bystander), a job that can never be placed and stays queued,
and short jobs she submits between and beside the attacks, each of which must still run to completion.

Every attack must fail visibly: with the broker's ``Permissions Violation`` for that exact subject
(collected from the attacker's connection), or with a service's refusal and its reason (the
scheduler's refusal counters, by subject and reason, read from its stats endpoint; the agent's
negative ack; the CLI's ``permission denied`` message). And the victim must be intact afterwards:
the same lease on the same node in the same epoch, one run, nothing completed or failed, the leader
still leading in its epoch, the stream and the leader key still there, the node still taking work.

Which role may do what in general (every role, on a bare secured broker) is
``tests/integration/test_auth.py``; ``test_each_role_is_refused_what_it_must_not_do`` here checks
the same table as ``up`` generates it, on the running cluster. The scheduler's checks of facts
against their source are unit- and integration-tested in ``tests/integration/test_scheduler_fact_sources.py``,
the agents' in ``tests/integration/test_worker_trust.py``, checkpoint confinement (which emulated
agents skip: their runs load nothing) in ``tests/integration/test_worker_checkpoints.py``.

The scheduling policy is ``fifo`` (non-preemptive) with backfill, so the victim's lease stays put for
the length of the module and any change to it is the attack's doing, and the job that can never be
placed holds up nobody; the security layers do not depend on either.

Beyond the twelve, ``test_13_...``: a node that says it drains, which a compromised node may say of
itself, stopped placement on every node (its free GPUs were held by a marker that was not a valid job
id, so placement dropped every round as malformed); fixed by giving the marker its own key in the
round's schema (``UNAVAILABLE_GPUS``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import pickle
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from nats.aio.msg import Msg

from roundhouse.cli import main
from roundhouse.client import Client
from roundhouse.endpoint import DEFAULT_STATE_DIR
from roundhouse.local import LocalCluster, LocalClusterConfig
from schemas.control import JobsQuery, JobsReply, LeaseStopAt
from schemas.job import JobSpec
from schemas.jobs import (
    CompletionReason,
    FailureReason,
    JobCancel,
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobStarted,
    JobSuspended,
    SuspendReason,
)
from schemas.leases import LeaseAck, LeaseGrant, LeaseRevoke, RevokeReason
from schemas.nodes import HeldLease, NodeHeartbeat, NodeRegister
from schemas.roles import Role
from services.core.state import JobStatus
from services.runtime.auth import AuthDirectory, new_credentials, write_creds
from services.runtime.store import Store
from services.scheduler.leader import BUCKET as LEADER_BUCKET
from services.scheduler.leader import KEY as LEADER_KEY
from tests.attacker import Attacker, AttackerRefusedError, poll
from tests.local_up import local_up

pytestmark = pytest.mark.timeout(120)

MALLORY = "mallory"
ALICE = "alice"
NAMESPACE = f"atk{uuid.uuid4().hex[:8]}"
SECRET = f"s3cret-{uuid.uuid4().hex}"
"""What alice puts in her jobs' env: nobody but the scheduler, admission and the job's node may read it."""
EPOCH_2_53 = 2**53
FACTS = ("job.started.*", "job.completed.*", "job.failed.*", "job.suspended.*", "job.checkpointed.*",
         "lease.grant.*", "lease.revoke.*", "schedule.round.*")  # fmt: skip


# --- the cluster ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("attacked")
    state = root / DEFAULT_STATE_DIR
    # mallory is a user like alice: issued before `up`, which keeps identities that exist.
    AuthDirectory(state / "auth").init(namespace=NAMESPACE, users=(MALLORY,))
    config = LocalClusterConfig(
        state_dir=state, workers=3, gpus_per_worker=2, round_s=1.0, emulate=True, speedup=10.0, user=ALICE,
        namespace=NAMESPACE, scheduler="fifo",
        # Backfill: the job that can never be placed must not hold up the ones behind it.
        extra_args={"placement": ["--policy-options", json.dumps({"backfill": True})]},
    )  # fmt: skip
    with local_up(config) as running:
        yield running


@dataclass(slots=True)
class FactLog:
    """Every fact, command and round of the cluster as the operator sees them travel (core NATS)."""

    seen: list[tuple[str, dict[str, Any], float]] = field(default_factory=list)
    """(subject without namespace and last token, payload, monotonic time of arrival), forgeries left out."""
    forged: set[str] = field(default_factory=set)
    """Event ids the attackers published (their ``Attacker.sent``)."""
    forgeries: int = 0
    """Forgeries that travelled as far as the operator's subscription (the broker let them by)."""

    async def on_msg(self, msg: Msg) -> None:
        kind = ".".join(msg.subject.split(".")[1:3])  # <ns>.job.started.<node> -> job.started
        payload = json.loads(msg.data)
        if payload.get("event_id") in self.forged:
            self.forgeries += 1
            return
        self.seen.append((kind, payload, time.monotonic()))

    def of(self, kind: str, **match: Any) -> list[dict[str, Any]]:
        return [p for k, p, _ in self.seen if k == kind and all(p.get(f) == v for f, v in match.items())]

    def when(self, kind: str, **match: Any) -> list[float]:
        return [t for k, p, t in self.seen if k == kind and all(p.get(f) == v for f, v in match.items())]


@dataclass(slots=True)
class Scene:
    """The running cluster, its victim jobs and its attackers."""

    cluster: LocalCluster
    url: str
    operator: Client
    alice: Client
    facts: FactLog
    victim: str
    """alice's long job, running alone on :attr:`target`."""
    lease: dict[str, Any]
    """The victim's ``job.started`` (lease id, node, epoch, GPUs)."""
    queued: str
    """alice's job that can never be placed (all 6 GPUs, 2 of which the victim holds): it stays queued."""
    target: str
    rogue_node: str
    """The compromised node: one the victim does not run on (the third node is a bystander)."""
    mallory: Attacker
    rogue: Attacker
    """A connection with the compromised node's own credentials."""
    evil: Path
    """The attacker's pickle: loading it would create :attr:`marker`."""
    marker: Path
    legit: list[str] = field(default_factory=list)
    """alice's short jobs, submitted beside the attacks: each must complete exactly once."""

    @property
    def epoch(self) -> int:
        return int(self.lease["epoch"])

    def wire(self, subject: str) -> str:
        return f"{NAMESPACE}.{subject}"

    # --- what the cluster says -----------------------------------------------------------------------
    async def scheduler_stats(self) -> dict[str, Any]:
        msg = await self.operator.bus.nc.request(self.wire("rh.scheduler.stats"), b"", timeout=5)
        stats: dict[str, Any] = json.loads(msg.data)["service"]
        return stats

    async def refusals(self) -> dict[str, int]:
        refused: dict[str, int] = (await self.scheduler_stats())["refused"]
        return refused

    async def worker_stats(self) -> dict[str, dict[str, Any]]:
        """Each agent's counters, by node (the services API's STATS, answered by every agent)."""
        nc = self.operator.bus.nc
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        out: dict[str, dict[str, Any]] = {}
        try:
            await nc.publish("$SRV.STATS.roundhouse-worker", b"", reply=inbox)
            deadline = time.monotonic() + 5
            while len(out) < len(self.cluster.node_ids) and time.monotonic() < deadline:
                msg = await sub.next_msg(timeout=max(0.01, deadline - time.monotonic()))
                answer = json.loads(msg.data)
                if answer["metadata"].get("namespace") == NAMESPACE:
                    out[answer["metadata"]["instance"]] = answer["endpoints"][0]["data"]["service"]
        finally:
            await sub.unsubscribe()
        return out

    async def view(self, job_id: str) -> dict[str, Any]:
        found = await self.maybe_view(job_id)
        assert found is not None, f"the scheduler does not know {job_id}"
        return found

    async def maybe_view(self, job_id: str) -> dict[str, Any] | None:
        """The job as ``roundhouse jobs`` shows it; None while the scheduler has not applied its arrival."""
        reply = await self.operator.jobs(JobsQuery(job_ids=[job_id], include_finished=True), timeout_s=5)
        assert len(reply.jobs) <= 1, reply
        return reply.jobs[0].model_dump(mode="json") if reply.jobs else None

    async def store_job(self, job_id: str) -> Any:
        store = await Store.open(str(self.cluster.state_dir / "scheduler"))
        try:
            return await store.get_job(job_id)
        finally:
            await store.close()

    # --- checks --------------------------------------------------------------------------------------
    async def refused_exactly(self, before: dict[str, int], expected: dict[str, int]) -> None:
        """The scheduler refused exactly ``expected`` (``"<subject>:<reason>": count``) since ``before``."""

        def delta(now: dict[str, int]) -> dict[str, int]:
            return {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}

        await poll(self.refusals, lambda now: all(delta(now).get(k, 0) >= n for k, n in expected.items()),
                   f"the scheduler's refusals {expected}", timeout_s=10)  # fmt: skip
        assert delta(await self.refusals()) == expected

    async def victim_intact(self) -> None:
        """The victim runs as before: same lease, node and epoch, one run, nothing ended; the queued
        job is still queued; the leader still leads in its epoch."""
        view = await self.view(self.victim)
        assert view["status"] == JobStatus.RUNNING, view
        assert view["placement"] == {self.target: self.lease["gpus"]}, view
        assert self.facts.of("job.started", job_id=self.victim) == [self.lease]
        for kind in ("job.completed", "job.failed", "job.suspended", "job.checkpointed", "lease.revoke"):
            assert self.facts.of(kind, job_id=self.victim) == [], kind
        assert (await self.view(self.queued))["status"] == JobStatus.QUEUED
        assert self.facts.of("lease.grant", job_id=self.queued) == []
        stats = await self.scheduler_stats()
        assert (stats["leader"], stats["epoch"]) == (True, self.epoch), stats
        held = (await self.worker_stats())[self.target]
        assert held["leases"] == 1, held
        assert held["epoch_seen"] == self.epoch, held

    async def run_legit(self, tag: str, *, within_s: float = 20.0) -> tuple[str, float]:
        """alice submits a short job with a secret in its env; it must complete, once. Returns the
        node it ran on and how long it took from submission to its start."""
        job_id = f"legit-{tag}-{uuid.uuid4().hex[:6]}"
        spec = JobSpec(name=f"legit-{tag}", command=["python", "train.py"], gpus=1, expected_duration_s=2.0,
                       env={"API_TOKEN": SECRET}, grace_period_s=1.0)  # fmt: skip
        began = time.monotonic()
        verdict = await self.alice.submit(spec, job_id=job_id, timeout_s=within_s)
        assert verdict.outcome == "accepted", verdict
        self.legit.append(job_id)
        await poll(self._completed(job_id), bool, f"{job_id} completes", timeout_s=within_s)
        (started,) = self.facts.of("job.started", job_id=job_id)
        assert len(self.facts.of("job.completed", job_id=job_id)) == 1
        return started["node_id"], self.facts.when("job.started", job_id=job_id)[0] - began

    def _completed(self, job_id: str) -> Any:
        async def probe() -> list[dict[str, Any]]:
            return self.facts.of("job.completed", job_id=job_id)

        return probe


class EvilPickle:
    """What the attacker wants a job to load: unpickling it creates a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
async def scene(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Scene]:
    assert cluster.endpoint is not None
    assert cluster.auth is not None
    url = cluster.endpoint.nats
    operator = await Client.connect(url, namespace=NAMESPACE, creds=cluster.operator_creds, name="audit")
    alice = await Client.connect(url, namespace=NAMESPACE, creds=cluster.user_creds, name="alice")
    assert alice.identity == ALICE
    facts = FactLog()
    subs = [await operator.bus.nc.subscribe(f"{NAMESPACE}.{s}", cb=facts.on_msg) for s in FACTS]
    await operator.bus.nc.flush()

    # The victim: 2 GPUs, so it fills its node alone; the other node takes everything else.
    victim = f"victim-{uuid.uuid4().hex[:6]}"
    spec = JobSpec(name="victim", command=["python", "train.py"], gpus=2, expected_duration_s=1e6,
                   env={"API_TOKEN": SECRET}, grace_period_s=1.0)  # fmt: skip
    assert (await alice.submit(spec, job_id=victim)).outcome == "accepted"
    started = await poll(lambda: _async(facts.of("job.started", job_id=victim)), bool, "the victim starts")
    lease = started[0]
    queued = f"queued-{uuid.uuid4().hex[:6]}"
    spec = JobSpec(name="queued", command=["python", "train.py"], gpus=6, expected_duration_s=10.0)
    assert (await alice.submit(spec, job_id=queued)).outcome == "accepted"

    target = lease["node_id"]
    rogue_node = next(n for n in cluster.node_ids if n != target)
    mallory = await Attacker.connect(url, namespace=NAMESPACE, creds=cluster.auth.creds_path(Role.USER, MALLORY),
                                     sent=facts.forged)  # fmt: skip
    rogue = await Attacker.connect(url, namespace=NAMESPACE, creds=cluster.auth.creds_path(Role.WORKER, rogue_node),
                                   sent=facts.forged)  # fmt: skip
    root = tmp_path_factory.mktemp("attacker")
    evil, marker = root / "checkpoint.pt", root / "pwned"
    evil.write_bytes(pickle.dumps(EvilPickle(marker)))
    scene = Scene(cluster, url, operator, alice, facts, victim, lease, queued, target, rogue_node, mallory, rogue,
                  evil, marker)  # fmt: skip
    # Submitted a moment ago: the scheduler may not have applied its arrival yet.
    await poll(lambda: scene.maybe_view(queued), lambda v: v is not None and v["status"] == JobStatus.QUEUED,
               "the 6-GPU job is queued")  # fmt: skip
    try:
        yield scene
    finally:
        for sub in subs:
            await sub.unsubscribe()
        for attacker in (mallory, rogue):
            await attacker.close()
        await alice.close()
        await operator.close()


async def _async(value: Any) -> Any:
    return value


# --- (a) nothing but the URL ------------------------------------------------------------------------------
async def test_without_credentials_or_with_unknown_ones_no_connection_is_made(scene: Scene, tmp_path: Path) -> None:
    with pytest.raises(AttackerRefusedError, match=r"(?i)authorization violation"):
        await Attacker.connect(scene.url, namespace=NAMESPACE)
    # A valid key the broker never heard of, under a real node's name and under a new one.
    for role, name in ((Role.WORKER, scene.target), (Role.WORKER, "fake-node"), (Role.OPERATOR, "operator")):
        forged = tmp_path / f"{name}.creds"
        write_creds(forged, new_credentials(role, name))
        with pytest.raises(AttackerRefusedError, match=r"(?i)authorization violation"):
            await Attacker.connect(scene.url, namespace=NAMESPACE, creds=forged)


# --- 1: a forged grant --------------------------------------------------------------------------------------
async def test_1_a_forged_grant_never_reaches_a_worker(scene: Scene) -> None:
    before = await scene.worker_stats()
    for attacker, node in ((scene.mallory, scene.target), (scene.rogue, scene.target), (scene.rogue, scene.rogue_node)):
        grant = LeaseGrant(
            lease_id=f"pwn-{node}", job_id="pwn", node_id=node, gpus=[0], epoch=scene.epoch + 1,
            spec=JobSpec(name="pwn", user=ALICE, command=["sh", "-c", f"touch {scene.marker}"]),
        )  # fmt: skip
        await attacker.publish_denied(f"lease.grant.{node}", grant)
    after = await scene.worker_stats()
    for node in scene.cluster.node_ids:  # no agent even saw one
        assert after[node]["grants"] == before[node]["grants"], (before, after)
    assert scene.facts.of("lease.grant", job_id="pwn") == []
    assert scene.facts.of("job.started", job_id="pwn") == []
    await scene.victim_intact()


# --- 2: a checkpoint path naming the attacker's pickle ------------------------------------------------------
async def test_2_a_forged_checkpoint_path_is_refused_and_never_offered_to_the_victim(scene: Scene) -> None:
    lease, evil = scene.lease, str(scene.evil)
    common = {"job_id": scene.victim, "lease_id": lease["lease_id"], "epoch": scene.epoch}

    def suspended(node: str) -> JobSuspended:
        return JobSuspended(**common, node_id=node, reason=SuspendReason.PREEMPTED, iteration=5,
                            checkpoint_path=evil, checkpoint_iteration=5)  # fmt: skip

    def checkpointed(node: str) -> JobCheckpointed:
        return JobCheckpointed(**common, node_id=node, checkpoint_path=evil, iteration=5)

    # As the victim's node: only that node may say so, and neither a user nor another node is it.
    for attacker in (scene.mallory, scene.rogue):
        await attacker.publish_denied(f"job.suspended.{scene.target}", suspended(scene.target))
        await attacker.publish_denied(f"job.checkpointed.{scene.target}", checkpointed(scene.target))
    # As itself, about a lease of the other node: the scheduler refuses it for its source.
    before = await scene.refusals()
    await scene.rogue.publish(f"job.suspended.{scene.rogue_node}", suspended(scene.rogue_node))
    await scene.rogue.publish(f"job.checkpointed.{scene.rogue_node}", checkpointed(scene.rogue_node))
    await scene.refused_exactly(before, {"job.suspended:other_node": 1, "job.checkpointed:other_node": 1})
    record = await scene.store_job(scene.victim)  # what the victim's next grant would resume from
    assert record.checkpoint_path != evil, record
    assert record.status is JobStatus.RUNNING, record
    await scene.victim_intact()
    # (Its next run would resume from that record. An emulating agent loads nothing, so what a real
    # agent and the training client do with a path from the bus is tests/integration/test_worker_checkpoints.py.)


# --- 3: reading secrets -------------------------------------------------------------------------------------
async def test_3_specs_and_grants_cannot_be_read_live_or_from_the_stream(scene: Scene) -> None:
    stream = f"{NAMESPACE}_RH_EVENTS"
    refused_subs: list[asyncio.Queue[Msg]] = []
    for attacker, subjects in (
        (scene.mallory, ("job.arrived.*", f"job.arrived.{ALICE}", "lease.grant.*", f"lease.grant.{scene.target}",
                         f"lease.grant.{scene.rogue_node}", ">", "_INBOX.>", f"_INBOX.user.{ALICE}.>",
                         "_INBOX.scheduler.>")),
        (scene.rogue, ("job.arrived.*", f"job.arrived.{ALICE}", f"lease.grant.{scene.target}", "lease.grant.*",
                       f"_INBOX.worker.{scene.target}.>", ">")),
    ):  # fmt: skip
        for subject in subjects:
            _, got = await attacker.subscribe(subject)  # kept: what it would get is checked below
            await attacker.denied(subject, action="subscription")
            refused_subs.append(got)
    # The stream's history: a consumer of any kind, a direct or stored message get, the services' own consumers.
    durables = [c.name for c in await scene.operator.bus.js.consumers_info(stream)]
    assert durables, "the services' durable consumers"
    config = {"filter_subject": f"{NAMESPACE}.job.arrived.>", "deliver_policy": "all", "ack_policy": "none"}
    create = json.dumps({"stream_name": stream, "config": config})
    for attacker in (scene.mallory, scene.rogue):
        for subject, payload in (
            (f"$JS.API.CONSUMER.CREATE.{stream}", create),
            (f"$JS.API.CONSUMER.CREATE.{stream}.spy.{NAMESPACE}.job.arrived.{ALICE}", create),
            (f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.spy", create),
            (f"$JS.API.DIRECT.GET.{stream}", json.dumps({"last_by_subj": f"{NAMESPACE}.job.arrived.{ALICE}"})),
            (f"$JS.API.DIRECT.GET.{stream}.{NAMESPACE}.job.arrived.{ALICE}", ""),
            (f"$JS.API.STREAM.MSG.GET.{stream}", json.dumps({"seq": 1})),
            *((f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{name}", json.dumps({"batch": 10})) for name in durables),
            ("query.admission", "{}"),  # the one request whose answer holds every spec
        ):
            await attacker.request_denied(subject, payload.encode())
    # Her own query names alice's job: refused with the owner's name, nothing of the job.
    query = JobsQuery(requester=MALLORY, job_ids=[scene.victim], include_finished=True)
    answer = await scene.mallory.request(f"query.jobs.{MALLORY}", query.model_dump_json().encode(), timeout_s=5)
    assert answer is not None
    reply = JobsReply.model_validate_json(answer.data)
    assert reply.jobs == []
    assert reply.refused == {scene.victim: f"permission denied: {MALLORY} cannot read alice's job"}
    await scene.mallory.publish_denied(f"query.jobs.{ALICE}", query.model_copy(update={"requester": ALICE}))
    # A secret travels now (a submission, a grant) while all of those are in place: none of it reaches them.
    node, _ = await scene.run_legit("secret")
    assert any(SECRET in json.dumps(g) for g in scene.facts.of("lease.grant", node_id=node)), "the secret travelled"
    assert all(got.empty() for got in refused_subs)
    for attacker in (scene.mallory, scene.rogue):
        assert not any(SECRET in e for e in attacker.errors)
    await scene.victim_intact()


# --- 4: cancelling someone else's job ---------------------------------------------------------------------
async def test_4_mallory_cannot_cancel_alices_job(scene: Scene) -> None:
    await scene.mallory.publish_denied(f"job.cancel.{ALICE}", JobCancel(job_id=scene.victim, user=ALICE))
    before = await scene.refusals()
    await scene.mallory.publish(f"job.cancel.{MALLORY}", JobCancel(job_id=scene.victim, user=MALLORY))
    await scene.refused_exactly(before, {"job.cancel:permission_denied": 1})
    # Her own subject with alice's name in the payload: the codec drops it (it names another user).
    await scene.mallory.publish(f"job.cancel.{MALLORY}", JobCancel(job_id=scene.victim, user=ALICE))
    await scene.victim_intact()


def test_4_the_cli_says_why_mallory_cannot_cancel(
    scene: Scene, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # no up.json here: the flags say everything
    for variable in ("ROUNDHOUSE_NATS", "ROUNDHOUSE_CREDS", "ROUNDHOUSE_NAMESPACE"):
        monkeypatch.delenv(variable, raising=False)
    assert scene.cluster.auth is not None
    creds = scene.cluster.auth.creds_path(Role.USER, MALLORY)
    code = main(["cancel", scene.victim, "--nats", scene.url, "--namespace", NAMESPACE, "--creds", str(creds)])
    assert code == 1
    err = capsys.readouterr().err
    assert f"permission denied: {MALLORY} cannot cancel alice's job {scene.victim}" in err, err


# --- 5: revoking another job's lease ----------------------------------------------------------------------
async def test_5_nobody_but_the_scheduler_revokes_and_a_peer_stop_is_refused_with_a_reason(scene: Scene) -> None:
    revoke = LeaseRevoke(lease_id=scene.lease["lease_id"], job_id=scene.victim, node_id=scene.target,
                         reason=RevokeReason.CANCEL, grace_s=0.0, epoch=scene.epoch)  # fmt: skip
    for attacker in (scene.mallory, scene.rogue):
        await attacker.publish_denied(f"lease.revoke.{scene.target}", revoke)
    # A worker may send stop_at to the peers of a multi-node job: the victim's node takes none for its
    # single-node lease, and says why.
    stop = LeaseStopAt(lease_id=scene.lease["lease_id"], job_id=scene.victim, node_id=scene.target, stop_at=0,
                       grace_s=0.0, epoch=scene.epoch)  # fmt: skip
    answer = await scene.rogue.request(f"lease.stop.{scene.target}", stop.model_dump_json().encode(), timeout_s=5)
    assert answer is not None
    ack = LeaseAck.model_validate_json(answer.data)
    assert (ack.accepted, ack.error) == (False, "wrong_node"), ack
    assert "runs on this node alone" in ack.message, ack
    await scene.mallory.publish_denied(f"lease.stop.{scene.target}", stop)
    await scene.victim_intact()


# --- 6: forged outcomes -------------------------------------------------------------------------------------
async def test_6_forged_completions_and_failures_are_refused_for_their_source(scene: Scene) -> None:
    lease_id, rogue, target = scene.lease["lease_id"], scene.rogue_node, scene.target
    done = {"iteration": 10, "reason": CompletionReason.EXITED}

    def completed(node: str, job_id: str, lease: str) -> JobCompleted:
        return JobCompleted(job_id=job_id, lease_id=lease, node_id=node, epoch=scene.epoch, **done)

    # Speaking as the victim's node: the broker.
    for attacker in (scene.mallory, scene.rogue):
        await attacker.publish_denied(f"job.completed.{target}", completed(target, scene.victim, lease_id))
        failed = JobFailed(job_id=scene.victim, lease_id=lease_id, node_id=target, epoch=scene.epoch,
                           reason=FailureReason.EXIT_CODE, exit_code=1)  # fmt: skip
        await attacker.publish_denied(f"job.failed.{target}", failed)
    # Speaking as itself about what it does not run: the scheduler, and the victim's agent for job.failed.
    before = await scene.refusals()
    started = JobStarted(job_id=scene.victim, lease_id=lease_id, node_id=rogue, epoch=scene.epoch, gpus=[0])
    failed = JobFailed(job_id=scene.victim, lease_id=lease_id, node_id=rogue, epoch=scene.epoch,
                       reason=FailureReason.EXIT_CODE, exit_code=1)  # fmt: skip
    held = HeldLease(lease_id=lease_id, job_id=scene.victim, epoch=scene.epoch, gpus=scene.lease["gpus"])
    heartbeat = NodeHeartbeat(node_id=rogue, incarnation=uuid.uuid4(), seq=1, epoch_seen=scene.epoch, leases=[held])
    forged: list[tuple[str, Any]] = [
        ("job.completed", completed(rogue, scene.victim, lease_id)),  # the real lease, of another node
        ("job.completed", completed(rogue, scene.victim, f"made-up-{uuid.uuid4().hex[:6]}")),
        ("job.completed", completed(rogue, scene.queued, f"made-up-{uuid.uuid4().hex[:6]}")),  # never ran
        ("job.started", started),
        ("job.failed", failed),
        ("job.failed", JobFailed(job_id=scene.victim, node_id=rogue, reason=FailureReason.LAUNCH_ERROR)),
        ("job.failed", JobFailed(job_id=scene.queued, node_id=rogue, reason=FailureReason.LAUNCH_ERROR)),
        ("node.heartbeat", heartbeat),  # listing the victim's lease as its own
    ]
    violations = len(scene.rogue.violations())
    for kind, event in forged:
        await scene.rogue.publish(f"{kind}.{rogue}", event)
    await scene.refused_exactly(before, {
        "job.completed:other_node": 1, "job.completed:unknown_lease": 2, "job.started:other_node": 1,
        "job.failed:other_node": 2, "job.failed:no_lease": 1, "node.heartbeat:other_node": 1,
    })  # fmt: skip
    assert scene.rogue.violations()[violations:] == []  # as itself: the broker let them by
    record = await scene.store_job(scene.victim)
    assert record.status is JobStatus.RUNNING, record
    assert record.finish_time is None, record
    await scene.victim_intact()


# --- 7 and 8: a fake node, and a real node re-registered ----------------------------------------------------
def _register(node: str) -> NodeRegister:
    return NodeRegister(node_id=node, incarnation=uuid.uuid4(), hostname="evil.example", cpus=64, memory_gb=512,
                        gpus=[{"index": i, "uuid": f"GPU-{uuid.uuid4()}", "name": "H100", "memory_mib": 81920}
                              for i in range(8)])  # fmt: skip


async def test_7_a_fake_node_cannot_register(scene: Scene) -> None:
    for attacker in (scene.mallory, scene.rogue):
        await attacker.publish_denied("node.register.fake-node", _register("fake-node"))
    stats = await scene.scheduler_stats()
    assert stats["nodes"] == len(scene.cluster.node_ids), stats
    # (A connection with credentials made up for the fake node is refused: test_without_credentials_...)
    node, _ = await scene.run_legit("no-fake-node")
    assert node in scene.cluster.node_ids
    assert node != scene.target  # full: the job went to a node with room, never to the fake one
    await scene.victim_intact()


async def test_8_a_real_node_cannot_be_re_registered_by_anyone_else(scene: Scene) -> None:
    for attacker in (scene.mallory, scene.rogue):
        await attacker.publish_denied(f"node.register.{scene.target}", _register(scene.target))
    # Its lease is neither released nor revoked: the victim runs once, where it ran.
    await scene.victim_intact()


# --- 9: a revoke with epoch 2^53 ----------------------------------------------------------------------------
async def test_9_an_epoch_of_2_53_moves_no_fence_and_the_node_keeps_taking_work(scene: Scene) -> None:
    for attacker in (scene.mallory, scene.rogue):
        for node in scene.cluster.node_ids:
            revoke = LeaseRevoke(lease_id=scene.lease["lease_id"], job_id=scene.victim, node_id=node,
                                 reason=RevokeReason.PREEMPT, grace_s=0.0, epoch=EPOCH_2_53)  # fmt: skip
            await attacker.publish_denied(f"lease.revoke.{node}", revoke)
    # The one command a worker may send another node, with the huge epoch: refused, the fence unmoved.
    before = await scene.worker_stats()
    for lease_id in (scene.lease["lease_id"], "made-up-lease"):
        stop = LeaseStopAt(lease_id=lease_id, job_id=scene.victim, node_id=scene.target, stop_at=0, grace_s=0.0,
                           epoch=EPOCH_2_53)  # fmt: skip
        answer = await scene.rogue.request(f"lease.stop.{scene.target}", stop.model_dump_json().encode(), timeout_s=5)
        assert answer is not None
        ack = LeaseAck.model_validate_json(answer.data)
        assert not ack.accepted, ack
        assert ack.error in ("wrong_node", "unknown_lease"), ack
        assert ack.epoch_seen == scene.epoch, ack
    after = await scene.worker_stats()
    for node in scene.cluster.node_ids:
        assert after[node]["epoch_seen"] == before[node]["epoch_seen"] <= scene.epoch, (before, after)
    stats = await scene.scheduler_stats()
    assert (stats["leader"], stats["epoch"]) == (True, scene.epoch), stats
    # The nodes keep taking work from the leader (the victim's is full: new jobs go to the others).
    node, _ = await scene.run_legit("after-2-53")
    assert node != scene.target
    await scene.victim_intact()


# --- 10: the leader key ----------------------------------------------------------------------------------------
async def test_10_the_leader_key_cannot_be_deleted_held_or_replaced(scene: Scene) -> None:
    bucket = await scene.operator.bus.kv(LEADER_BUCKET)
    entry = await bucket.get(LEADER_KEY)
    assert entry is not None
    key = f"$KV.{NAMESPACE}_{LEADER_BUCKET}.{LEADER_KEY}"
    kv_stream = f"KV_{NAMESPACE}_{LEADER_BUCKET}"
    usurper = json.dumps({"instance": "mallory", "epoch": EPOCH_2_53}).encode()
    for attacker in (scene.mallory, scene.rogue):
        await attacker.publish_denied(key, usurper)  # hold it: a put of one's own leader
        await attacker.publish_denied(key, b"", headers={"KV-Operation": "DEL"})
        await attacker.publish_denied(key, b"", headers={"KV-Operation": "PURGE", "Nats-Rollup": "sub"})
        for api in (f"$JS.API.STREAM.PURGE.{kv_stream}", f"$JS.API.STREAM.DELETE.{kv_stream}",
                    f"$JS.API.DIRECT.GET.{kv_stream}.$KV.{NAMESPACE}_{LEADER_BUCKET}.{LEADER_KEY}"):  # fmt: skip
            await attacker.request_denied(api)
    after = await bucket.get(LEADER_KEY)
    assert after is not None
    assert after.value == entry.value
    assert json.loads(after.value)["epoch"] == scene.epoch
    await scene.victim_intact()  # leads, in the same epoch


# --- 11: deleting the stream -----------------------------------------------------------------------------------
async def test_11_the_event_stream_cannot_be_deleted_purged_or_shrunk(scene: Scene) -> None:
    js = scene.operator.bus.js
    stream = f"{NAMESPACE}_RH_EVENTS"
    info = await js.stream_info(stream)
    shrunk = json.dumps({**info.config.as_dict(), "max_age": 1_000_000_000})  # keep history 1 s
    for attacker in (scene.mallory, scene.rogue):
        await attacker.request_denied(f"$JS.API.STREAM.DELETE.{stream}")
        await attacker.request_denied(f"$JS.API.STREAM.PURGE.{stream}", b"{}")
        await attacker.request_denied(f"$JS.API.STREAM.UPDATE.{stream}", shrunk.encode())
        await attacker.request_denied(f"$JS.API.STREAM.MSG.DELETE.{stream}", json.dumps({"seq": 1}).encode())
    after = await js.stream_info(stream)
    assert after.config.max_age == info.config.max_age
    assert after.state.first_seq == info.state.first_seq
    assert after.state.messages >= info.state.messages
    await scene.run_legit("after-stream-delete")  # the next submission works
    await scene.victim_intact()


# --- 12: a flood of rounds ---------------------------------------------------------------------------------------
async def test_12_a_flood_of_rounds_naming_unknown_jobs_is_refused_and_a_good_job_starts_promptly(scene: Scene) -> None:
    rounds = scene.facts.of("schedule.round")
    assert rounds, "a real round to copy"
    ghosts = [f"ghost-{i}" for i in range(64)]
    real = rounds[-1]
    forged = json.dumps({**real, "round": real["round"] + 1, "ranked": ghosts, "event_id": str(uuid.uuid4()),
                         "gpu_targets": dict.fromkeys(ghosts, 1)}).encode()  # fmt: skip
    placement = await _placement_stats(scene)
    for attacker in (scene.mallory, scene.rogue):
        for to in ("any", "placement-local"):
            await attacker.publish_denied(f"schedule.round.{to}", forged)
    stop = asyncio.Event()

    async def flood(attacker: Attacker) -> int:
        sent = 0
        while not stop.is_set():
            for _ in range(50):
                await attacker.nc.publish(attacker.wire("schedule.round.any"), forged)
            sent += 50
            await attacker.nc.flush()
            await asyncio.sleep(0)
        return sent

    flooding = [asyncio.create_task(flood(a)) for a in (scene.mallory, scene.rogue)]
    try:
        _, start_s = await scene.run_legit("during-flood")
    finally:
        stop.set()
        sent = sum(await asyncio.gather(*flooding))
    assert sent >= 100
    assert start_s < 5.0, f"a good job took {start_s:.2f} s to start during the flood"
    after = await _placement_stats(scene)
    assert after["round_errors"] == placement["round_errors"], (placement, after)  # none of them reached it
    await scene.victim_intact()


async def _placement_stats(scene: Scene) -> dict[str, Any]:
    msg = await scene.operator.bus.nc.request(scene.wire("rh.placement.stats"), b"", timeout=5)
    stats: dict[str, Any] = json.loads(msg.data)["service"]
    return stats


# --- one test per role: the running cluster's generated permissions --------------------------------------------
@pytest.mark.parametrize("role", [Role.SCHEDULER, Role.ADMISSION, Role.PLACEMENT, Role.METRICS, Role.WORKER, Role.USER])
async def test_each_role_is_refused_what_it_must_not_do(scene: Scene, role: Role) -> None:
    """The dangerous things outside each role's rights, with the credentials ``up`` issued it
    (tests/integration/test_auth.py checks the full table on a bare broker)."""
    assert scene.cluster.auth is not None
    name = {Role.WORKER: scene.rogue_node, Role.USER: MALLORY}.get(role, role.value)
    creds = scene.cluster.auth.creds_path(role, name)
    attacker = await Attacker.connect(scene.url, namespace=NAMESPACE, creds=creds, sent=scene.facts.forged)
    stream = f"{NAMESPACE}_RH_EVENTS"
    grant = f"lease.grant.{scene.target}"
    publish = {
        Role.SCHEDULER: [f"job.completed.{scene.target}", f"job.arrived.{ALICE}", f"job.cancel.{ALICE}"],
        Role.ADMISSION: [grant, f"job.completed.{scene.target}", f"job.arrived.{ALICE}", "schedule.round.any"],
        Role.PLACEMENT: [grant, f"lease.revoke.{scene.target}", f"job.completed.{scene.target}"],
        Role.METRICS: [grant, f"job.completed.{scene.target}", f"node.register.{scene.target}", "placement.plan"],
        Role.WORKER: [f"lease.grant.{scene.rogue_node}", f"job.started.{scene.target}", "placement.plan"],
        Role.USER: [f"job.arrived.{ALICE}", grant, "job.accepted", "placement.plan"],
    }[role]
    subscribe = {
        Role.SCHEDULER: ["metrics.>"],
        Role.ADMISSION: ["lease.grant.*", "schedule.round.*"],
        Role.PLACEMENT: ["job.arrived.*", "lease.grant.*", "node.heartbeat.*"],
        Role.METRICS: ["job.arrived.*", "lease.grant.*", "schedule.round.*"],
        Role.WORKER: [f"lease.grant.{scene.target}", "job.arrived.*", "schedule.round.*"],
        Role.USER: ["job.arrived.*", "lease.grant.*", "node.heartbeat.*", "schedule.round.*"],
    }[role]
    try:
        for subject in publish:
            await attacker.publish_denied(subject, b"{}")
        for subject in subscribe:
            await attacker.subscribe_denied(subject)
        await attacker.request_denied(f"$JS.API.STREAM.DELETE.{stream}")  # the operator's alone
    finally:
        await attacker.close()


# --- beyond the twelve: a node that says it drains -------------------------------------------------------------
async def test_13_a_node_that_says_it_drains_stops_no_placement_elsewhere(scene: Scene) -> None:
    """A compromised node owns its host: it may stop its agent and speak for its node alone, saying
    it drains (its own heartbeat, which the broker rightly lets through). That must keep work off that
    node only: a good job that fits on the third node must still start there."""
    incarnation = await _incarnation(scene, scene.rogue_node)
    (agent,) = [c for c in scene.cluster.children if c.name == f"worker-{scene.rogue_node.removeprefix('node-')}"]
    agent.process.send_signal(signal.SIGSTOP)
    stop = asyncio.Event()

    async def draining() -> None:
        seq = 1_000_000
        while not stop.is_set():
            seq += 1
            beat = NodeHeartbeat(node_id=scene.rogue_node, incarnation=incarnation, seq=seq, epoch_seen=scene.epoch,
                                 leases=[], draining=True)  # fmt: skip
            await scene.rogue.publish(f"node.heartbeat.{scene.rogue_node}", beat)
            await asyncio.sleep(0.05)  # a heartbeat every 50 ms: the attacker's rate, not a wait on anything

    beats = asyncio.create_task(draining())
    try:
        node, start_s = await scene.run_legit("beside-a-draining-node", within_s=8.0)
    finally:
        stop.set()
        await beats
        agent.process.send_signal(signal.SIGCONT)
    assert node not in (scene.target, scene.rogue_node)
    assert start_s < 5.0


async def _incarnation(scene: Scene, node: str) -> uuid.UUID:
    """The node's current incarnation, as its host (compromised) knows it: read here off its heartbeat."""
    got: asyncio.Queue[Msg] = asyncio.Queue()

    async def on_msg(msg: Msg) -> None:
        got.put_nowait(msg)

    sub = await scene.operator.bus.nc.subscribe(scene.wire(f"node.heartbeat.{node}"), cb=on_msg)
    try:
        msg = await asyncio.wait_for(got.get(), 10)
    finally:
        await sub.unsubscribe()
    return uuid.UUID(json.loads(msg.data)["incarnation"])


# --- the end: every legitimate job ran once, the victims are intact ---------------------------------------------
async def test_zy_every_good_job_ran_once_and_the_victim_was_never_touched(scene: Scene) -> None:
    await scene.victim_intact()
    assert len(scene.legit) >= 5
    for job_id in scene.legit:
        view = await poll(functools.partial(scene.view, job_id), lambda v: v["status"] == JobStatus.COMPLETED,
                          f"{job_id} completes")  # fmt: skip
        assert view["status"] == JobStatus.COMPLETED
        assert len(scene.facts.of("job.started", job_id=job_id)) == 1, job_id
        assert len(scene.facts.of("job.completed", job_id=job_id)) == 1, job_id
    assert scene.facts.of("lease.grant", job_id=scene.queued) == []
    assert not scene.marker.exists()
    await scene.alice.cancel(scene.queued)  # and alice, unlike mallory, may cancel her own job
    await poll(lambda: scene.view(scene.queued), lambda v: v["status"] == JobStatus.CANCELLED, "alice cancels her job")
