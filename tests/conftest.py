"""Shared fixtures: one real nats-server per test session, a unique namespace per test, and a secured
broker (authentication and role permissions on) per module that asks for it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from schemas.roles import Role
from services.runtime.auth import AuthDirectory
from services.runtime.broker import Broker
from services.runtime.bus import Bus, BusOptions

REPO_ROOT = Path(__file__).resolve().parents[1]
TRACES_DIR = REPO_ROOT.parent / "shared" / "data" / "traces"


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """The bundled nats-server with JetStream on a port it picked itself."""
    with Broker(tmp_path_factory.mktemp("nats")) as running:
        yield running
        # It holds only this session's test streams: a graceful stop, which flushes every one of
        # them, outlasted its 10 s bound at the end of a full run. Nothing in it is read again.
        running.kill()


@pytest.fixture
def namespace() -> str:
    """Unique subjects, streams and buckets for one test."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def bus(broker: Broker, namespace: str) -> AsyncIterator[Bus]:
    options = BusOptions(namespace=namespace)
    connected = await Bus.connect(broker.url, name=f"test-{namespace}", options=options)
    yield connected
    await connected.close()


@pytest.fixture
def traces_dir() -> Path:
    if not TRACES_DIR.is_dir():
        pytest.skip(f"shared traces not found at {TRACES_DIR} (they live beside the repository)")
    return TRACES_DIR


@dataclass(frozen=True, slots=True)
class SecureBroker:
    """A nats-server that authenticates every connection with the permissions of ``schemas.roles``."""

    broker: Broker
    auth: AuthDirectory
    namespace: str

    def creds(self, role: Role, name: str | None = None) -> Path:
        return self.auth.creds_path(role, name or role.value)


SECURE_USERS = ("alice", "bob")
SECURE_NODES = ("node-a", "node-b")


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """A broker with authentication on, its identities generated as ``roundhouse auth init`` does: every
    service, an operator, users alice and bob, nodes node-a and node-b (one namespace per module)."""
    root = tmp_path_factory.mktemp("secure-nats")
    namespace = f"s{uuid.uuid4().hex[:12]}"
    auth = AuthDirectory(root / "auth")
    auth.init(namespace=namespace, users=SECURE_USERS, nodes=SECURE_NODES)
    with Broker(root / "nats", authorization=auth.server_config_path) as running:
        yield SecureBroker(running, auth, namespace)
