"""The web dashboard of a live, secured ``roundhouse up`` (issue 15, item 2).

A real broker, scheduler and emulating workers; ``up`` starts the dashboard and records its URL.
Visitors sign in as their own bus identity (HTTP Basic: identity, credentials seed): nothing is
served without it, the broker refuses another's name with one's own seed, a user sees only their
own jobs and an operator everyone's. The page is loaded in a real headless Chromium (Debian's
``chromium``; the test skips with a reason where it is absent), which must show the submitted job
and a node; its screenshot is kept under ``test-artifacts/`` (its path is printed).
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from roundhouse.client import Client
from roundhouse.endpoint import DEFAULT_STATE_DIR, UP_FILE
from roundhouse.local import LocalCluster, LocalClusterConfig
from schemas.job import JobSpec
from schemas.roles import Role
from services.runtime.auth import AuthDirectory
from services.runtime.auth.creds import new_credentials
from tests.local_up import local_up

NAMESPACE = "dashlive"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
PAGE_WAIT_S = 60.0
BROWSER_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    state = tmp_path_factory.mktemp("dashboard") / DEFAULT_STATE_DIR
    AuthDirectory(state / "auth").init(namespace=NAMESPACE, users=("bob",))  # up keeps identities that exist
    config = LocalClusterConfig(
        state_dir=state, workers=2, gpus_per_worker=2, round_s=1.0, emulate=True, speedup=10.0, user="alice",
        namespace=NAMESPACE, dashboard=True,
    )  # fmt: skip
    with local_up(config) as running:
        yield running


def seed(cluster: LocalCluster, role: Role, name: str) -> str:
    assert cluster.auth is not None
    return cluster.auth.credentials(role, name).seed


def submit(cluster: LocalCluster, user: str, spec: JobSpec, job_id: str) -> None:
    assert cluster.endpoint is not None
    assert cluster.auth is not None
    creds = cluster.auth.creds_path(Role.USER, user)

    async def go() -> str:
        async with await Client.connect(cluster.endpoint.nats, namespace=NAMESPACE, creds=creds) as client:
            return (await client.submit(spec, job_id=job_id)).outcome

    assert asyncio.run(go()) == "accepted"


@pytest.fixture(scope="module")
def jobs(cluster: LocalCluster) -> dict[str, str]:
    """alice's running job and her job too big to place (it waits with a reason), bob's job."""
    submit(cluster, "alice", JobSpec(name="train", command=["python", "t.py"], gpus=1, expected_duration_s=3600),
           "alice-train-1")  # fmt: skip
    submit(cluster, "alice", JobSpec(name="huge", command=["python", "t.py"], gpus=8), "alice-huge-1")
    submit(cluster, "bob", JobSpec(name="secret", command=["python", "t.py"], gpus=1, expected_duration_s=3600),
           "bob-secret-1")  # fmt: skip
    return {"alice": "alice-train-1", "alice_waiting": "alice-huge-1", "bob": "bob-secret-1"}


def get(url: str, user: str | None = None, password: str | None = None) -> tuple[int, str, dict[str, str]]:
    request = urllib.request.Request(url)
    if user is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


def page_showing(url: str, user: str, password: str, *wanted: str) -> str:
    """The page as ``user`` once it shows every ``wanted`` text (the scheduler applies arrivals in its
    own time), or fail with the last page seen."""
    deadline = time.monotonic() + PAGE_WAIT_S
    while True:
        status, body, _ = get(url, user, password)
        assert status == 200, body
        if all(text in body for text in wanted):
            return body
        assert time.monotonic() < deadline, f"the page never showed {wanted}:\n{body}"
        time.sleep(0.3)


def test_up_serves_the_dashboard_on_loopback_and_records_its_url(cluster: LocalCluster) -> None:
    url = json.loads((cluster.state_dir / UP_FILE).read_text())["dashboard_url"]
    assert url == cluster.dashboard_url
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", url), url


def test_nothing_is_served_without_the_visitors_own_credentials(cluster: LocalCluster, jobs: dict[str, str]) -> None:
    assert cluster.dashboard_url is not None
    url = cluster.dashboard_url
    stranger = new_credentials(Role.USER, "alice").seed  # a well-formed seed the broker does not know
    attempts = {
        "none": (None, None),
        "unknown seed": ("alice", stranger),
        "bob's name, alice's seed": ("bob", seed(cluster, Role.USER, "alice")),
    }
    for what, (user, password) in attempts.items():
        status, body, headers = get(url, user, password)
        assert status == 401, (what, body)
        assert headers["WWW-Authenticate"].startswith("Basic realm="), what
        assert jobs["alice"] not in body, what
        assert jobs["bob"] not in body, what


def test_a_user_sees_only_their_own_jobs_and_an_operator_everyones(
    cluster: LocalCluster, jobs: dict[str, str]
) -> None:
    assert cluster.dashboard_url is not None
    url = cluster.dashboard_url
    alice = page_showing(url, "alice", seed(cluster, Role.USER, "alice"), jobs["alice"], jobs["alice_waiting"])
    assert jobs["bob"] not in alice
    assert ">bob<" not in alice
    queue = re.search(r'<table id="queue">.*?</table>', alice, re.S)
    assert queue is not None
    assert jobs["alice_waiting"] in queue[0]
    assert "needs 8 GPUs" in queue[0]  # the scheduler's reason
    bob = page_showing(url, "bob", seed(cluster, Role.USER, "bob"), jobs["bob"])
    assert jobs["alice"] not in bob
    assert jobs["alice_waiting"] not in bob
    operator = page_showing(url, "operator", seed(cluster, Role.OPERATOR, "operator"), jobs["alice"], jobs["bob"])
    assert re.search(r'<table id="nodes">.*node-0.*node-1', operator, re.S)
    assert re.search(r'<table id="policies">.*scheduler.*las', operator, re.S)


def test_the_page_in_headless_chromium_shows_the_job_and_a_node(
    cluster: LocalCluster, jobs: dict[str, str], tmp_path: Path
) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium; .ci/run installs it as root)")
    assert cluster.dashboard_url is not None
    password = seed(cluster, Role.USER, "alice")
    page_showing(cluster.dashboard_url, "alice", password, jobs["alice"], "node-0")
    # Credentials in the URL: Chromium sends them as HTTP Basic for the top-level page it loads.
    signed_in = cluster.dashboard_url.replace("http://", f"http://alice:{password}@", 1)
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
              f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,1100"]  # fmt: skip
    dom = subprocess.run([*common, "--dump-dom", signed_in], capture_output=True, text=True,
                         timeout=BROWSER_TIMEOUT_S, check=True).stdout  # fmt: skip
    assert re.search(r'id="visitor">alice<', dom), dom[:2000]
    assert re.search(rf'<table id="running">.*{jobs["alice"]}', dom, re.S), dom
    assert re.search(r'<table id="nodes">.*node-0', dom, re.S), dom
    assert jobs["bob"] not in dom
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / f"dashboard-{time.strftime('%Y%m%d-%H%M%S')}.png"
    subprocess.run([*common, f"--screenshot={shot}", signed_in], capture_output=True, timeout=BROWSER_TIMEOUT_S,
                   check=True)  # fmt: skip
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 10_000  # a rendered page, not an empty image
    print(f"dashboard screenshot: {shot}")
