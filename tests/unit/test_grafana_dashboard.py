"""deploy/grafana: the dashboard is valid JSON whose every query names series the services export,
and the example scrape configuration names the jobs the dashboard selects (issue 15)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from schemas.metrics import GpuSample, NodeMetrics
from services.runtime.clock import SYSTEM_CLOCK
from services.runtime.prometheus import GpuCollector, ServiceCollector
from services.scheduler.config import SchedulerConfig
from services.scheduler.monitoring import SchedulerMonitor
from services.scheduler.replica import Replica

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
SUFFIXES = {"histogram": ("_bucket", "_count", "_sum"), "counter": ("_total",), "info": ("_info",)}


def exported() -> set[str]:
    """Every family and sample name the scheduler, GPU and per-service collectors produce."""
    registry = CollectorRegistry(auto_describe=False)
    replica = Replica(SchedulerConfig(), SYSTEM_CLOCK)
    replica.refusals.counts["job.completed:other_node"] = 1
    SchedulerMonitor(replica, registry)
    reading = NodeMetrics(node_id="n0", gpus=[GpuSample(index=0, utilization_pct=50, memory_used_mib=1,
                                                        memory_total_mib=2, temperature_c=40, power_w=100)])
    registry.register(GpuCollector(lambda: [reading]))
    registry.register(ServiceCollector(
        kind="scheduler", instance="s", namespace="", version="0", started_at=0.0, stats=dict,
        bus_stats=lambda: {"received": 1, "published": 1}, policy=lambda: ("las", {}),
    ))  # fmt: skip
    names: set[str] = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ()))
    return names


def test_every_query_of_the_dashboard_names_exported_series() -> None:
    dashboard = json.loads((GRAFANA / "roundhouse.json").read_text())
    names = exported()
    # Series only a live leader reports: declared by the monitor, checked here by their families.
    names |= {"roundhouse_queue_depth", "roundhouse_queue_gpus", "roundhouse_running_jobs", "roundhouse_node_gpus",
              "roundhouse_node_gpus_allocated", "roundhouse_node_up", "roundhouse_node_draining"}  # fmt: skip
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 20
    used = {m for e in exprs for m in re.findall(r"\broundhouse_[a-z_]+", e)}
    assert used <= names, sorted(used - names)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24, panel["title"]


def test_the_scrape_configuration_names_the_dashboards_jobs() -> None:
    dashboard = json.loads((GRAFANA / "roundhouse.json").read_text())
    defaults = {v["name"]: v["query"] for v in dashboard["templating"]["list"] if v["type"] == "custom"}
    jobs = {job["job_name"] for job in yaml.safe_load((GRAFANA / "prometheus.yml").read_text())["scrape_configs"]}
    assert {defaults["scheduler_job"], defaults["metrics_job"]} <= jobs
