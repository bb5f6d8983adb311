"""The base every Roundhouse service runs on.

:func:`run_service` gives a service: uvloop, a bus connection that reconnects forever, the NATS
services API (``$SRV.PING``, ``$SRV.INFO``, ``$SRV.STATS`` answer for every instance, so
``nats micro ls`` and health checks work without extra endpoints), Prometheus ``/metrics`` over HTTP
when ``metrics_port`` is set (``prometheus.py``), structured logs, and a graceful
stop on SIGTERM/SIGINT: stop taking new work, let the service finish and ack what it has in hand,
close its store, drain the connection. A second signal stops at once.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, ClassVar

import nats.errors
import nats.js.errors
from nats.micro import add_service
from nats.micro.request import Request
from nats.micro.service import EndpointStats
from nats.micro.service import Service as MicroService
from nats.micro.service import ServiceConfig as MicroConfig

from services.runtime.auth.creds import Credentials, CredentialsError, read_creds
from services.runtime.auth.service_identity import check_service_identity, provisions_stream, waits_for_stream
from services.runtime.bus import AuthenticationError, Bus, BusOptions
from services.runtime.config import ServiceConfig
from services.runtime.logs import configure_logging
from services.runtime.prometheus import MetricsServer, ServiceCollector, new_registry
from services.runtime.version import __version__

log = logging.getLogger("roundhouse.service")


class RoundhouseService(abc.ABC):
    """One Roundhouse process. Subclasses set ``kind`` and implement ``start`` and ``stop``."""

    kind: ClassVar[str]
    description: ClassVar[str] = ""
    config_model: ClassVar[type[ServiceConfig]] = ServiceConfig
    """The service's settings; `roundhouse service KIND` derives its flags from this model's fields."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.instance = config.instance or f"{socket.gethostname()}-{os.getpid()}"
        self.started_at = time.time()
        self.metrics_registry = new_registry()
        """The service's Prometheus series (served at ``/metrics`` when ``metrics_port`` is set);
        subclasses register their own collectors here."""
        self.metrics_url: str | None = None
        """Where ``/metrics`` is served once the service runs; None while off."""

    @abc.abstractmethod
    async def start(self, bus: Bus) -> None:
        """Subscribe, start consumers and timers. Return once the service is serving."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop taking work, finish (and ack) what is in hand, close resources. Must be idempotent."""

    def stats(self) -> dict[str, Any]:
        """Numbers for ``$SRV.STATS``; override to add the service's own."""
        return {}

    def policy_info(self) -> tuple[str, Mapping[str, Any]] | None:
        """The policy this service runs and its options (``roundhouse_policy_info``); None if none."""
        policy = getattr(self, "policy", None)
        name = getattr(policy, "name", None)
        if isinstance(name, str):
            return name, self.config.policy_options
        if self.config.policy is not None:
            return self.config.policy, self.config.policy_options
        return None


def _micro_version() -> str:
    # The services API insists on semantic versions; local builds may carry a suffix.
    core = __version__.split("+", 1)[0]
    return core if core.count(".") == 2 else "0.0.0"


async def _announce(bus: Bus, service: RoundhouseService, metrics_url: str | None = None) -> MicroService:
    def current_stats() -> dict[str, Any]:
        uptime_s = time.time() - service.started_at
        stats: dict[str, Any] = {"service": service.stats(), "bus": bus.stats.as_dict(), "uptime_s": uptime_s}
        # What it runs, so `roundhouse status` shows every service's policy and options, not only
        # the scheduler's (services/scheduler/status_query.py reads this shape).
        policy = service.policy_info()
        if policy is not None:
            stats["policy"] = {"name": policy[0], "options": dict(policy[1])}
        return stats

    def stats_handler(_: EndpointStats) -> dict[str, Any]:
        return current_stats()

    metadata = {"instance": service.instance, "namespace": service.config.namespace}
    if metrics_url is not None:
        metadata["metrics_url"] = metrics_url
    micro = await add_service(
        bus.nc,
        MicroConfig(
            name=f"roundhouse-{service.kind}",
            version=_micro_version(),
            description=service.description or f"Roundhouse {service.kind} service",
            metadata=metadata,
            stats_handler=stats_handler,
        ),
    )

    async def on_stats(request: Request) -> None:
        await request.respond(json.dumps(current_stats()).encode())

    prefix = bus.wire(f"rh.{service.kind}")
    await micro.add_endpoint(name="stats", subject=f"{prefix}.stats", handler=on_stats)
    return micro


async def run_service(service: RoundhouseService, *, stop: asyncio.Event | None = None) -> None:
    """Run ``service`` until SIGTERM/SIGINT (or until ``stop`` is set), then shut it down cleanly."""
    config = service.config
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not main thread
            loop.add_signal_handler(sig, _on_signal, stop, sig)
            installed.append(sig)

    creds = _service_credentials(service)
    provision = provisions_stream(creds)
    bus = await Bus.connect(
        config.nats_servers,
        name=f"roundhouse-{service.kind}-{service.instance}",
        options=BusOptions(namespace=config.namespace, stream_replicas=config.stream_replicas),
        provision=provision,
        creds=creds,
    )
    if waits_for_stream(creds):
        await _wait_for_stream(bus, service.kind)
    micro: MicroService | None = None
    metrics: MetricsServer | None = None
    try:
        await service.start(bus)
        metrics = await _serve_metrics(service, bus)
        micro = await _announce(bus, service, metrics.url if metrics is not None else None)
        log.info("%s service started", service.kind, extra={"instance": service.instance})
        await stop.wait()
        log.info("%s service stopping", service.kind)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
            # A second signal during the drain stops at once (the default action).
            signal.signal(sig, signal.SIG_DFL)
        try:
            await asyncio.wait_for(service.stop(), timeout=config.drain_timeout_s)
        except TimeoutError:
            log.error("%s service did not stop within %.0f s", service.kind, config.drain_timeout_s)
        if micro is not None:
            with contextlib.suppress(Exception):
                await micro.stop()
        if metrics is not None:
            await metrics.close()
        await bus.close()
        log.info("%s service stopped", service.kind)


async def _serve_metrics(service: RoundhouseService, bus: Bus) -> MetricsServer | None:
    """Register what every service exposes and, with ``metrics_port`` set, serve ``/metrics``."""
    config = service.config
    service.metrics_registry.register(
        ServiceCollector(
            kind=service.kind, instance=service.instance, namespace=config.namespace, version=__version__,
            started_at=service.started_at, stats=service.stats, bus_stats=bus.stats.as_dict,
            policy=service.policy_info,
        )
    )  # fmt: skip
    if config.metrics_port is None:
        return None
    server = MetricsServer(service.metrics_registry)
    url = await server.start(config.metrics_host, config.metrics_port)
    service.metrics_url = url
    log.info("%s metrics at %s", service.kind, url, extra={"metrics_url": url})
    return server


def _service_credentials(service: RoundhouseService) -> Credentials | None:
    """The service's credentials (``--creds``), checked to be fit for it; None without any."""
    if service.config.creds is None:
        return None
    creds = read_creds(Path(service.config.creds))
    check_service_identity(creds, service.kind, node_id=getattr(service.config, "node_id", None))
    return creds


_STREAM_WAIT_LOG_S = 10.0


async def _wait_for_stream(bus: Bus, kind: str) -> None:
    """Wait until the event stream exists, for a service that may not create it (a worker).

    Only the scheduler and admission may create the stream; a worker that started first would
    otherwise fail its first durable publish (its registration)."""
    loop = asyncio.get_running_loop()
    next_log = loop.time()
    while True:
        try:
            await bus.js.stream_info(bus.stream_name)
            return
        except nats.js.errors.NotFoundError:
            pass
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
            log.debug("stream look-up failed: %r", exc)
        if loop.time() >= next_log:
            log.info("%s waits for the event stream %s (the scheduler and admission create it)", kind,
                     bus.stream_name)  # fmt: skip
            next_log = loop.time() + _STREAM_WAIT_LOG_S
        await asyncio.sleep(0.2)


def _on_signal(stop: asyncio.Event, sig: signal.Signals) -> None:
    log.info("received %s", sig.name)
    stop.set()


def run_main(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a coroutine on uvloop where available (the services' event loop)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        asyncio.run(main())
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


def start_service_process(service: RoundhouseService) -> int:
    """Entry point for ``roundhouse service KIND``: logs, loop, run; returns the exit code."""
    configure_logging(
        level=service.config.log_level, fmt=service.config.log_format,
        service=service.kind, instance=service.instance, node_id=getattr(service.config, "node_id", None),
    )  # fmt: skip
    try:
        run_main(lambda: run_service(service))
    except KeyboardInterrupt:
        return 130
    except (CredentialsError, AuthenticationError) as exc:
        log.error("%s service cannot connect: %s", service.kind, exc)
        return 1
    except Exception:
        log.exception("%s service failed", service.kind)
        return 1
    return 0
