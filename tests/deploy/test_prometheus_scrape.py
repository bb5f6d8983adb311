"""deploy/grafana/prometheus.yml run by a real Prometheus against live services (issue 15, item 1).

Where a ``prometheus`` binary is installed (Debian's ``prometheus`` package; skipped with the reason
otherwise): ``promtool check config`` accepts the file as shipped; then a secured ``roundhouse up``
(every service and both workers serving ``/metrics`` on loopback) is scraped by Prometheus running
the shipped file with only each job's targets swapped for the URLs ``up`` recorded (the compose names
resolve only on the compose networks). Every target of every job must come up, and the series the
Grafana dashboard selects by job (``roundhouse_scheduler_leader`` in ``roundhouse-scheduler``, the
GPU readings in ``roundhouse-metrics``) must be queryable under those job names. This is what the
unit tests cannot show: Prometheus itself parses the services' exposition and the job layout. And
every expression of the Grafana dashboard (deploy/grafana/roundhouse.json), its variables at their
defaults, is PromQL that Prometheus evaluates.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from roundhouse.local import LocalCluster
from tests.deploy.conftest import DEPLOY
from tests.local_up import METRICS_UP, up_for_module

SCRAPE_FILE = DEPLOY / "grafana" / "prometheus.yml"
READY_S = 60.0

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="needs prometheus and promtool (Debian: apt-get install prometheus)",
)


def test_promtool_accepts_the_shipped_configuration() -> None:
    done = subprocess.run(
        ["promtool", "check", "config", str(SCRAPE_FILE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from up_for_module(tmp_path_factory, **METRICS_UP)


def targets_of(urls: dict[str, str], job: str) -> list[str]:
    """``host:port`` of the parts ``up`` started that ``job`` (roundhouse-<kind>) scrapes: a service by
    its kind, the workers (keyed by node id in ``metrics_urls``) for roundhouse-worker."""
    kind = job.removeprefix("roundhouse-")
    services = {"scheduler", "admission", "placement", "metrics"}
    chosen = [url for name, url in urls.items() if name == kind or (kind == "worker" and name not in services)]
    return sorted(urllib.parse.urlsplit(url).netloc for url in chosen)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def api(base: str, path: str, **params: str) -> Any:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}" if params else f"{base}{path}"
    with urllib.request.urlopen(url, timeout=5) as answer:
        body = json.loads(answer.read())
    assert body["status"] == "success", body
    return body["data"]


@pytest.fixture(scope="module")
def prometheus(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, set[str], Path]]:
    """Prometheus on the shipped file, targets swapped for ``up``'s, once it answers; yields its URL,
    the jobs and its log."""
    tmp_path = tmp_path_factory.mktemp("prometheus")
    config = yaml.safe_load(SCRAPE_FILE.read_text())
    config["global"]["scrape_interval"] = "1s"
    urls = cluster.metrics_urls
    jobs = set()
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": targets_of(urls, job["job_name"])}]
        assert job["static_configs"][0]["targets"], f"up started nothing that {job['job_name']} scrapes"
        jobs.add(job["job_name"])
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        ["prometheus", f"--config.file={path}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(
            "Prometheus to answer",
            lambda: ready(base, process),
            time.monotonic() + READY_S,
            tmp_path / "prometheus.log",
        )
        yield base, jobs, tmp_path / "prometheus.log"
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
        log.close()


def ready(base: str, process: subprocess.Popen[bytes]) -> bool:
    assert process.poll() is None, f"prometheus exited with {process.returncode}"
    with urllib.request.urlopen(f"{base}/-/ready", timeout=5) as answer:
        return bool(answer.status == 200)


def wait_for(fact: str, probe: Any, deadline: float, log: Path) -> Any:
    """``probe()`` until it returns something true; fails naming ``fact`` at the deadline, with the end
    of Prometheus's log."""
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except OSError as exc:  # Prometheus not listening yet
            last = exc
        if last and not isinstance(last, OSError):
            return last
        time.sleep(0.2)
    pytest.fail(f"waited {READY_S:.0f} s for {fact}; last: {last}\n{log.read_text()[-3000:]}")


def test_prometheus_scrapes_every_job_of_the_shipped_file(prometheus: tuple[str, set[str], Path]) -> None:
    base, jobs, log = prometheus
    deadline = time.monotonic() + READY_S

    def all_up() -> list[dict[str, Any]] | None:
        active = api(base, "/api/v1/targets", state="active")["activeTargets"]
        found = {t["labels"]["job"] for t in active}
        return active if found == jobs and all(t["health"] == "up" for t in active) else None

    active = wait_for("every target up", all_up, deadline, log)
    per_job = {job: sum(1 for t in active if t["labels"]["job"] == job) for job in jobs}
    assert per_job["roundhouse-worker"] == 2
    assert all(count >= 1 for count in per_job.values()), per_job

    # What the Grafana dashboard selects by job, under the shipped job names.
    def leader() -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = api(
            base, "/api/v1/query", query='roundhouse_scheduler_leader{job="roundhouse-scheduler"}'
        )["result"]
        return result

    (series,) = wait_for("the scheduler's leader gauge", leader, deadline, log)
    assert series["value"][1] == "1"

    def gpus() -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = api(
            base, "/api/v1/query", query='roundhouse_gpu_utilization_ratio{job="roundhouse-metrics"}'
        )["result"]
        return result

    readings = wait_for("the metrics service's GPU readings", gpus, deadline, log)
    assert {r["metric"]["node"] for r in readings} == {"node-0", "node-1"}
    infos = api(base, "/api/v1/query", query="count by (job) (roundhouse_service_info)")["result"]
    assert {i["metric"]["job"] for i in infos} == jobs


def test_every_dashboard_query_is_promql_prometheus_accepts(prometheus: tuple[str, set[str], Path]) -> None:
    """deploy/grafana/roundhouse.json's expressions, its job variables at their defaults (the shipped
    job names) and Grafana's $__rate_interval at one minute, evaluated by Prometheus."""
    base, _, _ = prometheus
    dashboard = json.loads((DEPLOY / "grafana" / "roundhouse.json").read_text())
    defaults = {v["name"]: v["query"] for v in dashboard["templating"]["list"] if v["type"] == "custom"}
    defaults["__rate_interval"] = "1m"
    expressions = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert expressions
    refused = []
    for expression in expressions:
        query = re.sub(r"\$\{?(\w+)\}?", lambda m: defaults[m.group(1)], expression)
        try:
            api(base, "/api/v1/query", query=query)
        except urllib.error.HTTPError as exc:
            refused.append(f"{expression}: {exc.read().decode()[:300]}")
    assert not refused, refused
