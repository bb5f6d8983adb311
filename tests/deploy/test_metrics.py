"""Prometheus scraping in the deploy files (issue 15, item 1; docs/operations.md "Prometheus").

Every Roundhouse service in compose, Kubernetes and systemd sets a metrics port and a bind address,
both real settings of the service it runs (validated by its own settings model), on one port plan;
each binds where its scraper reaches it and no further: compose a fixed address on a network only
Prometheus shares (not the bus, where users' jobs run), pods their own address behind a
NetworkPolicy, systemd loopback. deploy/grafana/prometheus.yml scrapes the compose services by name
at those ports under the job names the dashboard selects; on Kubernetes the container ports named
``metrics``, the headless Service, the ServiceMonitor (an optional component: its CRD is not in the
schemas ``kubernetes-validate`` knows, so it is checked here by structure and kept out of the strict
validation) and the NetworkPolicy agree on names, numbers and labels.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.runtime.config import ConfigError, ServiceConfig, load_config
from tests.deploy.conftest import DEPLOY
from tests.deploy.settings import SERVICE_MODELS, reads_setting
from tests.deploy.test_kubernetes import KUBE, KUBE_VERSION, of_kind, pod_spec, render
from tests.deploy.test_systemd import SYSTEMD, parse_unit

PORTS = {"scheduler": 9461, "admission": 9462, "placement": 9463, "metrics": 9464, "worker": 9465}
"""The port plan of every deploy file (docs/operations.md)."""
CONTROL_PLANE = ("scheduler", "admission", "placement", "metrics")
COMPOSE: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
SCRAPE = yaml.safe_load((DEPLOY / "grafana" / "prometheus.yml").read_text())
CRD_KINDS = {"ServiceMonitor": "monitoring.coreos.com/v1"}
"""Objects of the Prometheus operator's CRDs: no schema for them in kubernetes-validate."""


def real_setting(kind: str, env: dict[str, str]) -> ServiceConfig:
    """``env`` (``ROUNDHOUSE_*`` variables) as ``kind``'s settings model reads it; fails on a variable
    the service does not read or a value it refuses."""
    for variable in env:
        assert reads_setting(kind, variable), f"{kind} reads no {variable}"
    try:
        return load_config(SERVICE_MODELS[kind], environ=env)
    except ConfigError as exc:
        pytest.fail(f"{kind} refuses {env}: {exc}")


def compose_roundhouse() -> dict[str, str]:
    """Compose service -> the Roundhouse kind it runs (the cli container runs none)."""
    return {n: s["command"][1] for n, s in SERVICES.items() if (s.get("command") or [])[:1] == ["service"]}


def scrape_jobs() -> dict[str, set[str]]:
    return {
        job["job_name"]: {t for c in job["static_configs"] for t in c["targets"]} for job in SCRAPE["scrape_configs"]
    }


# --- compose -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(compose_roundhouse()))
def test_every_compose_service_serves_metrics_on_its_port_on_a_network_only_prometheus_shares(name: str) -> None:
    service, kind = SERVICES[name], compose_roundhouse()[name]
    env = {k: v for k, v in service["environment"].items() if k.startswith("ROUNDHOUSE_METRICS_")}
    config = real_setting(kind, env)
    assert config.metrics_port == PORTS[kind]
    host = ipaddress.ip_address(config.metrics_host)  # a literal address: it must be this container's
    networks = service["networks"]
    assert isinstance(networks, dict)
    (scrape,) = [n for n, attached in networks.items() if (attached or {}).get("ipv4_address")]
    assert ipaddress.ip_address(networks[scrape]["ipv4_address"]) == host
    definition = COMPOSE["networks"][scrape]
    assert definition["internal"] is True
    (subnet,) = [ipaddress.ip_network(c["subnet"]) for c in definition["ipam"]["config"]]
    assert host in subnet
    assert host != ipaddress.ip_address("0.0.0.0")
    # Who else is on that network: Prometheus, and only services of the same side (the workers'
    # jobs must not reach the control plane's series).
    on_it = {n for n, s in SERVICES.items() if scrape in (s.get("networks") or [])}
    assert "prometheus" in on_it
    side = {n for n, k in compose_roundhouse().items() if (k == "worker") == (kind == "worker")}
    assert on_it - {"prometheus"} <= side, f"{scrape} also holds {sorted(on_it - side - {'prometheus'})}"
    assert "bus" in networks  # and the bus is not where /metrics listens
    assert scrape != "bus"


def test_the_compose_addresses_are_distinct() -> None:
    addresses = [
        a["ipv4_address"]
        for s in SERVICES.values()
        if isinstance(s.get("networks"), dict)
        for a in s["networks"].values()
        if a and "ipv4_address" in a
    ]
    assert len(addresses) == len(set(addresses)) == len(compose_roundhouse())


def test_prometheus_is_optional_hardened_and_runs_the_shipped_scrape_configuration() -> None:
    prometheus = SERVICES["prometheus"]
    assert prometheus["profiles"] == ["monitoring"]
    assert "ports" not in prometheus
    assert prometheus["read_only"] is True
    assert prometheus["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in prometheus["security_opt"]
    assert not prometheus["user"].startswith("0")
    args = dict(a.split("=", 1) for a in prometheus["command"])
    # Its web port stays on its own loopback: the scrape networks hold the workers, whose jobs must
    # not query it.
    assert args["--web.listen-address"].startswith("127.0.0.1:")
    (config,) = [v for v in prometheus["volumes"] if isinstance(v, str) and v.startswith("./grafana/prometheus.yml:")]
    assert config == f"./grafana/prometheus.yml:{args['--config.file']}:ro"
    assert (DEPLOY / "grafana" / "prometheus.yml").is_file()
    data = [v for v in prometheus["volumes"] if isinstance(v, str) and v.split(":")[1] == args["--storage.tsdb.path"]]
    assert data
    assert data[0].split(":")[0] in COMPOSE["volumes"]
    assert set(prometheus["networks"]) == {
        n for s in compose_roundhouse() for n, a in SERVICES[s]["networks"].items() if a and "ipv4_address" in a
    }


def test_the_scrape_targets_are_the_compose_services_at_their_ports() -> None:
    jobs = scrape_jobs()
    expected: dict[str, set[str]] = {}
    for name, kind in compose_roundhouse().items():
        port = SERVICES[name]["environment"]["ROUNDHOUSE_METRICS_PORT"]
        expected.setdefault(f"roundhouse-{kind}", set()).add(f"{name}:{port}")
    assert jobs == expected
    assert set(expected) == {f"roundhouse-{k}" for k in PORTS}
    # The NATS note stays: its monitoring port speaks JSON, scraped through the exporter.
    text = (DEPLOY / "grafana" / "prometheus.yml").read_text()
    assert "prometheus-nats-exporter" in text
    assert "8222" in text


# --- Kubernetes ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render()


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def workloads(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Roundhouse workload name -> its object (the Deployments and the DaemonSet, not NATS)."""
    return {**of_kind(objects, "Deployment"), **of_kind(objects, "DaemonSet")}


def test_every_roundhouse_container_has_a_metrics_port_that_is_its_setting(objects: list[dict[str, Any]]) -> None:
    found = workloads(objects)
    assert set(found) == set(PORTS)
    for name, workload in found.items():
        (container,) = pod_spec(workload)["containers"]
        kind = container["args"][1]
        assert kind == name
        (port,) = [p for p in container["ports"] if p["name"] == "metrics"]
        assert port["containerPort"] == PORTS[kind]
        assert port.get("protocol", "TCP") == "TCP"
        env = {e["name"]: e for e in container["env"]}
        # The pod's own address: the scraper is another pod, so not loopback; not 0.0.0.0 either.
        assert env["ROUNDHOUSE_METRICS_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        settings = {
            "ROUNDHOUSE_METRICS_PORT": env["ROUNDHOUSE_METRICS_PORT"]["value"],
            "ROUNDHOUSE_METRICS_HOST": "10.1.2.3",  # what status.podIP gives the variable
        }
        config = real_setting(kind, settings)
        assert config.metrics_port == port["containerPort"]


def test_the_headless_service_selects_exactly_the_roundhouse_pods_at_their_metrics_port(
    objects: list[dict[str, Any]],
) -> None:
    service = of_kind(objects, "Service")["roundhouse-metrics"]
    spec = service["spec"]
    assert spec["clusterIP"] == "None"
    (port,) = spec["ports"]
    assert port["name"] == port["targetPort"] == "metrics"
    pods = {
        name: w["spec"]["template"]["metadata"]["labels"]
        for kind in ("Deployment", "DaemonSet", "StatefulSet")
        for name, w in of_kind(objects, kind).items()
    }
    assert {n for n, labels in pods.items() if selects(spec["selector"], labels)} == set(PORTS)


def test_only_prometheus_in_the_monitoring_namespace_may_scrape_and_only_the_metrics_port(
    objects: list[dict[str, Any]],
) -> None:
    policies = of_kind(objects, "NetworkPolicy")
    policy = policies["metrics-from-monitoring"]["spec"]
    assert policy["policyTypes"] == ["Ingress"]
    service = of_kind(objects, "Service")["roundhouse-metrics"]["spec"]
    assert policy["podSelector"] == {"matchLabels": service["selector"]}
    (rule,) = policy["ingress"]
    (peer,) = rule["from"]  # one element: namespace AND pod must both match
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    assert peer["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
    # The named port: on each selected pod exactly its container port named metrics.
    assert rule["ports"] == [{"protocol": "TCP", "port": "metrics"}]
    # No other policy admits anything from outside to the control plane's pods (the workers admit
    # each other for multi-node jobs).
    control = {"admission", "scheduler", "placement", "metrics"}
    for name, other in policies.items():
        if name == "metrics-from-monitoring" or "Ingress" not in other["spec"].get("policyTypes", []):
            continue
        selector = other["spec"]["podSelector"]
        roles = set(selector.get("matchLabels", {}).values())
        for expression in selector.get("matchExpressions", []):
            roles.update(expression["values"])
        assert selector == {} or not roles & control, f"{name} opens ingress to {roles & control}"


def render_with_monitoring(tmp_path: Path) -> list[dict[str, Any]]:
    """The kustomization as docs/deploy.md enables the component: its `components:` uncommented."""
    if shutil.which("kubectl") is None:
        pytest.skip("needs kubectl for kustomize components")
    copy = tmp_path / "kubernetes"
    shutil.copytree(KUBE, copy)
    text = (copy / "kustomization.yaml").read_text()
    text, found = re.subn(r"^# components:\n#   - monitoring$", "components:\n  - monitoring", text, flags=re.MULTILINE)
    assert found == 1, "kustomization.yaml no longer holds the commented `components: [monitoring]`"
    (copy / "kustomization.yaml").write_text(text)
    done = subprocess.run(["kubectl", "kustomize", str(copy)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d is not None]


def test_the_base_holds_no_operator_objects(objects: list[dict[str, Any]]) -> None:
    """Clusters without the Prometheus operator apply the base as it is."""
    assert not [o for o in objects if o["kind"] in CRD_KINDS]


def test_the_monitoring_component_adds_a_service_monitor_matching_the_service(
    objects: list[dict[str, Any]], tmp_path: Path
) -> None:
    enabled = render_with_monitoring(tmp_path)
    added = [o for o in enabled if o not in objects]
    (monitor,) = added
    assert (monitor["kind"], monitor["apiVersion"]) == ("ServiceMonitor", CRD_KINDS["ServiceMonitor"])
    assert monitor["metadata"]["namespace"] == "roundhouse"
    service = of_kind(objects, "Service")["roundhouse-metrics"]
    spec = monitor["spec"]
    assert set(spec) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}
    assert selects(spec["selector"]["matchLabels"], service["metadata"]["labels"])
    (endpoint,) = spec["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["scheme"] == "http"
    # The job label: roundhouse-<role>, the job names of prometheus.yml the dashboard selects.
    (relabel,) = endpoint["relabelings"]
    assert relabel["sourceLabels"] == ["__meta_kubernetes_pod_label_roundhouse_io_role"]
    assert relabel["targetLabel"] == "job"
    roles = {w["spec"]["template"]["metadata"]["labels"]["roundhouse.io/role"] for w in workloads(objects).values()}
    jobs = {relabel["replacement"].replace("$1", role) for role in roles}
    assert jobs == set(scrape_jobs())


@pytest.mark.skipif(importlib.util.find_spec("kubernetes_validate") is None,
                    reason="kubernetes-validate is not installed (pip install kubernetes-validate)")  # fmt: skip
def test_with_the_component_every_built_in_object_still_validates(tmp_path: Path) -> None:
    import kubernetes_validate  # type: ignore[import-untyped]

    failures, skipped = [], []
    for document in render_with_monitoring(tmp_path):
        if document["kind"] in CRD_KINDS:
            skipped.append(document["kind"])  # a CRD: no schema offline (checked by structure above)
            continue
        try:
            kubernetes_validate.validate(document, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{document['kind']}/{document['metadata']['name']}: {exc.message}")
    assert not failures, failures
    assert skipped == ["ServiceMonitor"]


# --- systemd -------------------------------------------------------------------------------------


def unit_environment(*paths: Path) -> dict[str, str]:
    """The ``Environment=`` assignments of a unit and its drop-ins, later files winning."""
    env: dict[str, str] = {}
    for path in paths:
        for line in parse_unit(path).get("Service", {}).get("Environment", []):
            key, _, value = line.partition("=")
            env[key] = value
    return env


@pytest.mark.parametrize("kind", CONTROL_PLANE)
def test_every_systemd_instance_serves_metrics_on_its_port_on_loopback(kind: str) -> None:
    drop_in = SYSTEMD / f"roundhouse@{kind}.service.d" / "metrics.conf"
    assert drop_in.is_file(), f"no drop-in sets roundhouse@{kind}'s metrics port"
    assert set(parse_unit(drop_in)) == {"Service"}
    assert set(parse_unit(drop_in)["Service"]) == {"Environment"}
    env = unit_environment(SYSTEMD / "roundhouse@.service", drop_in)
    metrics = {k: v for k, v in env.items() if k.startswith("ROUNDHOUSE_METRICS_")}
    config = real_setting(kind, metrics)
    assert config.metrics_port == PORTS[kind]
    assert config.metrics_host == "127.0.0.1"


def test_the_worker_unit_serves_metrics_on_its_port_on_loopback() -> None:
    env = unit_environment(SYSTEMD / "roundhouse-worker.service")
    config = real_setting("worker", {k: v for k, v in env.items() if k.startswith("ROUNDHOUSE_METRICS_")})
    assert config.metrics_port == PORTS["worker"]
    assert config.metrics_host == "127.0.0.1"


def test_no_drop_in_names_an_instance_that_does_not_exist() -> None:
    drop_ins = {p.name for p in SYSTEMD.glob("roundhouse@*.service.d")}
    assert drop_ins == {f"roundhouse@{k}.service.d" for k in CONTROL_PLANE}
