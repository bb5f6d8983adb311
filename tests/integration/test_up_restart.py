"""`roundhouse up` across restarts and per service (issue 15, item 5): each policy service gets its own
options, policy names and options are checked before anything starts, one ``up`` holds a state
directory at a time (the second names the first's pid; a crashed one leaves no lock behind), and a
restart in the same directory reuses the namespace, the credentials and the scheduler's store, so a
job submitted before the restart runs after it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from roundhouse.cli import main
from roundhouse.endpoint import DEFAULT_STATE_DIR, UP_FILE
from roundhouse.local import CHILDREN_FILE, LOCK_FILE, STATE_FILE, LocalCluster, LocalClusterConfig, LocalClusterError

ROOT = Path(__file__).resolve().parents[2]


def config(state_dir: Path, **changes: Any) -> LocalClusterConfig:
    settings: dict[str, Any] = {
        "state_dir": state_dir, "workers": 1, "gpus_per_worker": 2, "round_s": 1.0, "emulate": True,
        "speedup": 10.0, "user": "alice",
    }  # fmt: skip
    return LocalClusterConfig(**{**settings, **changes})


def policy_info(url: str) -> dict[str, str]:
    """The ``roundhouse_policy_info`` labels a service's ``/metrics`` shows."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "roundhouse_policy_info":
                return dict(sample.labels)
    raise AssertionError(f"no roundhouse_policy_info at {url}")


def run_cli(state_dir: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.chdir(state_dir.parent)  # where `roundhouse up` ran: ./.roundhouse/up.json
    monkeypatch.delenv("ROUNDHOUSE_NATS", raising=False)
    monkeypatch.delenv("ROUNDHOUSE_NAMESPACE", raising=False)
    monkeypatch.delenv("ROUNDHOUSE_CREDS", raising=False)
    return main(list(args))


def job_status(state_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], job: str) -> str:
    code = run_cli(state_dir, monkeypatch, "jobs", "--json", job)
    out = capsys.readouterr().out
    if code != 0:
        return "?"
    jobs = json.loads(out)["jobs"]
    return str(jobs[0]["status"]) if jobs else "absent"


def wait_status(
    cluster: LocalCluster,
    *,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    job: str,
    wanted: set[str],
    timeout_s: float,
) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        status = job_status(cluster.state_dir, monkeypatch, capsys, job)
        if status in wanted:
            return status
        assert time.monotonic() < deadline, f"{job} is {status}, not one of {wanted}, after {timeout_s} s"
        cluster.check()
        time.sleep(0.2)


# --- before anything starts ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"scheduler": "nope"}, r"--scheduler: unknown scheduling policy 'nope'; valid: .*\blas\b.*\bsrtf\b"),
        ({"placement": "nope"}, r"--placement: unknown placement policy 'nope'; valid: .*\bconsolidated\b"),
        ({"admission": "nope"}, r"--admission: unknown admission policy 'nope'; valid: .*\buser-quota\b"),
        # user-quota's options given to the scheduler: las refuses them before anything runs.
        ({"scheduler_options": {"max_jobs": 1}}, r"--scheduler: .*'las' rejects --scheduler-options"),
    ],
)
def test_an_invalid_policy_or_option_fails_before_anything_starts(
    tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    state_dir = tmp_path / DEFAULT_STATE_DIR
    cluster = LocalCluster(config(state_dir, **changes))
    with pytest.raises(LocalClusterError, match=message):
        cluster.start()
    assert not cluster.children
    assert not cluster.broker.running
    assert not state_dir.exists()  # not even the lock, the logs or the broker's data


def test_up_cli_names_the_valid_policies_and_lists_defaults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state_dir = tmp_path / DEFAULT_STATE_DIR
    assert main(["up", "--state-dir", str(state_dir), "--admission", "quota"]) == 2
    err = capsys.readouterr().err
    assert "unknown admission policy 'quota'; valid: " in err
    assert "user-quota" in err
    assert not state_dir.exists()
    with pytest.raises(SystemExit):
        main(["up", "--scheduler-options", "[1]"])
    assert "policy options must be a JSON object" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["up", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for expected in ("(default: las)", "(default: consolidated)", "(default: accept-all)", "(default: 30.0)",
                     "srtf", "tiresias", "user-quota", "first-free", "--admission-options JSON"):  # fmt: skip
        assert expected in text, expected


def test_a_namespace_other_than_the_recorded_one_is_refused(tmp_path: Path) -> None:
    state_dir = tmp_path / DEFAULT_STATE_DIR
    state_dir.mkdir()
    (state_dir / STATE_FILE).write_text(json.dumps({"namespace": "rhold"}))
    cluster = LocalCluster(config(state_dir, namespace="rhnew"))
    with pytest.raises(LocalClusterError, match="namespace 'rhold', not 'rhnew'"):
        cluster.start()
    assert not cluster.children
    assert not cluster.broker.running
    assert not cluster.state_lock.held


def test_a_crashed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    state_dir = tmp_path / DEFAULT_STATE_DIR
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from roundhouse.local import StateDirLock;"
         "StateDirLock(Path(sys.argv[1])).acquire(); print('locked', flush=True); time.sleep(60)", str(state_dir)],
        stdout=subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == b"locked"
        from roundhouse.local import StateDirLock, StateDirLocked

        with pytest.raises(StateDirLocked, match=f"pid {holder.pid}\\b") as refused:
            StateDirLock(state_dir).acquire()
        assert refused.value.pid == holder.pid
    finally:
        holder.send_signal(signal.SIGKILL)  # a crash: no cleanup of any kind
        holder.wait(timeout=10)
    assert (state_dir / LOCK_FILE).exists()
    lock = StateDirLock(state_dir)
    lock.acquire()  # the kernel dropped the dead holder's lock
    assert (state_dir / LOCK_FILE).read_text().strip() == str(os.getpid())
    lock.release()


# --- a live cluster, stopped and started again --------------------------------------------------------
@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # An environment-wide policy option must not reach the services (it would be every service's).
    monkeypatch.setenv("ROUNDHOUSE_POLICY_OPTIONS", json.dumps({"bogus": 1}))
    return tmp_path / DEFAULT_STATE_DIR


def test_options_reach_their_service_only_and_a_restart_reuses_everything(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = config(
        state_dir, admission="user-quota", admission_options={"max_jobs": 5},
        scheduler_options={"starvation_s": 1234.0},
    )  # fmt: skip
    first = LocalCluster(settings)
    first.start()
    try:
        first.wait_ready()
        urls = first.metrics_urls
        scheduler = policy_info(urls["scheduler"])
        assert scheduler["policy"] == "las"
        assert json.loads(scheduler["options"]) == {"starvation_s": 1234.0}
        assert json.loads(policy_info(urls["admission"])["options"]) == {"max_jobs": 5}
        assert policy_info(urls["admission"])["policy"] == "user-quota"
        assert json.loads(policy_info(urls["placement"])["options"]) == {}

        # A second `up` in the same directory refuses and names the first's pid; nothing of it starts.
        second = subprocess.run(
            [sys.executable, "-m", "roundhouse", "up", "--state-dir", str(state_dir), "--emulate"],
            check=False, capture_output=True, text=True, timeout=30, cwd=ROOT,
        )  # fmt: skip
        assert second.returncode == 1, second.stderr
        assert f"in use by another `roundhouse up` (pid {os.getpid()})" in second.stderr

        namespace = first.endpoint.namespace if first.endpoint else ""
        assert first.user_creds is not None
        creds = first.user_creds.read_text()
        auth_conf = (state_dir / "auth" / "auth.conf").read_text()
        # A long job: still running (or checkpointed) when the cluster stops.
        code = run_cli(state_dir, monkeypatch, "submit", "--gpus", "2", "--expected-duration", "40",
                       "--id", "restart-1", "--", "python", "train.py")  # fmt: skip
        submitted = capsys.readouterr()
        assert code == 0, submitted.err
        wait_status(first, monkeypatch=monkeypatch, capsys=capsys, job="restart-1", wanted={"running"}, timeout_s=20)
    finally:
        first.stop()
    assert not first.state_lock.held

    again = LocalCluster(settings)
    again.start()
    try:
        again.wait_ready()
        assert again.endpoint is not None
        assert again.endpoint.namespace == namespace
        assert again.namespace_reused
        assert json.loads((state_dir / UP_FILE).read_text())["namespace"] == namespace
        assert again.user_creds is not None
        assert again.user_creds.read_text() == creds
        assert (state_dir / "auth" / "auth.conf").read_text() == auth_conf
        # The job submitted before the restart is still known, resumes and finishes.
        wait_status(again, monkeypatch=monkeypatch, capsys=capsys, job="restart-1", wanted={"completed"}, timeout_s=30)
    finally:
        again.stop()
    scheduler_log = (state_dir / "logs" / "scheduler.log").read_text(errors="replace")
    assert "bogus" not in scheduler_log
    assert not re.search(r"permission denied|Permissions Violation", scheduler_log)


def test_an_up_that_crashed_leaves_nothing_in_the_way_of_the_next(tmp_path: Path) -> None:
    state_dir = tmp_path / DEFAULT_STATE_DIR
    crashed = subprocess.Popen(
        [sys.executable, "-m", "roundhouse", "up", "--state-dir", str(state_dir), "--emulate", "--workers", "1",
         "--gpus-per-worker", "2", "--round", "1", "--user", "alice"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 40
        while "metrics_urls" not in (up := _read_json(state_dir / UP_FILE)):  # written once it is ready
            assert crashed.poll() is None, "the first up exited"
            assert time.monotonic() < deadline, "the first up was not ready in 40 s"
            time.sleep(0.1)
    finally:
        crashed.send_signal(signal.SIGKILL)  # a crash: its children, in their own sessions, live on
        crashed.wait(timeout=10)
    leftovers = _read_json(state_dir / CHILDREN_FILE)
    assert set(leftovers) == {"broker", "metrics", "placement", "admission", "scheduler", "worker-0", "dashboard"}
    cluster = LocalCluster(config(state_dir))
    try:
        assert all(cluster._is_ours(pid) for pid in leftovers.values())  # orphaned, still running
        cluster.start()  # the dead up's lock is gone; what it left running is stopped first
        try:
            for pid in leftovers.values():
                assert not cluster._is_ours(pid), f"pid {pid} of the crashed up still runs"
            cluster.wait_ready()
            assert cluster.endpoint is not None
            assert cluster.endpoint.namespace == up["namespace"]
        finally:
            cluster.stop()
        assert not (state_dir / CHILDREN_FILE).exists()
    finally:
        for pid in leftovers.values():  # whatever a failure above left running
            if cluster._is_ours(pid):
                os.kill(pid, signal.SIGKILL)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}
