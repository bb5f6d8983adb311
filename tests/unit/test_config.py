"""Service configuration: precedence and errors that name the source and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.runtime.config import ConfigError, ServiceConfig, load_config


def test_defaults_file_env_flags_in_increasing_precedence(tmp_path: Path) -> None:
    file = tmp_path / "scheduler.yaml"
    file.write_text("nats: nats://from-file:4222\nnamespace: fromfile\nlog-level: DEBUG\npolicy: fifo\n")
    environ = {"ROUNDHOUSE_NAMESPACE": "fromenv", "ROUNDHOUSE_POLICY": "las"}
    config = load_config(ServiceConfig, file=file, environ=environ, flags={"policy": "tiresias", "db": None})
    assert config.nats == "nats://from-file:4222"  # file only
    assert config.namespace == "fromenv"  # env beats file
    assert config.policy == "tiresias"  # flag beats env
    assert config.log_level == "DEBUG"  # dashes in file keys work
    assert config.db == ".roundhouse"  # a None flag means "not given"


def test_structured_values_from_the_environment_are_json() -> None:
    config = load_config(ServiceConfig, environ={"ROUNDHOUSE_POLICY_OPTIONS": '{"factor": 1.2}'})
    assert config.policy_options == {"factor": 1.2}
    with pytest.raises(ConfigError, match="ROUNDHOUSE_POLICY_OPTIONS must be JSON"):
        load_config(ServiceConfig, environ={"ROUNDHOUSE_POLICY_OPTIONS": "{factor"})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("polcy: las\n", "polcy: Extra inputs are not permitted", id="misspelt-key"),
        pytest.param("log_level: LOUD\n", "log_level: String should match pattern", id="bad-value"),
        pytest.param("- a\n- b\n", "must hold a mapping", id="not-a-mapping"),
        pytest.param("nats: [unclosed\n", "is not valid", id="bad-yaml"),
    ],
)
def test_bad_config_files_say_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    file = tmp_path / "c.yaml"
    file.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(ServiceConfig, file=file, environ={})


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(ServiceConfig, file=tmp_path / "nope.yaml", environ={})


def test_several_servers_are_comma_separated() -> None:
    config = ServiceConfig(nats="nats://a:4222, nats://b:4222")
    assert config.nats_servers == ["nats://a:4222", "nats://b:4222"]
