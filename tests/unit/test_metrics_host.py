"""Where ``/metrics`` listens: ``metrics_host`` (services/runtime/config.py) as the deploy files set it
(ROUNDHOUSE_METRICS_HOST: a container's or a pod's address, loopback on systemd hosts), checked when
the settings load, and a bind that fails naming both settings (services/runtime/prometheus.py)."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request

import pytest

from services.runtime.config import ConfigError, ServiceConfig, load_config
from services.runtime.prometheus import MetricsBindError, MetricsServer, new_registry


def test_the_default_is_loopback() -> None:
    assert load_config(ServiceConfig, environ={}).metrics_host == "127.0.0.1"


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "172.30.61.11", "0.0.0.0", "::1", "fd00::5", "localhost", "node-1.example"]
)
def test_an_address_or_a_host_name_is_accepted(host: str) -> None:
    assert load_config(ServiceConfig, environ={"ROUNDHOUSE_METRICS_HOST": host}).metrics_host == host


@pytest.mark.parametrize("host", ["0.0.0.0:9461", "http://prometheus", "a b", "-node", "node..example", "[::1]"])
def test_anything_else_is_refused_naming_the_setting(host: str) -> None:
    with pytest.raises(ConfigError, match=r"metrics_host: .*is not an IP address or a host name"):
        load_config(ServiceConfig, environ={"ROUNDHOUSE_METRICS_HOST": host})


def get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return answer.status, answer.read()


def test_the_server_listens_on_the_configured_address_only() -> None:
    """127.0.0.2 stands for a container's address on its scrape network: /metrics answers there and
    nothing answers on the same port of 127.0.0.1 (held bound but not listening here, so that no
    other process can be listening on it either)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        environ = {"ROUNDHOUSE_METRICS_HOST": "127.0.0.2", "ROUNDHOUSE_METRICS_PORT": str(port)}
        config = load_config(ServiceConfig, environ=environ)
        assert config.metrics_port == port

        async def scenario() -> None:
            server = MetricsServer(new_registry())
            url = await server.start(config.metrics_host, port)
            try:
                assert url == f"http://127.0.0.2:{port}/metrics"
                status, _ = await asyncio.to_thread(get, url)
                assert status == 200
                with pytest.raises(urllib.error.URLError):
                    await asyncio.to_thread(get, f"http://127.0.0.1:{port}/metrics")
            finally:
                await server.close()

        asyncio.run(scenario())


def test_a_port_in_use_fails_naming_the_settings() -> None:
    async def scenario() -> None:
        first = MetricsServer(new_registry())
        await first.start("127.0.0.1", 0)
        try:
            with pytest.raises(MetricsBindError, match=rf"127\.0\.0\.1:{first.port} \(metrics_host, metrics_port\)"):
                await MetricsServer(new_registry()).start("127.0.0.1", first.port)
        finally:
            await first.close()

    asyncio.run(scenario())
