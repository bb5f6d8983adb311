"""``identities.json``: every identity a cluster knows, by role, name and public key (never a seed).

The broker's ``auth.conf`` is generated from it (:mod:`services.runtime.auth.server_config`), so
adding a user or a node is: add it here, regenerate, reload the server. The namespace the permissions
are written for is kept here too (subjects carry it as a prefix).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from schemas.roles import Role, validate_identity
from services.runtime.auth.creds import FILE_MODE, CredentialsError

__all__ = ["Identity", "Registry", "RegistryError"]

VERSION: Final = 1
_PEOPLE_AND_NODES: Final = frozenset({Role.USER, Role.OPERATOR, Role.WORKER})


class RegistryError(ValueError):
    """A registry that cannot be read, or an identity that cannot be added to it."""


@dataclass(frozen=True, slots=True)
class Identity:
    role: Role
    name: str
    public_key: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role.value, "name": self.name, "public_key": self.public_key}


@dataclass(slots=True)
class Registry:
    namespace: str = ""
    identities: list[Identity] = field(default_factory=list)

    def find(self, role: Role, name: str) -> Identity | None:
        return next((i for i in self.identities if i.role is role and i.name == name), None)

    def named(self, role: Role) -> list[str]:
        return [i.name for i in self.identities if i.role is role]

    def add(self, identity: Identity) -> None:
        """Add ``identity``; RegistryError if its name is taken.

        A name is unique across users, operators and nodes, not only within a role: the scheduler
        knows a requester only by the name on the subject (``job.cancel.<name>``), so a user named
        like an operator would be taken for that operator."""
        try:
            validate_identity(identity.role, identity.name)
        except ValueError as exc:
            raise RegistryError(str(exc)) from None
        if self.find(identity.role, identity.name) is not None:
            raise RegistryError(f"{identity.role.value} {identity.name!r} exists already")
        if identity.role in _PEOPLE_AND_NODES:
            for other in self.identities:
                if other.name == identity.name and other.role in _PEOPLE_AND_NODES:
                    raise RegistryError(
                        f"the name {identity.name!r} is taken by a {other.role.value}: users, operators and "
                        "nodes need distinct names (the scheduler tells them apart by name)"
                    )
        if any(other.public_key == identity.public_key for other in self.identities):
            raise RegistryError(f"the key of {identity.role.value} {identity.name!r} is another identity's key")
        self.identities.append(identity)

    # --- file -----------------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: Path) -> Registry:
        try:
            data: Any = json.loads(path.read_text())
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as exc:
            raise RegistryError(f"cannot read {path}: {exc}") from None
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise RegistryError(f"{path} is not a version {VERSION} Roundhouse identity registry")
        registry = cls(namespace=str(data.get("namespace", "")))
        try:
            for entry in data.get("identities", []):
                registry.identities.append(Identity(Role(entry["role"]), str(entry["name"]), str(entry["public_key"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise RegistryError(f"{path}: malformed identity entry ({exc!r})") from None
        return registry

    def save(self, path: Path) -> None:
        """Write atomically. Public keys are not secret, but the file says who may do what: 0600 too."""
        data = {
            "version": VERSION,
            "namespace": self.namespace,
            "identities": [i.as_dict() for i in self.identities],
        }
        _write_private(path, json.dumps(data, indent=2) + "\n")


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    except OSError as exc:
        raise CredentialsError(f"cannot write {path}: {exc.strerror}") from None
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.replace(tmp, path)
