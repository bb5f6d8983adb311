"""Markers of the integration tests (registered here: ``filterwarnings = error`` makes an unknown mark
a collection error)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "nats_cluster: runs a real 3-server NATS cluster with R3 JetStream (select with -m nats_cluster)",
    )
