"""The bundled nats-server: free port chosen by the server, restart on the same port, clean stop."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from services.runtime.broker import Broker, BrokerError, find_server_binary


def accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_bundled_binary_is_found() -> None:
    binary = find_server_binary()
    assert binary.name == "nats-server"
    assert binary.is_file()


def test_two_brokers_get_different_free_ports_and_restart_keeps_the_port(tmp_path: Path) -> None:
    with Broker(tmp_path / "a") as a, Broker(tmp_path / "b") as b:
        assert a.port != b.port
        assert accepts(a.port or 0)
        port = a.port
        a.restart()
        assert a.port == port
        assert accepts(port or 0)
    assert not a.running
    assert not accepts(port or 0)


def test_a_server_that_cannot_start_reports_why(tmp_path: Path) -> None:
    with Broker(tmp_path / "a") as a:
        clash = Broker(tmp_path / "b", port=a.port, startup_timeout_s=5)
        with pytest.raises(BrokerError, match="exited with code"):
            clash.start()


def test_override_must_name_a_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ROUNDHOUSE_NATS_SERVER", str(tmp_path / "missing"))
    with pytest.raises(BrokerError, match="does not name a file"):
        find_server_binary()
