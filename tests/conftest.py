"""Shared fixtures: one real nats-server per test session, a unique namespace per test."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from services.runtime.broker import Broker
from services.runtime.bus import Bus, BusOptions

REPO_ROOT = Path(__file__).resolve().parents[1]
TRACES_DIR = REPO_ROOT.parent / "shared" / "data" / "traces"


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """The bundled nats-server with JetStream on a port it picked itself."""
    with Broker(tmp_path_factory.mktemp("nats")) as running:
        yield running


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
