"""Provisioning never rewrites what an operator made, commands never provision, and a client takes
several NATS URLs and never falls back to a default it was not given (issue 12, replication)."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import nats.js.errors
import pytest

from roundhouse.client import Client
from roundhouse.endpoint import NoClusterError, resolve
from services.runtime.broker import Broker
from services.runtime.bus import Bus, BusOptions, PublishError
from services.runtime.config import ServiceConfig, load_config


def _namespace() -> str:
    return f"p{uuid.uuid4().hex[:10]}"


async def test_provisioning_keeps_an_existing_stream_s_settings_and_only_adds_subjects(broker: Broker) -> None:
    namespace = _namespace()
    bus = await Bus.connect(broker.url, name="svc", options=BusOptions(namespace=namespace), provision=True)
    try:
        info = await bus.js.stream_info(bus.stream_name)
        # An operator changes retention and drops a subject (an older deployment's list).
        operator = dataclasses.replace(info.config, max_age=3600.0, subjects=info.config.subjects[1:])
        await bus.js.update_stream(operator)
        await bus.provision()
        after = (await bus.js.stream_info(bus.stream_name)).config
        assert after.max_age == 3600.0
        assert sorted(after.subjects or []) == sorted(info.config.subjects or [])
        assert after.num_replicas == 1
    finally:
        await bus.close()


async def test_a_command_never_creates_the_stream(broker: Broker) -> None:
    namespace = _namespace()
    client = await Client.connect(broker.url, namespace=namespace)
    try:
        with pytest.raises(nats.js.errors.NotFoundError):
            await client.bus.js.stream_info(client.bus.stream_name)
    finally:
        await client.close()


async def test_a_client_takes_a_comma_separated_list_of_servers(broker: Broker) -> None:
    # The first server is down: the client moves on to the next one of the list.
    client = await Client.connect(f"nats://127.0.0.1:1, {broker.url}", namespace=_namespace())
    try:
        assert client.bus.nc.is_connected
    finally:
        await client.close()


def test_replicas_come_from_the_service_configuration(tmp_path: Path) -> None:
    path = tmp_path / "svc.yaml"
    path.write_text("stream_replicas: 3\nnats: nats://a:4222,nats://b:4222\n")
    config = load_config(ServiceConfig, file=path, environ={}, flags={})
    assert config.stream_replicas == 3
    assert config.nats_servers == ["nats://a:4222", "nats://b:4222"]
    config = load_config(ServiceConfig, environ={"ROUNDHOUSE_STREAM_REPLICAS": "5"}, flags={})
    assert config.stream_replicas == 5


async def test_a_replica_count_the_single_server_cannot_hold_fails_with_the_reason(broker: Broker) -> None:
    options = BusOptions(namespace=_namespace(), stream_replicas=3)
    bus = await Bus.connect(broker.url, name="svc", options=options, provision=False)
    try:
        with pytest.raises(PublishError, match=r"3 replica.*not supported in non-clustered mode"):
            await bus.provision()
    finally:
        await bus.close()


def test_no_cluster_named_is_an_error_not_a_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROUNDHOUSE_NATS", raising=False)
    monkeypatch.delenv("ROUNDHOUSE_NAMESPACE", raising=False)
    with pytest.raises(NoClusterError, match="--nats"):
        resolve(state_dir=tmp_path)
    monkeypatch.setenv("ROUNDHOUSE_NATS", "nats://a:1,nats://b:2")
    assert resolve(state_dir=tmp_path).nats == "nats://a:1,nats://b:2"
