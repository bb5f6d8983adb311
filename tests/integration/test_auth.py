"""A secured broker enforces who may connect and what each role may do (issue 13, items 1-2).

Every refusal is checked together with a control on the same connection that the broker lets
through, so a test cannot pass because nothing works at all; and a refusal must show up as the
broker's permissions violation (logged by the bus), not as a message that merely got lost.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Protocol

import nats.errors
import pytest

from roundhouse.client import Client
from schemas.job import JobSpec
from schemas.roles import Role
from services.runtime.auth import CredentialsError, new_credentials
from services.runtime.bus import AuthenticationError, Bus, BusOptions
from tests.bus_probes import reaches
from tests.conftest import SECURE_NODES, SECURE_USERS, SecureBroker

WAIT_S = 0.4
"""How long a refused message is waited for: the broker's violation is what proves the refusal."""
ALLOWED_WAIT_S = 5.0
"""How long an allowed message may take to arrive (returns as soon as it does; generous for loaded CI)."""


class Denials:
    """The permissions violations the bus logged (``roundhouse.bus``), as the broker reported them."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self.caplog = caplog
        caplog.set_level(logging.ERROR, logger="roundhouse.bus")

    def all(self) -> list[str]:
        return [r.getMessage().lower() for r in self.caplog.records if "permission denied" in r.getMessage()]

    async def wait_for(self, subject: str, timeout_s: float = 2.0) -> str:
        """The violation naming ``subject`` (AssertionError if none came)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [d for d in self.all() if f'"{subject.lower()}"' in d]
            if found:
                return found[0]
            await asyncio.sleep(0.02)
        raise AssertionError(f"no permissions violation for {subject!r}; logged: {self.all()}")


@pytest.fixture
def denials(caplog: pytest.LogCaptureFixture) -> Denials:
    return Denials(caplog)


class ConnectAs(Protocol):
    """Connect to the secured broker as one identity (services: their role's name)."""

    async def __call__(self, role: Role, name: str | None = None) -> Bus: ...


@pytest.fixture
async def connect_as(secure_broker: SecureBroker) -> AsyncIterator[ConnectAs]:
    opened: list[Bus] = []

    async def connect(role: Role, name: str | None = None) -> Bus:
        bus = await Bus.connect(
            secure_broker.broker.url, name=f"test-{role.value}", provision=False,
            options=BusOptions(namespace=secure_broker.namespace, max_reconnect_attempts=1, publish_timeout_s=WAIT_S),
            creds=secure_broker.creds(role, name),
        )  # fmt: skip
        opened.append(bus)
        return bus

    yield connect
    for bus in opened:
        await bus.close()


async def delivered(watcher: Bus, speaker: Bus, subject: str, within: float = ALLOWED_WAIT_S) -> bool:
    """Whether a message ``speaker`` publishes on ``subject`` reaches a subscriber (the operator)."""
    return await reaches(watcher, speaker, subject, within)


async def hears(listener: Bus, speaker: Bus, subject: str, within: float = ALLOWED_WAIT_S) -> bool:
    """Whether ``listener``, subscribing to ``subject``, gets what the operator publishes there."""
    return await reaches(listener, speaker, subject, within, settle_s=0.05)


# --- who may connect -------------------------------------------------------------------------------------
async def test_a_connection_without_credentials_is_refused_at_once(secure_broker: SecureBroker) -> None:
    began = time.monotonic()
    refusal = r"this NATS requires credentials .*: pass --creds FILE or set ROUNDHOUSE_CREDS"
    with pytest.raises(AuthenticationError, match=refusal):
        # Services retry a lost connection forever; a refusal must still end the attempt.
        await Bus.connect(secure_broker.broker.url, options=BusOptions(namespace=secure_broker.namespace),
                          provision=False)  # fmt: skip
    assert time.monotonic() - began < 5


async def test_credentials_the_broker_does_not_know_are_refused(secure_broker: SecureBroker) -> None:
    stranger = new_credentials(Role.OPERATOR, "mallory")  # a valid key, never registered
    with pytest.raises(AuthenticationError, match="refused the credentials of operator mallory"):
        await Bus.connect(secure_broker.broker.url, provision=False, creds=stranger)


async def test_client_without_credentials_is_refused_with_the_fix(secure_broker: SecureBroker) -> None:
    with pytest.raises(ConnectionError, match="ROUNDHOUSE_CREDS"):
        await Client.connect(secure_broker.broker.url, namespace=secure_broker.namespace)


def test_creds_files_are_private(secure_broker: SecureBroker) -> None:
    files = sorted(secure_broker.auth.root.rglob("*.creds"))
    assert len(files) == 4 + 1 + len(SECURE_USERS) + len(SECURE_NODES)
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700, path.parent
    assert stat.S_IMODE(secure_broker.auth.root.stat().st_mode) == 0o700


async def test_a_group_readable_creds_file_is_refused(secure_broker: SecureBroker) -> None:
    path = secure_broker.creds(Role.USER, "alice")
    path.chmod(0o640)
    try:
        with pytest.raises(CredentialsError, match="chmod 600"):
            await Bus.connect(secure_broker.broker.url, provision=False, creds=path)
    finally:
        path.chmod(0o600)


# --- users ---------------------------------------------------------------------------------------------
async def test_a_user_submits_as_itself_and_cannot_read_specs_or_grants(
    secure_broker: SecureBroker, connect_as: ConnectAs, denials: Denials
) -> None:
    await connect_as(Role.SCHEDULER)  # provisions nothing (provision=False): the stream comes next
    scheduler = await Bus.connect(
        secure_broker.broker.url, options=BusOptions(namespace=secure_broker.namespace),
        creds=secure_broker.creds(Role.SCHEDULER),
    )  # fmt: skip
    try:
        operator = await connect_as(Role.OPERATOR, "operator")
        alice = await connect_as(Role.USER, "alice")
        # Allowed: its own submissions (stored by JetStream, acked on its own inbox) ...
        client = Client(alice, identity=alice.identity, authenticated=True)
        verdict = await client.submit(JobSpec(name="mine", command=["true"]), wait=False)
        assert verdict.outcome == "submitted"
        assert await delivered(operator, alice, "job.arrived.alice")
        # ... and verdicts.
        assert await hears(alice, operator, "job.accepted")
        # Refused: another user's submissions and cancellations, everyone's specs and grants.
        assert not await delivered(operator, alice, "job.arrived.bob", within=WAIT_S)
        await denials.wait_for(f"{secure_broker.namespace}.job.arrived.bob")
        assert not await delivered(operator, alice, "job.cancel.bob", within=WAIT_S)
        await denials.wait_for(f"{secure_broker.namespace}.job.cancel.bob")
        for subject in ("job.arrived.*", "lease.grant.*", "lease.grant.node-a"):
            assert not await hears(alice, operator, subject, within=WAIT_S), subject
            await denials.wait_for(f"{secure_broker.namespace}.{subject}")
        # Another identity's replies.
        bob_inbox = "_INBOX.user.bob.x"
        sub = await alice.nc.subscribe(bob_inbox)
        await alice.nc.flush()
        await denials.wait_for(bob_inbox)
        await sub.unsubscribe()
    finally:
        await scheduler.close()


async def test_a_user_cannot_submit_as_someone_else(connect_as: ConnectAs) -> None:
    alice = await connect_as(Role.USER, "alice")
    client = Client(alice, identity=alice.identity, authenticated=True)
    with pytest.raises(PermissionError, match="permission denied: you are authenticated as alice; you cannot submit"):
        await client.submit(JobSpec(name="x", command=["true"], user="bob"), wait=False)


async def test_a_user_cannot_use_the_jetstream_api(
    secure_broker: SecureBroker, connect_as: ConnectAs, denials: Denials
) -> None:
    alice = await connect_as(Role.USER, "alice")
    stream = f"{secure_broker.namespace}_RH_EVENTS"
    with pytest.raises(nats.errors.TimeoutError):
        await alice.js.delete_stream(stream)
    await denials.wait_for(f"$JS.API.STREAM.DELETE.{stream}")
    with pytest.raises(nats.errors.TimeoutError):  # reading the history (other users' specs and env)
        await alice.js.pull_subscribe(alice.wire("job.arrived.*"), stream=stream)
    assert any("$js.api.consumer" in d for d in denials.all()), denials.all()


# --- workers -------------------------------------------------------------------------------------------
async def test_a_worker_speaks_and_hears_only_for_its_own_node(
    secure_broker: SecureBroker, connect_as: ConnectAs, denials: Denials
) -> None:
    operator = await connect_as(Role.OPERATOR, "operator")
    node_a = await connect_as(Role.WORKER, "node-a")
    ns = secure_broker.namespace
    for fact in ("job.started", "job.completed", "job.failed", "job.suspended", "node.heartbeat", "node.register"):
        assert await delivered(operator, node_a, f"{fact}.node-a"), fact
        assert not await delivered(operator, node_a, f"{fact}.node-b", within=WAIT_S), fact
        await denials.wait_for(f"{ns}.{fact}.node-b")
    assert await hears(node_a, operator, "lease.grant.node-a")
    assert not await hears(node_a, operator, "lease.grant.node-b", within=WAIT_S)
    await denials.wait_for(f"{ns}.lease.grant.node-b")
    # A worker never commands: no grant or revoke, for any node.
    assert not await delivered(operator, node_a, "lease.revoke.node-a", within=WAIT_S)
    await denials.wait_for(f"{ns}.lease.revoke.node-a")


# --- services ------------------------------------------------------------------------------------------
async def test_placement_plans_but_cannot_grant(
    secure_broker: SecureBroker, connect_as: ConnectAs, denials: Denials
) -> None:
    operator = await connect_as(Role.OPERATOR, "operator")
    placement = await connect_as(Role.PLACEMENT)
    assert await delivered(operator, placement, "placement.plan")
    assert not await delivered(operator, placement, "lease.grant.node-a", within=WAIT_S)
    await denials.wait_for(f"{secure_broker.namespace}.lease.grant.node-a")
    assert not await hears(placement, operator, "job.arrived.*", within=WAIT_S)  # specs reach it only through rounds
    await denials.wait_for(f"{secure_broker.namespace}.job.arrived.*")


async def test_admission_cannot_grant_or_speak_for_a_node(
    secure_broker: SecureBroker, connect_as: ConnectAs, denials: Denials
) -> None:
    operator = await connect_as(Role.OPERATOR, "operator")
    admission = await connect_as(Role.ADMISSION)
    assert await delivered(operator, admission, "job.accepted")
    for subject in ("lease.grant.node-a", "job.completed.node-a"):
        assert not await delivered(operator, admission, subject, within=WAIT_S)
        await denials.wait_for(f"{secure_broker.namespace}.{subject}")


@pytest.mark.parametrize(
    ("role", "name"),
    [(Role.PLACEMENT, None), (Role.ADMISSION, None), (Role.METRICS, None), (Role.WORKER, "node-a"), (Role.USER, "bob")],
)
async def test_only_the_scheduler_writes_the_leader_key(
    secure_broker: SecureBroker, connect_as: ConnectAs, denials: Denials,
    role: Role, name: str | None,
) -> None:  # fmt: skip
    scheduler = await connect_as(Role.SCHEDULER)
    bucket = await scheduler.kv("scheduler-leader", history=1)
    await bucket._kv.put("leader", b"scheduler")  # the control: the scheduler may
    other = await connect_as(role, name)
    kv_subject = f"$KV.{secure_broker.namespace}_scheduler-leader.leader"
    with pytest.raises(nats.errors.TimeoutError):
        await other.js.publish(kv_subject, b"usurper", timeout=WAIT_S)
    await denials.wait_for(kv_subject)
    entry = await bucket._kv.get("leader")
    assert entry.value == b"scheduler"


@pytest.mark.parametrize("role", [Role.SCHEDULER, Role.ADMISSION])
async def test_services_provision_the_stream_but_only_the_operator_deletes_it(
    secure_broker: SecureBroker, connect_as: ConnectAs, denials: Denials, role: Role
) -> None:
    service = await connect_as(role)
    await service.provision()  # create or update: theirs
    with pytest.raises(nats.errors.TimeoutError):
        await service.js.delete_stream(service.stream_name)
    await denials.wait_for(f"$JS.API.STREAM.DELETE.{service.stream_name}")
    with pytest.raises(nats.errors.TimeoutError):
        await service.js.purge_stream(service.stream_name)
    await denials.wait_for(f"$JS.API.STREAM.PURGE.{service.stream_name}")
    operator = await connect_as(Role.OPERATOR, "operator")
    assert await operator.js.delete_stream(service.stream_name)
    await service.provision()  # and back, for the other tests


@pytest.mark.parametrize("role", [Role.PLACEMENT, Role.METRICS, Role.WORKER, Role.USER])
async def test_other_roles_cannot_change_the_stream(
    secure_broker: SecureBroker, connect_as: ConnectAs, denials: Denials, role: Role
) -> None:
    operator = await connect_as(Role.OPERATOR, "operator")
    await operator.provision()
    config = (await operator.js.stream_info(operator.stream_name)).config
    bus = await connect_as(role, {Role.WORKER: "node-a", Role.USER: "alice"}.get(role))
    with pytest.raises(nats.errors.TimeoutError):  # e.g. keep the history 1 s: the same as purging it
        await bus.js.update_stream(replace(config, max_age=1.0))
    await denials.wait_for(f"$JS.API.STREAM.UPDATE.{bus.stream_name}")
    assert (await operator.js.stream_info(operator.stream_name)).config.max_age == config.max_age


# --- adding an identity to a running broker ------------------------------------------------------------
async def test_a_user_added_later_connects_after_a_reload(secure_broker: SecureBroker) -> None:
    issued = secure_broker.auth.add(Role.USER, "carol")
    with pytest.raises(AuthenticationError):
        await Bus.connect(secure_broker.broker.url, provision=False, creds=issued.creds)
    secure_broker.broker.reload()
    deadline = time.monotonic() + 5
    while True:
        try:
            bus = await Bus.connect(secure_broker.broker.url, provision=False, creds=issued.creds)
            break
        except AuthenticationError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)
    assert bus.identity == "carol"
    await bus.close()


# --- services ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("creds", "message"),
    [
        pytest.param(None, "this NATS requires credentials", id="none"),
        pytest.param((Role.SCHEDULER, None), "the placement service needs placement credentials", id="another-role"),
    ],
)
def test_a_service_without_fitting_credentials_exits_at_once_saying_why(
    secure_broker: SecureBroker, creds: tuple[Role, str | None] | None, message: str
) -> None:
    args = [sys.executable, "-m", "roundhouse", "service", "placement", "--nats", secure_broker.broker.url,
            "--namespace", secure_broker.namespace, "--log-format", "text"]  # fmt: skip
    if creds is not None:
        args += ["--creds", str(secure_broker.creds(*creds))]
    env = {k: v for k, v in os.environ.items() if k != "ROUNDHOUSE_CREDS"}
    done = subprocess.run(args, check=False, capture_output=True, text=True, timeout=30, env=env)
    assert done.returncode == 1
    assert message in done.stdout + done.stderr


async def test_the_scheduler_reads_job_metrics_but_only_the_metrics_service_writes_them(
    secure_broker: SecureBroker, connect_as: ConnectAs, denials: Denials
) -> None:
    scheduler = await connect_as(Role.SCHEDULER)
    # Opened (created if the metrics service has not run yet) and watched when a scheduler leads.
    bucket = await scheduler.kv("job-metrics")
    key_subject = f"$KV.{secure_broker.namespace}_job-metrics.j1"
    with pytest.raises(nats.errors.TimeoutError):
        await scheduler.js.publish(key_subject, b"{}", timeout=WAIT_S)
    await denials.wait_for(key_subject)
    metrics = await connect_as(Role.METRICS)
    await (await metrics.kv("job-metrics"))._kv.put("j1", b"{}")
    entry = await bucket._kv.get("j1")
    assert entry.value == b"{}"
