"""What a service may do with the identity it was given: which role runs which service, who provisions.

A service started with another role's credentials would connect and then fail on every publish (the
broker drops what the role may not send); checking before connecting turns that into one clear error.
"""

from __future__ import annotations

from typing import Final

from schemas.roles import Role
from services.runtime.auth.creds import Credentials, CredentialsError

__all__ = ["PROVISIONING_ROLES", "check_service_identity", "provisions_stream", "waits_for_stream"]

PROVISIONING_ROLES: Final = frozenset({Role.SCHEDULER, Role.ADMISSION, Role.OPERATOR})
"""Roles whose permissions let them create and update the event stream (schemas.roles)."""


def check_service_identity(creds: Credentials, kind: str, *, node_id: str | None = None) -> None:
    """CredentialsError unless ``creds`` may run the service ``kind`` (its role, or an operator's).

    A worker's credentials also name its node: the broker lets it speak only for that node id."""
    if creds.role is Role.OPERATOR:
        return
    if creds.role.value != kind:
        raise CredentialsError(
            f"the credentials are {creds.role.value} {creds.identity}'s; the {kind} service needs {kind} credentials"
        )
    if creds.role is Role.WORKER and node_id is not None and node_id != creds.identity:
        raise CredentialsError(
            f"the credentials are node {creds.identity}'s, but this worker is node {node_id}: "
            f"run it with --node-id {creds.identity} or with node {node_id}'s credentials"
        )


def provisions_stream(creds: Credentials | None) -> bool:
    """Whether a service connecting with ``creds`` creates or updates the event stream at start.

    Without credentials (an open broker) every service does, as before authentication existed."""
    return creds is None or creds.role in PROVISIONING_ROLES


def waits_for_stream(creds: Credentials | None) -> bool:
    """Whether a service must wait for others to create the stream before it starts: a worker
    publishes durable facts (its registration first) but may not create the stream."""
    return creds is not None and creds.role is Role.WORKER
