"""`roundhouse submit/jobs/cancel` and the client SDK against a real broker.

Admission and the scheduler are stood in for by small responders on the real bus here; the
end-to-end tests run the real services.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import pytest

from roundhouse.cli import main
from roundhouse.client import default_identity
from schemas.control import JobsQuery, JobsReply, JobView
from schemas.job import JobClass
from schemas.jobs import JobAccepted, JobArrived, JobCancel, JobRejected
from services.runtime.broker import Broker
from services.runtime.bus import Bus


async def fake_admission(bus: Bus, arrived: list[JobArrived]) -> None:
    async def on_arrived(event: JobArrived) -> None:
        arrived.append(event)
        if event.spec.gpus > 8:
            await bus.publish("job.rejected", JobRejected(job_id=event.job_id, reason="needs more than 8 GPUs"))
        else:
            await bus.publish("job.accepted", JobAccepted(job_id=event.job_id, policy="accept-all"))

    await bus.subscribe("job.arrived.*", JobArrived, on_arrived)


def cli(*args: str) -> int:
    return main(list(args))


async def test_submit_prints_admissions_verdict(
    broker: Broker, bus: Bus, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    arrived: list[JobArrived] = []
    await fake_admission(bus, arrived)
    endpoint = ("--nats", broker.url, "--namespace", namespace)
    code = await asyncio.to_thread(cli, "submit", *endpoint, "--gpus", "2", "--kind", "te", "--json",
                                   "--", "python", "train.py", "--lr", "0.1")
    assert code == 0
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["outcome"] == "accepted"
    assert arrived[0].job_id == verdict["job_id"]
    assert arrived[0].spec.command == ["python", "train.py", "--lr", "0.1"]
    assert arrived[0].spec.job_class is JobClass.TE
    assert arrived[0].spec.name == "python"

    code = await asyncio.to_thread(cli, "submit", *endpoint, "--gpus", "16", "--", "python", "big.py")
    assert code == 3  # rejected
    assert "rejected (needs more than 8 GPUs)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("spec", "flags", "message"),
    [
        pytest.param("name: x\ncommand: []\n", [], "command: List should have at least 1 item", id="empty-argv"),
        pytest.param("name: x\ncommand: [python]\ngpus: 0\n", [], "gpus: Input should be greater than or equal to 1",
                     id="zero-gpus"),
        pytest.param("name: x\ncommand: [python]\ngpu: 2\n", [], "gpu: Extra inputs are not permitted", id="typo"),
        pytest.param("- python\n", [], "must hold a mapping", id="not-a-mapping"),
        pytest.param("name: x\n", [], "no command", id="no-command"),
        pytest.param("name: x\ncommand: [python]\n", ["--env", "NOEQUALS"], "must be KEY=VALUE", id="bad-env"),
    ],
)
def test_malformed_specs_are_refused_before_sending(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: str, flags: list[str], message: str
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(spec)
    # An unroutable NATS URL: a malformed spec must be refused before any connection is tried.
    code = cli("submit", str(path), *flags, "--nats", "nats://127.0.0.1:1")
    assert code == 2
    assert message in capsys.readouterr().err


async def test_jobs_and_cancel_talk_to_the_scheduler(
    broker: Broker, bus: Bus, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cancelled: list[JobCancel] = []
    view = JobView(job_id="job-1", name="trial", user="alice", job_class=JobClass.TE, status="running", gpus=2,
                   placement={"node-0": [0, 1]}, submit_time=1.0, iterations_done=40)

    async def on_query(query: JobsQuery) -> JobsReply:
        return JobsReply(jobs=[view], epoch=3)

    async def on_cancel(event: JobCancel) -> None:
        cancelled.append(event)

    await bus.serve("query.jobs.*", JobsQuery, on_query)
    await bus.subscribe("job.cancel.*", JobCancel, on_cancel)
    endpoint = ("--nats", broker.url, "--namespace", namespace)

    assert await asyncio.to_thread(cli, "jobs", *endpoint, "--json") == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["jobs"][0]["job_id"] == "job-1"
    assert listed["jobs"][0]["placement"] == {"node-0": [0, 1]}

    assert await asyncio.to_thread(cli, "jobs", *endpoint) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:5] == ["ID", "NAME", "USER", "CLASS", "STATUS"]
    assert table[1].split()[:7] == ["job-1", "trial", "alice", "TE", "running", "2", "node-0:0+1"]

    assert await asyncio.to_thread(cli, "cancel", *endpoint, "job-1", "--reason", "wrong lr") == 0
    await asyncio.sleep(0.1)
    assert [(c.job_id, c.reason) for c in cancelled] == [("job-1", "wrong lr")]


async def test_jobs_waits_for_a_leader_then_says_none_leads(
    broker: Broker, bus: Bus, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint = ("--nats", broker.url, "--namespace", namespace)
    # Nothing serves query.jobs (no scheduler, or one still electing itself): after the client's
    # 5 s of asking again, a clear message and exit 1, not nats-py's NoRespondersError traceback.
    began = time.monotonic()
    assert await asyncio.to_thread(cli, "jobs", *endpoint) == 1
    waited = time.monotonic() - began
    err = capsys.readouterr().err
    assert "roundhouse jobs: no scheduler is leading (nothing answers query.jobs)" in err
    assert "Traceback" not in err
    assert 4.0 <= waited < 15.0

    # A leader that starts serving while the command asks (as just after `roundhouse up`) answers it.
    async def on_query(query: JobsQuery) -> JobsReply:
        return JobsReply(jobs=[], epoch=1)

    async def lead_later() -> None:
        await asyncio.sleep(1.0)
        await bus.serve("query.jobs.*", JobsQuery, on_query)

    serving = asyncio.create_task(lead_later())
    assert await asyncio.to_thread(cli, "jobs", *endpoint, "--json") == 0
    await serving
    assert json.loads(capsys.readouterr().out) == {"jobs": [], "truncated": False}


async def test_jobs_reports_a_failed_answer_without_a_traceback(
    broker: Broker, bus: Bus, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def on_query(query: JobsQuery) -> JobsReply:
        raise RuntimeError("not the leader; ask again")

    await bus.serve("query.jobs.*", JobsQuery, on_query)
    assert await asyncio.to_thread(cli, "jobs", "--nats", broker.url, "--namespace", namespace) == 1
    err = capsys.readouterr().err
    subject = f"query.jobs.{default_identity()}"  # the requester's identity is the subject's last token
    assert f"roundhouse jobs: the scheduler failed to answer: {subject}: RuntimeError: not the leader" in err
    assert "Traceback" not in err


def test_unknown_service_lists_the_valid_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("service", "schedular") == 2
    assert "valid: admission, metrics, placement, scheduler, worker" in capsys.readouterr().err


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.mark.parametrize(
    "command",
    [("jobs",), ("submit", "--gpus", "1", "--", "python", "train.py"), ("cancel", "some-job")],
    ids=["jobs", "submit", "cancel"],
)
def test_a_command_against_a_stopped_cluster_fails_fast_and_says_so(
    command: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    # Nothing listens on the port (a stale up.json, a stopped `roundhouse up`): the command must not
    # retry forever as a service would, but fail within seconds with the address in its message.
    url = f"nats://127.0.0.1:{_unused_port()}"
    began = time.monotonic()
    code = cli(command[0], "--nats", url, *command[1:])
    elapsed = time.monotonic() - began
    assert code == 1
    assert elapsed < 15.0
    err = capsys.readouterr().err
    assert f"roundhouse {command[0]}: cannot reach NATS: nothing answers at {url}" in err
    assert "Traceback" not in err
