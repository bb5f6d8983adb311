"""The dashboard's page and sign-in, without a server (issue 15, item 2): HTTP Basic read as a bus
identity, every user-given text escaped, the charts and the nodes panel built from a snapshot."""

from __future__ import annotations

import base64
import re

import pytest

from roundhouse.dashboard.history import History
from roundhouse.dashboard.render import render_page
from roundhouse.dashboard.snapshot import NodeView, PolicyView, Snapshot, nodes_from_placements
from roundhouse.dashboard.visitors import BadCredentials, parse_basic
from schemas.control import JobView
from schemas.job import JobClass
from schemas.roles import Role
from services.runtime.auth.creds import new_credentials

SEED = new_credentials(Role.USER, "alice").seed
HOSTILE = '<script>alert("x")</script>'


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def job(job_id: str, status: str = "queued", *, user: str = "alice", name: str = "train", **fields: object) -> JobView:
    return JobView(job_id=job_id, name=name, user=user, job_class=JobClass.BE, status=status, gpus=1,
                   submit_time=fields.pop("submit_time", 1000.0), **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("header", "role", "identity"),
    [
        pytest.param(basic("alice", SEED), Role.USER, "alice", id="bare-name-is-a-user"),
        pytest.param(basic("user/alice", SEED), Role.USER, "alice", id="role-slash-name"),
        pytest.param(basic("operator", SEED), Role.OPERATOR, "operator", id="a-role-name-is-that-role"),
        pytest.param(basic("operator/ops-1", f" {SEED}\n"), Role.OPERATOR, "ops-1", id="seed-trimmed"),
    ],
)
def test_basic_credentials_name_a_bus_identity(header: str, role: Role, identity: str) -> None:
    visitor = parse_basic(header)
    assert visitor is not None
    assert (visitor.credentials.role, visitor.credentials.identity, visitor.credentials.seed) == (role, identity, SEED)
    assert SEED not in repr(visitor)


@pytest.mark.parametrize(
    ("header", "says"),
    [
        pytest.param("Bearer abc", "only HTTP Basic", id="another-scheme"),
        pytest.param("Basic !!!", "not base64", id="bad-base64"),
        pytest.param(basic("alice", ""), "no password", id="no-seed"),
        pytest.param(basic("alice", "hunter2"), "not a credentials file's seed", id="not-a-seed"),
        pytest.param(basic("scheduler/scheduler", SEED), "cannot sign in", id="a-service-role"),
        pytest.param(basic("king/alice", SEED), "unknown role", id="unknown-role"),
        pytest.param(basic("al ice", SEED), "must be", id="bad-identity"),
    ],
)
def test_unusable_basic_credentials_say_why(header: str, says: str) -> None:
    with pytest.raises(BadCredentials, match=says):
        parse_basic(header)


def test_no_header_is_no_visitor() -> None:
    assert parse_basic(None) is None
    assert parse_basic("") is None


def test_the_same_identity_with_another_seed_is_another_session() -> None:
    other = new_credentials(Role.USER, "alice").seed
    first, second = parse_basic(basic("alice", SEED)), parse_basic(basic("alice", other))
    assert first is not None
    assert second is not None
    assert first.key != second.key
    assert first.key == parse_basic(basic("user/alice", SEED)).key  # type: ignore[union-attr]


def test_every_user_given_text_is_escaped() -> None:
    # The schemas refuse such names today; the page must not depend on it (a scheduler could relay anything).
    hostile = JobView.model_construct(
        job_id="j-1", name=HOSTILE, user='"><img src=x onerror=alert(1)>', job_class=JobClass.BE, status="queued",
        gpus=1, placement={}, submit_time=1000.0, first_start_time=None, finish_time=None, attained_service_s=0.0,
        runtime_s=0.0, queue_position=1, iterations_done=0, preemptions=0, reason="<b>needs</b> 4 GPUs",
        exit_code=None, signal=None,
    )  # fmt: skip
    policies = [PolicyView("scheduler", "las", '{"k": "</code><script>"}')]
    snapshot = Snapshot(1010.0, "<i>alice</i>", [hostile], nodes=[NodeView("<node>", 4, 0)], policies=policies,
                        errors=["<err>"])  # fmt: skip
    page = render_page(snapshot, [], refresh_s=5)
    for raw in ("<script>", "<img", "<b>needs", "<i>alice", "<node>", "<err>"):
        assert raw not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in page
    assert "&lt;b&gt;needs&lt;/b&gt; 4 GPUs" in page
    for escaped in ("&lt;i&gt;alice&lt;/i&gt;", "&lt;node&gt;", "&lt;err&gt;", "&lt;/code&gt;&lt;script&gt;"):
        assert escaped in page


def test_the_page_shows_queue_reasons_etas_running_nodes_and_policies() -> None:
    waiting = job("wait-1", queue_position=1, reason="needs 4 GPUs, 2 of 4 free", eta_s=90.0, eta_quality="guessed")
    running = job("run-1", "running", placement={"node-0": [0, 1]}, runtime_s=30.0)
    snapshot = Snapshot(1100.0, "alice", [waiting, running], nodes=nodes_from_placements([running]),
                        policies=[PolicyView("scheduler", "las", "{}", "scheduler-a", leader=True),
                                  PolicyView("scheduler", "srtf", "{}", "scheduler-b")])  # fmt: skip
    page = render_page(snapshot, [], refresh_s=5, cluster="prod")
    queue = re.search(r'<table id="queue">.*?</table>', page, re.S)
    assert queue is not None
    assert "wait-1" in queue[0]
    assert "needs 4 GPUs, 2 of 4 free" in queue[0]
    assert "in ~1.5m" in queue[0]  # the scheduler's ETA, on guessed durations
    running_table = re.search(r'<table id="running">.*?</table>', page, re.S)
    assert running_table is not None
    assert "run-1" in running_table[0]
    assert "node-0:0+1" in running_table[0]
    assert re.search(r'<table id="nodes">.*node-0.*run-1', page, re.S)
    assert re.search(r'<table id="policies">.*scheduler-a \(leader\).*las.*scheduler-b.*srtf', page, re.S)
    assert '<meta http-equiv="refresh" content="5">' in page
    for external in ("<script", "http://", "https://"):  # no script, nothing fetched from elsewhere
        assert external not in page


def test_nodes_come_from_what_is_known_and_placements() -> None:
    known = [NodeView("node-0", 4, 2, up=True), NodeView("node-1", 4, 0, up=False),
             NodeView("node-2", 2, 2, up=True, other_jobs=1, state="allocated")]
    jobs = [job("a", "running", placement={"node-0": [0, 1]}), job("b", "running", placement={"node-9": [3]}),
            job("c", "completed", placement={"node-1": [0]})]  # fmt: skip
    nodes = {node.node_id: node for node in nodes_from_placements(jobs, known)}
    assert nodes["node-0"] == NodeView("node-0", 4, 2, up=True, jobs=("a",))
    assert nodes["node-1"].jobs == ()  # a finished job holds nothing
    assert nodes["node-9"] == NodeView("node-9", None, 1, jobs=("b",))
    page = render_page(Snapshot(1.0, "alice", nodes=list(nodes.values())), [], refresh_s=5)
    assert re.search(r"node-2.*allocated.*1 of other users", page, re.S)


def test_history_charts_queue_length_and_utilization_over_time() -> None:
    history = History(size=3)
    for at, waiting in ((1.0, 0), (2.0, 3), (3.0, 1), (4.0, 2)):
        jobs = [job(f"w{i}") for i in range(waiting)]
        history.add(Snapshot(at, "alice", jobs, nodes=[NodeView("node-0", 4, waiting)]))
    samples = history.samples()
    assert [s.waiting for s in samples] == [3, 1, 2]  # a ring: the oldest sample went
    assert samples[-1].utilization == 0.5
    page = render_page(Snapshot(4.0, "alice"), samples, refresh_s=5)
    assert re.search(r'id="queue-chart".*<polyline[^>]+points="[\d., ]+"', page, re.S)
    assert "GPUs allocated: now 50%" in page


def test_the_jct_histogram_counts_finished_jobs() -> None:
    done = [job(f"d{i}", "completed", submit_time=0.0, finish_time=float(t)) for i, t in enumerate((10, 20, 20, 100))]
    page = render_page(Snapshot(200.0, "alice", done), [], refresh_s=5)
    assert "4 finished, median 20s, 10s-1.7m" in page
    bars = re.findall(r"<title>([^<]+): (\d+)</title>", page)
    assert sum(int(count) for _, count in bars) == 4
    assert re.search(r'<table id="finished">.*d3', page, re.S)
