"""`roundhouse service KIND` derives its flags from the service's settings model."""

from __future__ import annotations

import pytest

from services.runtime.config import ConfigError, ServiceConfig
from services.runtime.entry import build_parser, parse_flags


class DemoConfig(ServiceConfig):
    round_s: float = 300.0
    fake_gpus: int = 0
    emulate: bool = False
    labels: dict[str, str] = {}


def test_every_field_becomes_a_flag() -> None:
    parser = build_parser("demo", DemoConfig)
    args = parser.parse_args(["--round-s", "2.5", "--fake-gpus", "4", "--emulate", "--labels", '{"rack": "r1"}',
                              "--nats", "nats://h:4222", "--policy", "las"])
    flags = parse_flags(DemoConfig, args)
    config = DemoConfig.model_validate(flags)
    assert (config.round_s, config.fake_gpus, config.emulate) == (2.5, 4, True)
    assert config.labels == {"rack": "r1"}
    assert (config.nats, config.policy) == ("nats://h:4222", "las")


def test_flags_not_given_are_left_to_file_and_environment() -> None:
    args = build_parser("demo", DemoConfig).parse_args([])
    assert parse_flags(DemoConfig, args) == {}


def test_structured_flags_must_be_json() -> None:
    args = build_parser("demo", DemoConfig).parse_args(["--labels", "rack=r1"])
    with pytest.raises(ConfigError, match="--labels must be JSON"):
        parse_flags(DemoConfig, args)
