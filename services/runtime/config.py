"""Service configuration: defaults < config file < environment < command-line flags.

Each service has one frozen pydantic settings model (a subclass of :class:`ServiceConfig`). Values
come from, in increasing precedence: the model's defaults, a YAML/JSON file (``--config``), the
environment (``ROUNDHOUSE_<FIELD>``, e.g. ``ROUNDHOUSE_NATS=nats://host:4222``) and flags. Unknown keys
in a file are an error that names the key, because a misspelt setting silently ignored is worse.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

ENV_PREFIX = "ROUNDHOUSE_"
# A host name as RFC 1123 spells one (dot-separated labels of letters, digits and inner hyphens).
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)


class ConfigError(ValueError):
    """Configuration that cannot be used; the message says which source and which key."""


class ServiceConfig(BaseModel):
    """Settings every service shares."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nats: str = Field(default="nats://127.0.0.1:4222", description="NATS server URL(s), comma-separated.")
    namespace: str = Field(default="", max_length=32, description="Prefix for subjects, streams, buckets.")
    db: str = Field(default=".roundhouse", description="Data directory (SQLite) or a database URL.")
    policy: str | None = Field(default=None, description="Policy name for services that run one.")
    policy_options: dict[str, Any] = Field(default_factory=dict)
    instance: str | None = Field(default=None, description="Instance name; default: host and pid.")
    log_level: str = Field(default="INFO", pattern=r"^(DEBUG|INFO|WARNING|ERROR)$")
    log_format: str = Field(default="json", pattern=r"^(json|text)$")
    drain_timeout_s: float = Field(default=10.0, gt=0, le=600)
    creds: str | None = Field(
        default=None,
        description="Credentials file of this service's identity (`roundhouse auth`); required by a secured "
        "NATS (ROUNDHOUSE_CREDS).",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Serve Prometheus /metrics over HTTP on this port: 0 picks a free one (logged, and "
        "announced as metrics_url in $SRV.INFO); unset: no HTTP endpoint (docs/operations.md).",
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        min_length=1,
        max_length=255,
        description="Address /metrics listens on: loopback by default, since the series name users and "
        "their queues; 0.0.0.0 only behind a firewall or network policy that admits Prometheus alone.",
    )
    stream_replicas: int = Field(
        default=1,
        ge=1,
        le=5,
        description="Replicas of the event stream and KV buckets this service creates (3 in a 3-server NATS "
        "cluster); an existing stream is never shrunk or re-placed.",
    )

    @property
    def nats_servers(self) -> list[str]:
        return [s.strip() for s in self.nats.split(",") if s.strip()]

    @field_validator("metrics_host")
    @classmethod
    def _one_address(cls, value: str) -> str:
        """An IP address or a host name, nothing more: ``0.0.0.0:9461`` or ``http://host`` would
        otherwise surface only at start, as a resolver error that does not name the setting."""
        try:
            ipaddress.ip_address(value)
        except ValueError:
            if _HOSTNAME.match(value) is None:
                raise ValueError(f"{value!r} is not an IP address or a host name (the port is metrics_port)") from None
        return value


C = TypeVar("C", bound=ServiceConfig)


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"config file {path} is not valid {path.suffix or 'YAML'}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings, not {type(data).__name__}")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def env_values(model: type[BaseModel], environ: Mapping[str, str]) -> dict[str, Any]:
    """Settings from ``ROUNDHOUSE_<FIELD>`` variables; JSON is accepted for structured fields."""
    values: dict[str, Any] = {}
    for name, field_info in model.model_fields.items():
        raw = environ.get(ENV_PREFIX + name.upper())
        if raw is None:
            continue
        annotation = str(field_info.annotation)
        if "dict" in annotation or "list" in annotation:
            try:
                values[name] = json.loads(raw)
            except ValueError as exc:
                raise ConfigError(f"{ENV_PREFIX}{name.upper()} must be JSON: {exc}") from exc
        else:
            values[name] = raw
    return values


def load_config(
    model: type[C],
    *,
    file: Path | None = None,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> C:
    """Merge the sources (flags win) and validate; ``None`` flag values mean "not given"."""
    merged: dict[str, Any] = {}
    if file is not None:
        merged.update(read_config_file(file))
    merged.update(env_values(model, os.environ if environ is None else environ))
    merged.update({k: v for k, v in (flags or {}).items() if v is not None})
    try:
        return model.model_validate(merged)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"invalid {model.__name__} configuration: {problems}") from exc
