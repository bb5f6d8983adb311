"""`roundhouse logs` on a secured `roundhouse up` (issue 14, item 1), with real jobs printing real lines.

The cluster is the whole of ``roundhouse up`` (``tests/local_up.py``): the bundled nats-server with the
generated permissions, every service, one worker agent with one fake GPU, each a child process with its
own credentials. The jobs are ``tests/e2e/jobs/printing_job.py`` under ``roundhouse.train``, real
processes whose stdout and stderr go to the agent's ``rank-<N>.log`` files. Round-robin time-slicing
(``rr``, a 1 s quantum) makes two jobs sharing the GPU preempt and resume each other, so a job has
several runs.

alice ran ``up``; mallory is another user of the cluster (credentials issued like alice's). The CLI
runs where ``up`` ran, as a user does (``./.roundhouse/up.json`` names alice's credentials), or with
``--creds`` as mallory or the operator.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from queue import Empty, Queue
from typing import Protocol, TypeVar

import pytest

from roundhouse.client import Client, Verdict
from roundhouse.endpoint import DEFAULT_STATE_DIR
from roundhouse.local import LocalCluster, LocalClusterConfig
from schemas.job import JobSpec
from schemas.logs import LogData, LogRead, LogsQuery, LogsReply
from schemas.roles import Role
from schemas.subjects import QUERY_LOGS
from services.runtime.auth import AuthDirectory
from services.runtime.bus import ERROR_HEADER
from tests.attacker import Attacker
from tests.cli_helpers import run_cli
from tests.local_up import local_up

pytestmark = pytest.mark.timeout(180)

ALICE, MALLORY = "alice", "mallory"
QUANTUM_S = 1.0
Capture = pytest.CaptureFixture[str]
PRINTING_JOB = Path(__file__).resolve().parent / "jobs" / "printing_job.py"
NODE = "node-0"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    state = tmp_path_factory.mktemp("logs") / DEFAULT_STATE_DIR
    namespace = f"logs{uuid.uuid4().hex[:8]}"
    AuthDirectory(state / "auth").init(namespace=namespace, users=(MALLORY,))
    config = LocalClusterConfig(
        state_dir=state, workers=1, gpus_per_worker=1, scheduler="rr", round_s=QUANTUM_S, user=ALICE,
        namespace=namespace, metrics=False,
        extra_args={"scheduler": ["--policy-options", json.dumps({"quantum_s": QUANTUM_S})],
                    "worker": ["--heartbeat-s", "0.5"]},
    )  # fmt: skip
    with local_up(config) as running:
        yield running


# --- helpers ------------------------------------------------------------------------------------------
class _Connection(Protocol):
    async def close(self) -> None: ...


C = TypeVar("C", bound=_Connection)
T = TypeVar("T")


def connected(
    cluster: LocalCluster, connect: Callable[..., Awaitable[C]], creds: Path | None,
    work: Callable[[C], Awaitable[T]],
) -> T:  # fmt: skip
    """``work`` on a connection to the cluster's broker (``Client.connect``, ``Attacker.connect``) as
    the identity of ``creds``, closed afterwards whatever happened."""

    async def go() -> T:
        assert cluster.endpoint is not None
        connection = await connect(cluster.endpoint.nats, namespace=cluster.endpoint.namespace, creds=creds)
        try:
            return await work(connection)
        finally:
            await connection.close()

    return asyncio.run(go())


def printing(name: str, *, iterations: int, gate: Path | None = None) -> JobSpec:
    command = [sys.executable, str(PRINTING_JOB), "--iterations", str(iterations), "--sleep", "0.05"]
    if gate is not None:
        command += ["--gate", str(gate)]
    return JobSpec(name=name, command=command, gpus=1, grace_period_s=10.0, env={"PYTHONDONTWRITEBYTECODE": "1"})


def submit(cluster: LocalCluster, *specs: JobSpec) -> list[str]:
    async def go(client: Client) -> list[Verdict]:
        return [await client.submit(spec, timeout_s=30) for spec in specs]

    verdicts = connected(cluster, Client.connect, cluster.user_creds, go)
    assert all(v.outcome == "accepted" for v in verdicts), verdicts
    return [v.job_id for v in verdicts]


def ask_logs(cluster: LocalCluster, creds: Path | None, **fields: object) -> LogsReply:
    async def go(client: Client) -> LogsReply:
        query = LogsQuery.model_validate({"requester": client.identity, **fields})
        return await client.bus.request(QUERY_LOGS, query, LogsReply, timeout_s=10)

    return connected(cluster, Client.connect, creds, go)


def wait_status(cluster: LocalCluster, job_id: str, wanted: set[str], timeout_s: float = 90) -> LogsReply:
    deadline = time.monotonic() + timeout_s
    while True:
        reply = ask_logs(cluster, cluster.user_creds, job_id=job_id)
        if reply.status in wanted:
            return reply
        if time.monotonic() > deadline:
            raise AssertionError(f"{job_id} not {wanted} within {timeout_s} s: {reply}")
        cluster.check()
        time.sleep(0.2)


def logs(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str, str]:
    return run_cli(cluster, monkeypatch, capsys, "logs", *args)


@pytest.fixture(scope="module")
def two_runs(cluster: LocalCluster) -> tuple[str, str]:
    """``a`` and ``b`` time-sliced on the one GPU until both finished: ``a`` has several runs."""
    a, b = submit(cluster, printing("a", iterations=60), printing("b", iterations=60))
    for job_id in (a, b):
        wait_status(cluster, job_id, {"completed"})
    return a, b


# --- tests --------------------------------------------------------------------------------------------
def test_the_owner_reads_every_run_in_order(
    cluster: LocalCluster,
    two_runs: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    a, _ = two_runs
    runs = ask_logs(cluster, cluster.user_creds, job_id=a).runs
    assert len(runs) >= 2, f"a was never preempted and resumed: {runs}"
    assert [r.run for r in runs] == list(range(1, len(runs) + 1))
    assert all(r.nodes == [NODE] and r.ranks == [0] for r in runs)
    code, out, err = logs(cluster, monkeypatch, capsys, a)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    tagged = [re.fullmatch(r"\[run (\d+) rank 0\] (.*)", line) for line in lines]
    assert all(tagged), lines  # several runs: every line says which
    shown = [(int(m.group(1)), m.group(2)) for m in tagged if m]
    assert [k for k, _ in shown] == sorted(k for k, _ in shown), "runs out of order"
    assert {k for k, _ in shown} == {r.run for r in runs}
    assert shown[0] == (1, "run from 0")
    assert (1, "héllo wörld ✓") in shown
    assert (1, "a line on stderr") in shown
    steps = [int(text.split()[1]) for _, text in shown if text.startswith("step ")]
    assert steps == sorted(steps), "a resumed run goes on where its checkpoint left off"
    assert steps[-1] == 59
    starts = [(k, int(text.split()[-1])) for k, text in shown if text.startswith("run from ")]
    assert [k for k, _ in starts] == [r.run for r in runs]
    assert all(at > 0 for _, at in starts[1:])
    assert shown[-1] == (len(runs), "finished")


def test_run_and_rank_select_what_is_shown(
    cluster: LocalCluster,
    two_runs: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    a, _ = two_runs
    code, first, _ = logs(cluster, monkeypatch, capsys, a, "--run", "1")
    assert code == 0
    assert first.splitlines()[0] == "run from 0"  # one run and rank: no prefix
    assert first.splitlines()[-1].startswith("stopped at ")
    code, latest, _ = logs(cluster, monkeypatch, capsys, a, "--run", "-1")
    assert code == 0
    assert latest.splitlines()[-1] == "finished"
    assert latest.startswith("run from ")
    code, ranked, _ = logs(cluster, monkeypatch, capsys, a, "--rank", "0")
    code_all, everything, _ = logs(cluster, monkeypatch, capsys, a)
    assert (code, code_all, ranked) == (0, 0, everything)
    code, out, err = logs(cluster, monkeypatch, capsys, a, "--rank", "1")
    assert (code, out) == (1, "")
    assert "no run shown has rank 1" in err
    code, out, err = logs(cluster, monkeypatch, capsys, a, "--run", "99")
    assert (code, out) == (1, "")
    assert "--run 99: the job has" in err
    code, out, err = logs(cluster, monkeypatch, capsys, "no-such-job")
    assert (code, out, err) == (1, "", "roundhouse logs: no such job: no-such-job\n")


def test_follow_prints_a_line_written_later_and_exits_when_the_job_ends(cluster: LocalCluster, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    (c,) = submit(cluster, printing("c", iterations=3, gate=gate))
    env = {k: v for k, v in os.environ.items() if k not in ("ROUNDHOUSE_NATS", "ROUNDHOUSE_CREDS")}
    follower = subprocess.Popen(
        [sys.executable, "-m", "roundhouse", "logs", "-f", c], cwd=cluster.state_dir.parent, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: Queue[str] = Queue()

    def pump() -> None:
        for line in follower.stdout or ():
            lines.put(line.rstrip("\n"))

    reader = threading.Thread(target=pump)
    reader.start()

    def until(wanted: str, timeout_s: float = 60) -> list[str]:
        seen: list[str] = []
        deadline = time.monotonic() + timeout_s
        while wanted not in seen:
            try:
                seen.append(lines.get(timeout=max(0.1, deadline - time.monotonic())))
            except Empty:
                raise AssertionError(f"{wanted!r} not followed within {timeout_s} s: {seen}") from None
        return seen

    try:
        before = until("waiting for the gate")
        assert before[0] == "run from 0"
        assert "step 2" in before
        assert follower.poll() is None  # the job still runs: the follower waits for more
        gate.touch()
        assert until("finished") == ["gate open", "finished"]
        assert follower.wait(timeout=30) == 0  # the job ended: so does the follower
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        reader.join(timeout=10)
    assert follower.stderr is not None
    assert follower.stderr.read() == ""


def test_another_user_is_refused_and_sees_nothing(
    cluster: LocalCluster,
    two_runs: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    a, _ = two_runs
    assert cluster.auth is not None
    mallory = cluster.auth.creds_path(Role.USER, MALLORY)
    code, out, err = logs(cluster, monkeypatch, capsys, a, "--creds", str(mallory))
    assert (code, out) == (1, "")
    assert err == f"roundhouse logs: permission denied: {MALLORY} cannot read {ALICE}'s job\n"
    reply = ask_logs(cluster, mallory, job_id=a, run=1)
    assert (reply.refused, reply.runs, reply.chunk, reply.status) == (
        f"permission denied: {MALLORY} cannot read {ALICE}'s job", [], None, None,
    )  # fmt: skip

    async def bypass(attacker: Attacker) -> None:
        # Asking as alice, or asking the node directly: the broker refuses both.
        as_alice = LogsQuery(requester=ALICE, job_id=a, run=1)
        assert await attacker.request(f"query.logs.{ALICE}", as_alice.model_dump_json().encode()) is None
        await attacker.denied(f"query.logs.{ALICE}")
        direct = LogRead(node_id=NODE, job_id=a, lease_id="any", local_rank=0)
        assert await attacker.request(f"logs.read.{NODE}", direct.model_dump_json().encode()) is None
        await attacker.denied(f"logs.read.{NODE}")

    connected(cluster, Attacker.connect, mallory, bypass)


def test_an_operator_reads_any_users_job(
    cluster: LocalCluster,
    two_runs: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, b = two_runs
    code, out, err = logs(cluster, monkeypatch, capsys, b, "--run", "1", "--creds", str(cluster.operator_creds))
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == "run from 0"


def test_a_forged_read_gets_nothing_outside_the_lease_directory(
    cluster: LocalCluster, two_runs: tuple[str, str], tmp_path: Path
) -> None:
    """Even with the right to publish ``logs.read.<node>`` (only the scheduler and operators have it)."""
    a, b = two_runs
    runs = ask_logs(cluster, cluster.user_creds, job_id=a).runs
    lease_dir = cluster.state_dir / "workers" / NODE / "leases" / runs[0].lease_id
    secret = tmp_path / "secret"
    secret.write_text("not for the bus\n")
    (lease_dir / "rank-7.log").symlink_to(secret)  # what a job could plant in its own lease directory

    def read(**fields: object) -> bytes:
        base = LogRead(node_id=NODE, job_id=a, lease_id=runs[0].lease_id, local_rank=0)
        return json.dumps({**json.loads(base.model_dump_json()), **fields}).encode()

    async def forge(operator: Attacker) -> None:
        async def answer(payload: bytes) -> tuple[LogData | None, str]:
            msg = await operator.request(f"logs.read.{NODE}", payload, timeout_s=5)
            assert msg is not None, "the agent did not answer"
            if msg.headers and ERROR_HEADER in msg.headers:
                return None, msg.headers[ERROR_HEADER]
            return LogData.model_validate_json(msg.data), ""

        honest, _ = await answer(read())
        assert honest is not None
        assert honest.data.startswith("run from 0")
        for path in ("../../../auth", "..", f"{runs[0].lease_id}/../../..", str(secret)):
            data, error = await answer(read(lease_id=path))
            assert data is None, path  # refused as malformed: not an id
            assert "lease_id" in error, path
        linked, _ = await answer(read(local_rank=7))
        assert linked is not None
        assert linked.data == ""
        assert linked.missing is not None
        other_job, _ = await answer(read(job_id=b))
        assert other_job is not None
        assert other_job.data == ""
        assert other_job.missing is not None

    connected(cluster, Attacker.connect, cluster.operator_creds, forge)


def test_a_gone_node_is_reported_and_a_restarted_agent_serves_old_runs(
    cluster: LocalCluster,
    two_runs: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Last in the module: it stops the cluster's only worker and starts another agent on its node."""
    a, _ = two_runs
    _, before, _ = logs(cluster, monkeypatch, capsys, a)
    worker = next(child for child in cluster.children if child.name == "worker-0")
    worker.process.send_signal(signal.SIGTERM)
    worker.process.wait(timeout=60)
    started = time.monotonic()
    code, out, err = logs(cluster, monkeypatch, capsys, a, "--run", "1")
    assert time.monotonic() - started < 15, "a gone node must not hang the command"
    assert (code, out) == (1, "")
    assert f"run 1 rank 0: node {NODE} did not answer" in err
    cluster.children.remove(worker)
    cluster._spawn("worker-0", cluster.worker_args(0))  # a new agent on the same node, same work directory
    deadline = time.monotonic() + 60
    while True:
        code, after, _ = logs(cluster, monkeypatch, capsys, a)
        if code == 0:
            break
        assert time.monotonic() < deadline, "the restarted agent never served the old runs"
        time.sleep(0.2)
    assert after == before
