"""The Kubernetes manifests (issue 16, item 3) and every YAML file under deploy/.

The kustomization is rendered with ``kubectl kustomize`` (offline) where kubectl is installed, else
its resource files are read as they are (no generators, no image names); every object is validated
against the Kubernetes OpenAPI schemas offline with ``kubernetes-validate`` where it is installed
(skipped with the reason otherwise). Then what the issue asks of the objects themselves: NATS a
3-server StatefulSet with JetStream R3 and the generated auth and TLS from Secrets, the control-plane
services Deployments with probes and PodDisruptionBudgets, the workers a DaemonSet requesting
``nvidia.com/gpu``, credentials and the PostgreSQL URL from Secrets, a NetworkPolicy per role, and
every setting a pod passes as ``ROUNDHOUSE_*`` one that the service it runs reads. The NATS
configuration the pods run passes ``nats-server -t`` with the Secrets' files laid out as mounted.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.runtime.auth import AuthDirectory
from services.runtime.broker import find_server_binary
from tests.deploy.conftest import DEPLOY
from tests.deploy.settings import SERVICE_MODELS, reads_setting
from tests.tls_certs import make_pki, openssl_binary

KUBE = DEPLOY / "kubernetes"
KUBE_VERSION = "1.32.0"
"""Schemas to validate against: a release every supported cluster accepts these objects at."""
ROLES = ("admission", "scheduler", "placement", "metrics", "worker", "nats")


def yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_file_parses(path: Path) -> None:
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert documents, f"{path} holds no document"
    for document in documents:
        assert isinstance(document, dict)


def render() -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is not None:
        done = subprocess.run(
            [kubectl, "kustomize", str(KUBE)], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        text = done.stdout
    else:
        kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
        text = "\n---\n".join((KUBE / name).read_text() for name in kustomization["resources"])
    return [d for d in yaml.safe_load_all(text) if d is not None]


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render()


def of_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


@pytest.mark.skipif(importlib.util.find_spec("kubernetes_validate") is None,
                    reason="kubernetes-validate is not installed (pip install kubernetes-validate)")  # fmt: skip
def test_every_object_validates_against_the_kubernetes_schemas(objects: list[dict[str, Any]]) -> None:
    import kubernetes_validate  # type: ignore[import-untyped]

    failures = []
    for document in objects:
        try:
            kubernetes_validate.validate(document, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{document['kind']}/{document['metadata']['name']}: {exc.message} at {list(exc.path)}")
    assert not failures, failures


def test_nats_is_a_three_server_statefulset_with_its_config_auth_and_tls(objects: list[dict[str, Any]]) -> None:
    nats = of_kind(objects, "StatefulSet")["nats"]
    assert nats["spec"]["replicas"] == 3
    spec = pod_spec(nats)
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["auth"]["secret"]["secretName"] == "nats-auth"
    assert volumes["tls"]["secret"]["secretName"] == "nats-tls"
    assert volumes["config"]["configMap"]["name"].startswith("nats-config")
    (container,) = spec["containers"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["path"].startswith("/healthz")
    config = of_kind(objects, "ConfigMap")
    assert of_kind(objects, "ConfigMap")["roundhouse-config"]["data"]["ROUNDHOUSE_STREAM_REPLICAS"] == "3"
    if shutil.which("kubectl"):  # the generator's hashed name
        (nats_config,) = [c for name, c in config.items() if name.startswith("nats-config")]
        assert "nats-route://nats-2.nats:6222" in nats_config["data"]["nats-server.conf"]


def test_control_plane_deployments_have_probes_budgets_and_secrets(objects: list[dict[str, Any]]) -> None:
    deployments = of_kind(objects, "Deployment")
    assert set(deployments) == {"admission", "scheduler", "placement", "metrics"}
    budgets = {
        b["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"]
        for b in of_kind(objects, "PodDisruptionBudget").values()
    }
    assert budgets == {"admission", "scheduler", "placement", "metrics", "nats"}
    assert deployments["admission"]["spec"]["replicas"] == 1  # two would split its durable's arrivals
    assert deployments["admission"]["spec"]["strategy"]["type"] == "Recreate"
    assert deployments["scheduler"]["spec"]["replicas"] >= 2
    for kind, deployment in deployments.items():
        spec = pod_spec(deployment)
        (container,) = spec["containers"]
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert container[probe]["exec"]["command"][0] == "roundhouse-healthcheck", (kind, probe)
        assert container["args"][:2] == ["service", kind]
        creds = container["args"][container["args"].index("--creds") + 1]
        assert creds == f"/etc/roundhouse/auth/{kind}/{kind}.creds"
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["creds-secret"]["secret"]["secretName"] == f"roundhouse-creds-{kind}"
        assert volumes["creds"]["emptyDir"]["medium"] == "Memory"
    (db,) = [e for e in pod_spec(deployments["scheduler"])["containers"][0]["env"] if e["name"] == "ROUNDHOUSE_DB"]
    assert db["valueFrom"]["secretKeyRef"] == {"name": "roundhouse-db", "key": "url"}


def test_workers_are_a_daemonset_requesting_gpus_with_a_shared_checkpoint_volume(objects: list[dict[str, Any]]) -> None:
    worker = of_kind(objects, "DaemonSet")["worker"]
    spec = pod_spec(worker)
    (container,) = spec["containers"]
    assert int(container["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    env = {e["name"]: e for e in container["env"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts[env["ROUNDHOUSE_CHECKPOINT_ROOT"]["value"]] == "checkpoints"
    claim = of_kind(objects, "PersistentVolumeClaim")["roundhouse-checkpoints"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


def test_every_pod_runs_as_the_images_non_root_user_read_only(objects: list[dict[str, Any]]) -> None:
    for kind in ("Deployment", "StatefulSet", "DaemonSet"):
        for name, workload in of_kind(objects, kind).items():
            spec = pod_spec(workload)
            assert spec["securityContext"]["runAsNonRoot"] is True, name
            assert spec["securityContext"]["runAsUser"] == 10001, name
            assert spec["automountServiceAccountToken"] is False, name
            for container in spec.get("initContainers", []) + spec["containers"]:
                context = container["securityContext"]
                assert context["readOnlyRootFilesystem"] is True, (name, container["name"])
                assert context["allowPrivilegeEscalation"] is False, (name, container["name"])
                assert context["capabilities"]["drop"] == ["ALL"], (name, container["name"])


def test_network_policies_deny_by_default_and_cover_every_role(objects: list[dict[str, Any]]) -> None:
    policies = of_kind(objects, "NetworkPolicy")
    deny = policies["default-deny"]["spec"]
    assert deny["podSelector"] == {}
    assert sorted(deny["policyTypes"]) == ["Egress", "Ingress"]
    assert "ingress" not in deny
    assert "egress" not in deny
    covered: set[str] = set()
    for policy in policies.values():
        selector = policy["spec"]["podSelector"]
        covered.update(selector.get("matchLabels", {}).values())
        for expression in selector.get("matchExpressions", []):
            covered.update(expression["values"])
    assert covered >= set(ROLES)
    pod_roles = set()
    for kind in ("Deployment", "StatefulSet", "DaemonSet"):
        for workload in of_kind(objects, kind).values():
            pod_roles.add(workload["spec"]["template"]["metadata"]["labels"]["roundhouse.io/role"])
    assert pod_roles == set(ROLES)
    # The bus is reachable on its client port only: monitoring is open to no pod.
    ports = {port["port"] for rule in policies["nats"]["spec"]["ingress"] for port in rule["ports"]}
    assert ports == {4222, 6222}


def test_every_roundhouse_setting_a_pod_passes_is_one_its_service_reads(objects: list[dict[str, Any]]) -> None:
    shared = of_kind(objects, "ConfigMap")["roundhouse-config"]["data"]
    for kind in ("Deployment", "DaemonSet"):
        for name, workload in of_kind(objects, kind).items():
            (container,) = pod_spec(workload)["containers"]
            service = container["args"][1]
            assert service in SERVICE_MODELS
            names = list(shared) + [e["name"] for e in container.get("env", [])]
            for variable in names:
                if variable.startswith("ROUNDHOUSE_"):
                    assert reads_setting(service, variable), f"{name}: {service} reads no {variable}"


@pytest.mark.skipif(openssl_binary() is None, reason="needs openssl for the test certificates")
def test_the_pods_nats_configuration_is_accepted_by_nats_server(tmp_path: Path) -> None:
    """The file as mounted: /etc/roundhouse/{nats-server.conf,auth/auth.conf,tls/tls.*} rewritten into a
    scratch folder (only paths), POD_NAME set as the StatefulSet sets it."""
    etc = tmp_path / "etc"
    AuthDirectory(etc / "auth").init(namespace="prod", users=("alice",), nodes=("gpu-01",))
    pki = make_pki(tmp_path / "pki", dns_names=("nats-0.nats", "nats-1.nats", "nats-2.nats", "nats"))
    tls = etc / "tls"
    tls.mkdir()
    shutil.copy(pki.server_cert, tls / "tls.crt")
    shutil.copy(pki.server_key, tls / "tls.key")
    shutil.copy(pki.ca_cert, tls / "ca.crt")
    text = (KUBE / "nats-server.conf").read_text()
    text, found = re.subn(r'"/etc/roundhouse/tls/', f'"{tls}/', text)
    assert found == 6
    text, found = re.subn(r"store_dir: /var/lib/roundhouse/nats", f'store_dir: "{tmp_path / "js"}"', text)
    assert found == 1
    (etc / "nats-server.conf").write_text(text)
    done = subprocess.run(
        [str(find_server_binary()), "-t", "-c", str(etc / "nats-server.conf")],
        capture_output=True, text=True, timeout=30, check=False, env={**os.environ, "POD_NAME": "nats-1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
