"""Which ``ROUNDHOUSE_*`` variables each service reads: its settings model's fields
(services/runtime/config.py: ``ROUNDHOUSE_<FIELD>``), so a deploy file cannot pass a misspelt or
retired setting that the service would silently ignore."""

from __future__ import annotations

from services.admission.service import AdmissionConfig
from services.metrics.service import MetricsConfig
from services.placement.service import PlacementConfig
from services.runtime.config import ENV_PREFIX, ServiceConfig
from services.scheduler.config import SchedulerConfig
from services.worker.config import WorkerConfig

SERVICE_MODELS: dict[str, type[ServiceConfig]] = {
    "admission": AdmissionConfig,
    "scheduler": SchedulerConfig,
    "placement": PlacementConfig,
    "metrics": MetricsConfig,
    "worker": WorkerConfig,
}


def reads_setting(service: str, variable: str) -> bool:
    """Whether ``service`` reads the environment variable ``variable`` (``ROUNDHOUSE_<FIELD>``)."""
    if not variable.startswith(ENV_PREFIX):
        return False
    return variable[len(ENV_PREFIX) :].lower() in SERVICE_MODELS[service].model_fields


def flag_setting(service: str, flag: str) -> bool:
    """Whether ``--flag-name`` is one of ``service``'s settings (``roundhouse service KIND`` derives its
    flags from the model's fields) or ``--config``."""
    name = flag.removeprefix("--").replace("-", "_")
    return name == "config" or name in SERVICE_MODELS[service].model_fields
