"""Which credentials a command connects with: --creds, then $ROUNDHOUSE_CREDS, then up.json's."""

from __future__ import annotations

from pathlib import Path

import pytest

from roundhouse.endpoint import Endpoint, resolve


@pytest.fixture
def up_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("ROUNDHOUSE_NATS", "ROUNDHOUSE_NAMESPACE", "ROUNDHOUSE_CREDS"):
        monkeypatch.delenv(name, raising=False)
    Endpoint("nats://127.0.0.1:4999", "rhx", tmp_path / "auth" / "user" / "alice.creds").write(tmp_path)
    return tmp_path


def test_up_json_names_the_users_credentials(up_dir: Path) -> None:
    found = resolve(state_dir=up_dir)
    assert found == Endpoint("nats://127.0.0.1:4999", "rhx", up_dir / "auth" / "user" / "alice.creds")


def test_the_environment_comes_before_up_json_and_the_flag_before_both(
    up_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROUNDHOUSE_CREDS", "/env.creds")
    assert resolve(state_dir=up_dir).creds == Path("/env.creds")
    assert resolve(creds="/flag.creds", state_dir=up_dir).creds == Path("/flag.creds")


def test_up_json_credentials_are_not_sent_to_another_nats(up_dir: Path) -> None:
    assert resolve("nats://elsewhere:4222", state_dir=up_dir).creds is None
    assert resolve("nats://127.0.0.1:4999", state_dir=up_dir).creds is not None


def test_an_open_cluster_has_no_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROUNDHOUSE_CREDS", raising=False)
    Endpoint("nats://127.0.0.1:4999", "rhx").write(tmp_path)
    assert "creds" not in (tmp_path / "up.json").read_text()
    assert resolve(state_dir=tmp_path).creds is None
