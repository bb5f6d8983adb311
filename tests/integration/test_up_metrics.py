"""`roundhouse up`'s ``/metrics`` (issue 15, item 1): every service and worker serves Prometheus on
loopback, ``up.json`` records the URLs (``metrics_urls``), and a job submitted with the CLI shows up
in the scheduler's series while the workers' and the metrics service's GPU readings follow it."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from roundhouse.cli import main
from roundhouse.endpoint import UP_FILE
from roundhouse.local import SERVICE_ORDER, LocalCluster
from tests.local_up import METRICS_UP, up_for_module

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from up_for_module(tmp_path_factory, **METRICS_UP)


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def test_up_records_a_loopback_metrics_url_for_every_part(cluster: LocalCluster) -> None:
    up = json.loads((cluster.state_dir / UP_FILE).read_text())
    assert up["metrics_urls"] == cluster.metrics_urls
    assert set(up["metrics_urls"]) == {*SERVICE_ORDER, "node-0", "node-1"}
    for name, url in up["metrics_urls"].items():
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", url), url
        samples = scrape(url)
        kind = "worker" if name.startswith("node-") else name
        assert any(n == "roundhouse_service_info" and ("kind", kind) in labels for n, labels in samples), name
    scheduler = scrape(up["metrics_urls"]["scheduler"])
    assert value(scheduler, "roundhouse_policy_info", kind="scheduler", policy="las", options="{}") == 1.0
    assert value(scheduler, "roundhouse_scheduler_leader") == 1.0


def test_a_submitted_job_moves_the_scheduler_and_gpu_series(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(cluster.state_dir.parent)
    monkeypatch.delenv("ROUNDHOUSE_NATS", raising=False)
    monkeypatch.delenv("ROUNDHOUSE_CREDS", raising=False)
    urls = cluster.metrics_urls
    before = value(scrape(urls["scheduler"]), "roundhouse_grants_total") or 0.0
    code = main(["submit", "--gpus", "2", "--expected-duration", "30", "--id", "metrics-up-1", "--", "python", "t.py"])
    assert code == 0, capsys.readouterr().err
    deadline = time.monotonic() + 30
    while True:
        scheduler = scrape(urls["scheduler"])
        gpus = scrape(urls["metrics"])
        busy = [v for (n, _), v in gpus.items() if n == "roundhouse_gpu_utilization_ratio" and v > 0]
        if value(scheduler, "roundhouse_grants_total") == before + 1 and busy:
            break
        assert time.monotonic() < deadline, (scheduler, gpus)
        cluster.check()
        time.sleep(0.2)
    allocated = sum(v for (n, _), v in scheduler.items() if n == "roundhouse_node_gpus_allocated")
    assert allocated == 2.0
    assert value(scheduler, "roundhouse_running_jobs", job_class="BE", user="alice") == 1.0
    node = next(dict(labels)["node"] for (n, labels), v in gpus.items()
                if n == "roundhouse_gpu_utilization_ratio" and v > 0)  # fmt: skip
    worker = scrape(urls[node])
    assert any(n == "roundhouse_gpu_utilization_ratio" and v > 0 for (n, _), v in worker.items())
    assert value(worker, "roundhouse_worker_leases") == 1.0


def test_log_lines_are_iso_stamped_and_name_the_job_lease_and_node(cluster: LocalCluster) -> None:
    """Issue 15, item 6: after the job above ran, the worker that ran it logged lines about it that
    a shipper can select by ``job_id`` (and its lease and node), stamped in ISO 8601."""
    deadline = time.monotonic() + 10
    while True:
        about: list[dict[str, object]] = []
        for path in sorted((cluster.state_dir / "logs").glob("*.log")):
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("{"):
                    record = json.loads(line)
                    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", str(record["ts"])), record
                    if record.get("job_id") == "metrics-up-1":
                        about.append(record)
        if any(r.get("service") == "worker" and r.get("lease_id") and r.get("node_id") for r in about):
            break
        assert time.monotonic() < deadline, about
        time.sleep(0.2)
