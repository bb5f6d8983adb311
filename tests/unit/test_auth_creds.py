"""Credentials files, the identity registry and the generated broker authorization (no broker here)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from roundhouse.cli import main
from schemas.roles import Role, inbox_prefix
from services.runtime.auth import (
    AuthDirectory,
    CredentialsError,
    Identity,
    Registry,
    RegistryError,
    new_credentials,
    read_creds,
    render_authorization,
    write_creds,
)
from services.runtime.auth.creds import parse_creds, render_creds
from services.runtime.auth.service_identity import check_service_identity, provisions_stream, waits_for_stream


# --- creds files ---------------------------------------------------------------------------------------------
def test_creds_round_trip_and_are_private(tmp_path: Path) -> None:
    creds = new_credentials(Role.WORKER, "node-1")
    path = write_creds(tmp_path / "new" / "node-1.creds", creds)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    again = read_creds(path)
    assert (again.role, again.identity, again.seed) == (Role.WORKER, "node-1", creds.seed)
    assert again.public_key.startswith("U")
    assert again.seed.startswith("SU")
    text = path.read_text()
    assert text.startswith("# Roundhouse credentials: worker node-1\n")
    assert "-----BEGIN USER NKEY SEED-----" in text
    assert "------END USER NKEY SEED------" in text
    assert creds.seed not in repr(creds)  # never in a log line or a traceback


def test_every_identity_gets_its_own_key() -> None:
    keys = {new_credentials(Role.USER, "alice").seed for _ in range(20)}
    assert len(keys) == 20


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        pytest.param(lambda t: t.replace("role: user", "role: king"), "unknown role 'king'", id="unknown-role"),
        pytest.param(lambda t: t.replace("identity: alice", "identity: a.b"), "must be 1-", id="bad-name"),
        pytest.param(lambda t: t.replace("identity: alice", "identity: scheduler"), "reserved", id="reserved"),
        pytest.param(lambda t: t.replace("role: user\n", ""), "no role", id="no-role"),
        pytest.param(lambda t: t.split("-----BEGIN")[0], "no the USER NKEY SEED block", id="no-seed"),
        pytest.param(lambda t: t.replace("public_key: U", "public_key: UX"), "does not belong", id="edited-key"),
        pytest.param(lambda t: t.replace("\nSU", "\nSA"), "must start with SU|not a valid", id="account-seed"),
    ],
)
def test_malformed_creds_are_refused_with_the_reason(edit: object, message: str) -> None:
    text = render_creds(new_credentials(Role.USER, "alice"))
    assert callable(edit)
    with pytest.raises(CredentialsError, match=message):
        parse_creds(edit(text), source="f")


def test_a_missing_or_readable_creds_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CredentialsError, match="does not exist"):
        read_creds(tmp_path / "none.creds")
    path = write_creds(tmp_path / "alice.creds", new_credentials(Role.USER, "alice"))
    path.chmod(0o644)
    with pytest.raises(CredentialsError, match="chmod 600"):
        read_creds(path)


# --- registry and directory ----------------------------------------------------------------------------------
def test_init_issues_every_identity_once_and_keeps_keys(tmp_path: Path) -> None:
    auth = AuthDirectory(tmp_path / "auth")
    first = auth.init(namespace="prod", users=["alice"], nodes=["gpu-01"])
    assert [(i.identity.role, i.identity.name) for i in first] == [
        (Role.SCHEDULER, "scheduler"), (Role.ADMISSION, "admission"), (Role.PLACEMENT, "placement"),
        (Role.METRICS, "metrics"), (Role.OPERATOR, "operator"), (Role.USER, "alice"), (Role.WORKER, "gpu-01"),
    ]  # fmt: skip
    assert all(i.created for i in first)
    second = auth.init(namespace="prod", users=["alice", "bob"], nodes=["gpu-01"])
    assert [i.identity.name for i in second if i.created] == ["bob"]
    assert {i.identity.public_key for i in first} <= {i.identity.public_key for i in second}
    registry_text = auth.registry_path.read_text()
    for issued in second:
        assert read_creds(issued.creds).seed not in registry_text  # seeds live only in creds files
    assert stat.S_IMODE(auth.server_config_path.stat().st_mode) == 0o600


def test_a_lost_creds_file_is_reissued_with_a_new_key(tmp_path: Path) -> None:
    auth = AuthDirectory(tmp_path)
    old = auth.add(Role.USER, "alice")
    old.creds.unlink()
    new = auth.init(users=["alice"])[-1]
    assert new.created
    assert new.identity.public_key != old.identity.public_key
    assert old.identity.public_key not in auth.server_config_path.read_text()


@pytest.mark.parametrize(
    ("role", "name", "message"),
    [
        pytest.param(Role.USER, "scheduler", "reserved", id="user-named-as-a-role"),
        pytest.param(Role.WORKER, "operator", "reserved", id="node-named-as-a-role"),
        pytest.param(Role.USER, "a.b", "must be 1-", id="dot"),
        pytest.param(Role.USER, "*", "must be 1-", id="wildcard"),
        pytest.param(Role.USER, "root", "taken by a operator", id="user-named-as-an-operator"),
        pytest.param(Role.WORKER, "alice", "taken by a user", id="node-named-as-a-user"),
        pytest.param(Role.USER, "alice", "exists already", id="twice"),
    ],
)
def test_names_that_cannot_be_identities_are_refused(tmp_path: Path, role: Role, name: str, message: str) -> None:
    auth = AuthDirectory(tmp_path)
    auth.init(operators=["root"], users=["alice"])
    with pytest.raises((RegistryError, ValueError), match=message):
        auth.add(role, name)


def test_registry_file_round_trips(tmp_path: Path) -> None:
    registry = Registry(namespace="ns")
    registry.add(Identity(Role.USER, "alice", new_credentials(Role.USER, "alice").public_key))
    registry.save(tmp_path / "r.json")
    assert Registry.load(tmp_path / "r.json") == registry
    (tmp_path / "bad.json").write_text(json.dumps({"version": 99}))
    with pytest.raises(RegistryError, match="not a version 1"):
        Registry.load(tmp_path / "bad.json")


# --- generated broker authorization ---------------------------------------------------------------------------
def test_authorization_block_gives_each_identity_its_roles_permissions() -> None:
    alice = Identity(Role.USER, "alice", new_credentials(Role.USER, "alice").public_key)
    node = Identity(Role.WORKER, "gpu-01", new_credentials(Role.WORKER, "gpu-01").public_key)
    text = render_authorization([alice, node], namespace="prod")
    assert text.count("{nkey:") == 2
    user_block = text.split(alice.public_key)[1].split("}}")[0]
    assert '"prod.job.arrived.alice"' in user_block
    assert f'"{inbox_prefix(Role.USER, "alice")}.>"' in user_block
    assert "allow_responses" not in user_block  # users answer no requests
    assert "lease.grant" not in user_block
    node_block = text.split(node.public_key)[1].split("}}")[0]
    assert '"prod.lease.grant.gpu-01"' in node_block
    assert "allow_responses: true" in node_block
    assert '"prod.job.started.gpu-01"' in node_block
    assert "job.started.*" not in node_block.split("subscribe")[0]


# --- which identity runs which service ---------------------------------------------------------------------------
def test_a_service_needs_its_own_roles_credentials() -> None:
    check_service_identity(new_credentials(Role.SCHEDULER, "scheduler"), "scheduler")
    check_service_identity(new_credentials(Role.OPERATOR, "ops"), "placement")
    check_service_identity(new_credentials(Role.WORKER, "n1"), "worker", node_id="n1")
    with pytest.raises(CredentialsError, match="the scheduler service needs scheduler credentials"):
        check_service_identity(new_credentials(Role.PLACEMENT, "placement"), "scheduler")
    with pytest.raises(CredentialsError, match="--node-id n1"):
        check_service_identity(new_credentials(Role.WORKER, "n1"), "worker", node_id="n2")
    assert provisions_stream(None)
    assert provisions_stream(new_credentials(Role.ADMISSION, "admission"))
    assert not provisions_stream(new_credentials(Role.WORKER, "n1"))
    assert waits_for_stream(new_credentials(Role.WORKER, "n1"))
    assert not waits_for_stream(None)


# --- roundhouse auth ---------------------------------------------------------------------------------------------
def test_auth_command_group(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    where = ["--dir", str(tmp_path / "auth")]
    assert main(["auth", "init", *where, "--namespace", "prod", "--user", "alice", "--node", "gpu-01"]) == 0
    out = capsys.readouterr().out
    assert "created  user       alice" in out
    assert "auth.conf" in out
    assert main(["auth", "add-user", "bob", *where]) == 0
    assert main(["auth", "add-node", "gpu-02", *where]) == 0
    assert main(["auth", "add-user", "scheduler", *where]) == 2
    assert "reserved" in capsys.readouterr().err
    assert main(["auth", "add-node", "bad.name", *where]) == 2
    assert "must be 1-" in capsys.readouterr().err
    assert main(["auth", "list", *where]) == 0
    listed = capsys.readouterr().out
    assert "bob" in listed
    assert "gpu-02" in listed
    assert read_creds(tmp_path / "auth" / "user" / "bob.creds").seed not in listed
    assert main(["auth", "server-config", *where]) == 0
    assert '"prod.job.arrived.bob"' in (tmp_path / "auth" / "auth.conf").read_text()
