"""A cluster's credentials directory: the registry, the broker's ``auth.conf`` and one creds file per identity.

Layout (the directory and every subdirectory 0700, every file 0600)::

    <dir>/identities.json         role, name, public key of every identity (no seeds)
    <dir>/auth.conf               the broker's authorization block, generated from the two above
    <dir>/<role>/<name>.creds     one identity's credentials (services: <dir>/scheduler/scheduler.creds)

``init`` is idempotent: identities that exist keep their keys (a rerun never locks out a running
service), missing ones are created. Seeds are written only into creds files, never into the registry.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from schemas.roles import Role, validate_identity
from services.runtime.auth.creds import DIR_MODE, Credentials, new_credentials, read_creds, write_creds
from services.runtime.auth.registry import Identity, Registry, RegistryError, _write_private
from services.runtime.auth.server_config import render_authorization

__all__ = ["SERVICE_ROLES", "AuthDirectory", "Issued"]

SERVICE_ROLES: Final = (Role.SCHEDULER, Role.ADMISSION, Role.PLACEMENT, Role.METRICS)
"""The service kinds with one shared identity each, named after the role."""
REGISTRY_FILE: Final = "identities.json"
SERVER_CONFIG_FILE: Final = "auth.conf"


@dataclass(frozen=True, slots=True)
class Issued:
    """One identity of the directory and where its credentials are."""

    identity: Identity
    creds: Path
    created: bool
    """Made by this call (False: it existed already and was kept)."""


class AuthDirectory:
    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def registry_path(self) -> Path:
        return self.root / REGISTRY_FILE

    @property
    def server_config_path(self) -> Path:
        return self.root / SERVER_CONFIG_FILE

    def creds_path(self, role: Role, name: str) -> Path:
        return self.root / role.value / f"{name}.creds"

    def registry(self) -> Registry:
        return Registry.load(self.registry_path)

    def credentials(self, role: Role, name: str) -> Credentials:
        return read_creds(self.creds_path(role, name))

    # --- changes --------------------------------------------------------------------------------------
    def init(
        self,
        *,
        namespace: str = "",
        operators: Iterable[str] = ("operator",),
        users: Iterable[str] = (),
        nodes: Iterable[str] = (),
    ) -> list[Issued]:
        """Every service identity, and the given operators, users and nodes: created where missing.

        The namespace of the generated server configuration becomes ``namespace``."""
        self._make_root()
        registry = self.registry()
        registry.namespace = namespace
        wanted = [(role, role.value) for role in SERVICE_ROLES]
        wanted += [(Role.OPERATOR, name) for name in operators]
        wanted += [(Role.USER, name) for name in users]
        wanted += [(Role.WORKER, name) for name in nodes]
        issued = [self._ensure(registry, role, name) for role, name in dict.fromkeys(wanted)]
        self._save(registry)
        return issued

    def add(self, role: Role, name: str) -> Issued:
        """Add one identity (a user, a node, an operator); RegistryError if its name is taken or invalid."""
        self._make_root()
        registry = self.registry()
        if registry.find(role, name) is not None:
            raise RegistryError(f"{role.value} {name!r} exists already ({self.creds_path(role, name)})")
        issued = self._ensure(registry, role, name)
        self._save(registry)
        return issued

    def list(self) -> list[Issued]:
        return [Issued(i, self.creds_path(i.role, i.name), False) for i in self.registry().identities]

    def render_server_config(self) -> str:
        registry = self.registry()
        return render_authorization(registry.identities, namespace=registry.namespace)

    def write_server_config(self) -> Path:
        """(Re)generate ``auth.conf`` from the registry; reload the broker to apply it."""
        _write_private(self.server_config_path, self.render_server_config())
        return self.server_config_path

    # --- internals ------------------------------------------------------------------------------------
    def _make_root(self) -> None:
        self.root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        os.chmod(self.root, DIR_MODE)

    def _ensure(self, registry: Registry, role: Role, name: str) -> Issued:
        try:
            validate_identity(role, name)  # before the name becomes a path
        except ValueError as exc:
            raise RegistryError(str(exc)) from None
        path = self.creds_path(role, name)
        known = registry.find(role, name)
        if known is not None and path.is_file() and read_creds(path).public_key == known.public_key:
            return Issued(known, path, False)
        if known is not None:
            # Registered but its creds file is gone (or replaced): issue a new key, drop the old one.
            registry.identities.remove(known)
        creds = new_credentials(role, name)
        identity = Identity(role, name, creds.public_key)
        registry.add(identity)  # refuses a taken or invalid name before anything is written
        path.parent.mkdir(mode=DIR_MODE, exist_ok=True)
        write_creds(path, creds)
        return Issued(identity, path, True)

    def _save(self, registry: Registry) -> None:
        registry.save(self.registry_path)
        _write_private(self.server_config_path, render_authorization(registry.identities, namespace=registry.namespace))
