"""The dashboard's aiohttp application with a stand-in bus (issue 15, item 2): no page without
signing in (401 and a Basic challenge), credentials the broker refuses are refused, a session is
opened once per identity and reused, a hostile job name reaches the browser escaped, and only an
``--insecure`` dashboard serves anyone. The live test (tests/e2e/test_dashboard_live.py) does the
same against a real ``roundhouse up`` with a real broker and scheduler."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from roundhouse.dashboard import DashboardConfig, SnapshotSource, create_app
from schemas.control import JobsQuery, JobsReply, JobView
from schemas.job import JobClass
from schemas.operations import InstanceView, NodesReply, NodeState, NodeView, ServiceView, StatusReply
from schemas.roles import Role
from services.runtime.auth.creds import Credentials, new_credentials
from services.runtime.bus import AuthenticationError

ALICE = new_credentials(Role.USER, "alice")
HOSTILE_NAME = "<script>document.title='owned'</script>"


def hostile_job() -> JobView:
    # The schemas refuse such a name today; the page must not depend on it.
    return JobView.model_construct(
        job_id="j-1", name=HOSTILE_NAME, user="alice", job_class=JobClass.BE, status="queued", gpus=1, placement={},
        submit_time=1000.0, first_start_time=None, finish_time=None, attained_service_s=0.0, runtime_s=0.0,
        queue_position=1, iterations_done=0, preemptions=0, reason="needs <b>4</b> GPUs", exit_code=None, signal=None,
    )  # fmt: skip


class FakeClient:
    """What the dashboard uses of ``roundhouse.client.Client``: an identity, ``jobs`` and ``close``."""

    def __init__(self, identity: str) -> None:
        self.identity = identity
        self.closed = False
        self.asked = 0
        self.bus = SimpleNamespace(nc=SimpleNamespace(is_closed=False), identity=identity, request=self._operations)

    async def _operations(self, subject: str, query: object, reply: type[Any], **_: object) -> Any:
        """``query.nodes`` and ``query.status``: one node, one scheduler instance."""
        if reply is NodesReply:
            node = NodeView(node_id="node-0", hostname="h0", state=NodeState.IDLE, gpus_total=4, gpus_used=0,
                            gpus_free=4, live=True, takes_work=True)  # fmt: skip
            return NodesReply(nodes=[node], epoch=1)
        instance = InstanceView(instance="scheduler-a", service_id="x", policy="las", leader=True)
        service = ServiceView(kind="scheduler", instances=[instance])
        return StatusReply(leader="scheduler-a", epoch=1, services=[service])

    async def jobs(self, query: JobsQuery | None = None, *, timeout_s: float = 5.0) -> JobsReply:
        self.asked += 1
        return JobsReply.model_construct(jobs=[hostile_job()], truncated=False, epoch=1, refused={})

    async def close(self) -> None:
        self.closed = True


class FakeBroker:
    """Accepts ALICE's seed only, as a secured broker would; counts connections."""

    def __init__(self) -> None:
        self.opened: list[FakeClient] = []

    async def connect(self, credentials: Credentials | None) -> Any:
        if credentials is not None and credentials.seed != ALICE.seed:
            raise AuthenticationError("authorization violation")
        client = FakeClient(credentials.identity if credentials is not None else "default")
        self.opened.append(client)
        return client


def basic(user: str, seed: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{seed}".encode()).decode()}


Serve = Callable[..., Any]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    clients: list[TestClient[Any, Any]] = []

    async def start(broker: FakeBroker, *, insecure: bool = False, **config: float) -> TestClient[Any, Any]:
        settings = DashboardConfig(insecure=insecure, **{"sample_s": 3600.0, **config})
        app = create_app(settings, broker.connect, SnapshotSource())
        client = TestClient(TestServer(app))
        await client.start_server()
        clients.append(client)
        return client

    yield start
    for client in clients:
        await client.close()


async def test_no_page_without_signing_in(serve: Serve) -> None:
    broker = FakeBroker()
    http = await serve(broker)
    for headers in ({}, {"Authorization": "Bearer x"}, basic("alice", "not-a-seed")):
        response = await http.get("/", headers=headers)
        assert response.status == 401, headers
        assert response.headers["WWW-Authenticate"].startswith("Basic realm=")
        assert "j-1" not in await response.text()
    assert broker.opened == []  # nothing reached the bus without credentials that could be some


async def test_credentials_the_broker_refuses_get_401(serve: Serve) -> None:
    broker = FakeBroker()
    http = await serve(broker)
    mallory = new_credentials(Role.USER, "alice")  # alice's name, another key
    response = await http.get("/", headers=basic("alice", mallory.seed))
    assert response.status == 401
    assert "refused" in await response.text()
    assert broker.opened == []


async def test_a_signed_in_visitor_gets_the_page_escaped_from_one_session(serve: Serve) -> None:
    broker = FakeBroker()
    http = await serve(broker)
    for _ in range(2):
        response = await http.get("/", headers=basic("alice", ALICE.seed))
        assert response.status == 200
        page = await response.text()
        assert "<script>" not in page
        assert "&lt;script&gt;document.title=&#x27;owned&#x27;&lt;/script&gt;" in page
        assert "needs &lt;b&gt;4&lt;/b&gt; GPUs" in page
        assert re.search(r'<table id="nodes">.*node-0.*idle', page, re.S)  # from query.nodes
        assert re.search(r'<table id="policies">.*scheduler-a \(leader\).*las', page, re.S)  # from query.status
        assert "script-src" not in response.headers["Content-Security-Policy"]  # default-src 'none': no script
    assert [client.identity for client in broker.opened] == ["alice"]  # one bus connection, reused


async def test_only_an_insecure_dashboard_serves_without_credentials(serve: Serve) -> None:
    broker = FakeBroker()
    http = await serve(broker, insecure=True)
    response = await http.get("/")
    assert response.status == 200
    assert "j-1" in await response.text()


async def test_a_session_samples_while_used_and_closes_when_idle(serve: Serve) -> None:
    broker = FakeBroker()
    http = await serve(broker, sample_s=0.05, idle_s=0.5)
    assert (await http.get("/", headers=basic("alice", ALICE.seed))).status == 200
    (first,) = broker.opened
    asked_by_the_page = first.asked  # the sign-in's proof and the page's snapshot
    deadline = asyncio.get_running_loop().time() + 30
    while not first.closed:
        assert asyncio.get_running_loop().time() < deadline, "the idle session was never closed"
        await asyncio.sleep(0.05)
    assert first.asked > asked_by_the_page  # the sampler asked on its own while the session lived
    asked_when_closed = first.asked
    assert (await http.get("/", headers=basic("alice", ALICE.seed))).status == 200
    assert len(broker.opened) == 2  # signed in again on a fresh connection
    assert first.asked == asked_when_closed
