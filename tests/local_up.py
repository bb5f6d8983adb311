"""A ``roundhouse up`` cluster for a test module, and the CLI run where ``up`` ran."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from roundhouse.cli import main
from roundhouse.endpoint import DEFAULT_STATE_DIR
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


def up_for_module(tmp_path_factory: pytest.TempPathFactory, **config: Any) -> Iterator[LocalCluster]:
    """A module fixture's ``roundhouse up`` (``yield from up_for_module(...)``): ``config``'s
    :class:`LocalClusterConfig` fields, the state in a fresh directory's ./.roundhouse, where
    :func:`cli_where_up_ran` finds it."""
    state_dir = tmp_path_factory.mktemp("up") / DEFAULT_STATE_DIR
    with local_up(LocalClusterConfig(state_dir=state_dir, **config)) as running:
        yield running


METRICS_UP: dict[str, Any] = {
    "workers": 2, "gpus_per_worker": 2, "round_s": 1.0, "emulate": True, "speedup": 10.0, "user": "alice",
    "extra_args": {"worker": ["--metrics-s", "0.2"]},
}  # fmt: skip
"""Two emulating workers of two GPUs that sample GPU metrics every 0.2 s: a cluster whose ``/metrics``
follow a job within a second or so."""
