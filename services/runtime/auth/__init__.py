"""Credentials and broker configuration of a secured Roundhouse (issue 13).

Every connection to the bus authenticates as one identity: a role from :mod:`schemas.roles` and a
name, proven by a NATS user nkey whose seed sits in a creds file (:mod:`.creds`). The broker's
configuration is generated from the registry of identities and the permission table
(:mod:`.server_config`), so what each role may do is written once. :mod:`.directory` keeps the files
of one cluster together; ``Bus.connect`` (``identity_settings``) turns one into nats-py connection options.
"""

from __future__ import annotations

from services.runtime.auth.creds import (
    CREDS_ENV,
    Credentials,
    CredentialsError,
    new_credentials,
    read_creds,
    write_creds,
)
from services.runtime.auth.directory import SERVICE_ROLES, AuthDirectory, Issued
from services.runtime.auth.registry import Identity, Registry, RegistryError
from services.runtime.auth.server_config import render_authorization

__all__ = [
    "CREDS_ENV",
    "SERVICE_ROLES",
    "AuthDirectory",
    "Credentials",
    "CredentialsError",
    "Identity",
    "Issued",
    "Registry",
    "RegistryError",
    "new_credentials",
    "read_creds",
    "render_authorization",
    "write_creds",
]
