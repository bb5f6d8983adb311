"""`roundhouse up`'s secured cluster, end to end: generated identities, every part connected with its
own credentials and no permission it lacks, and a job submitted with the CLI (no flags: up.json names
the credentials) runs to completion, while a connection without credentials is refused."""

from __future__ import annotations

import json
import stat
import time
from collections.abc import Iterator

import pytest

from roundhouse.endpoint import DEFAULT_STATE_DIR, UP_FILE
from roundhouse.local import LocalCluster, LocalClusterConfig
from services.runtime.bus import AuthenticationError, Bus
from tests.local_up import cli_where_up_ran, local_up


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("up")
    config = LocalClusterConfig(
        state_dir=root / DEFAULT_STATE_DIR, workers=2, gpus_per_worker=2, round_s=1.0, emulate=True, speedup=10.0,
        user="alice", log_level="INFO",
    )  # fmt: skip
    with local_up(config) as running:
        yield running


run_cli = cli_where_up_ran


def test_up_generates_private_credentials_and_names_the_users_in_up_json(cluster: LocalCluster) -> None:
    assert cluster.auth is not None
    up = json.loads((cluster.state_dir / UP_FILE).read_text())
    assert up["creds"] == str(cluster.auth.root / "user" / "alice.creds")
    names = {(i.identity.role.value, i.identity.name) for i in cluster.auth.list()}
    assert {("scheduler", "scheduler"), ("worker", "node-0"), ("worker", "node-1"), ("user", "alice"),
            ("operator", "operator")} <= names  # fmt: skip
    for path in cluster.auth.root.rglob("*.creds"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


async def test_up_refuses_a_connection_without_credentials(cluster: LocalCluster) -> None:
    assert cluster.endpoint is not None
    with pytest.raises(AuthenticationError):
        await Bus.connect(cluster.endpoint.nats, provision=False)


def test_a_job_submitted_with_the_cli_runs_and_no_part_lacked_a_permission(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_cli(cluster, monkeypatch, "submit", "--gpus", "1", "--expected-duration", "3", "--id", "auth-up-1",
                   "--json", "--", "python", "train.py")  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["outcome"] == "accepted"
    assert run_cli(cluster, monkeypatch, "submit", "--user", "bob", "--", "python", "x.py") == 2
    assert "permission denied: you are authenticated as alice" in capsys.readouterr().err

    deadline = time.monotonic() + 60
    while True:
        assert run_cli(cluster, monkeypatch, "jobs", "--json", "auth-up-1") == 0
        jobs = json.loads(capsys.readouterr().out)["jobs"]
        if jobs and jobs[0]["status"] == "completed":
            break
        assert time.monotonic() < deadline, jobs
        cluster.check()
        time.sleep(0.3)
    assert jobs[0]["user"] == "alice"

    # Every service and worker did all of this with only its role's permissions.
    denied = [
        f"{log.name}: {line[:300]}"
        for log in sorted((cluster.state_dir / "logs").glob("*.log"))
        for line in log.read_text(errors="replace").splitlines()
        if "permission denied" in line or "Permissions Violation" in line
    ]
    assert not denied, "\n".join(denied)


def test_commands_without_usable_credentials_say_why(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cluster.endpoint is not None
    code = run_cli(cluster, monkeypatch, "jobs", "--creds", str(cluster.state_dir / "nope.creds"))
    assert code == 2
    assert "credentials file" in capsys.readouterr().err
    # Another NATS URL than up.json's: its credentials are not used, and the secured broker says so.
    url = cluster.endpoint.nats.replace("127.0.0.1", "localhost")
    assert run_cli(cluster, monkeypatch, "jobs", "--nats", url) == 1
    assert "this NATS requires credentials" in capsys.readouterr().err
