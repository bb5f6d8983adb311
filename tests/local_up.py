"""A ``roundhouse up`` cluster for a test module, and the CLI run where ``up`` ran."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from roundhouse.cli import main
from roundhouse.local import LocalCluster, LocalClusterConfig


@contextmanager
def local_up(config: LocalClusterConfig) -> Iterator[LocalCluster]:
    """Start the cluster, wait until every part answers, stop it afterwards (also on a failed start)."""
    running = LocalCluster(config)
    running.start()
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()


def cli_where_up_ran(cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    """``roundhouse ARGS`` in the directory ``up`` ran in: it finds the cluster and the user's
    credentials through ./.roundhouse/up.json, not through the caller's environment."""
    monkeypatch.chdir(cluster.state_dir.parent)
    monkeypatch.delenv("ROUNDHOUSE_NATS", raising=False)
    monkeypatch.delenv("ROUNDHOUSE_CREDS", raising=False)
    return main(list(args))
