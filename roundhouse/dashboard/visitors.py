"""Who is asking for the page: HTTP Basic credentials read as a bus identity.

The dashboard holds no privilege of its own: a visitor signs in with the identity of their own
credentials file (``roundhouse auth`` or ``roundhouse up`` made it) and the broker decides, on a bus
connection opened with those credentials, what the visitor may see. HTTP Basic carries them:

* user name: the identity (``alice``), or ``ROLE/IDENTITY`` for another role (``operator/operator``);
  a bare name that is a role's name (``operator``) means that role's identity of the same name;
* password: the nkey seed of the credentials file (the ``SU...`` line between the ``NKEY SEED``
  markers), which the broker checks by the signature of its nonce (the seed never reaches the broker).

Only users and operators may sign in: a service's or a worker's credentials are not a person's.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass, field

from schemas.roles import RESERVED_NAMES, Role, validate_identity
from services.runtime.auth.creds import Credentials, CredentialsError

__all__ = ["SIGN_IN_ROLES", "BadCredentials", "Visitor", "parse_basic"]

SIGN_IN_ROLES = (Role.USER, Role.OPERATOR)
"""The roles a person may sign in to the dashboard as."""


class BadCredentials(ValueError):
    """The request's ``Authorization`` header cannot be a visitor's credentials (the message says why)."""


@dataclass(frozen=True, slots=True)
class Visitor:
    credentials: Credentials = field(repr=False)

    @property
    def key(self) -> str:
        """What a cached session is found by: the identity and (a hash of) the seed that proved it,
        so a wrong seed for a known identity never reaches that identity's session."""
        proof = f"{self.credentials.role.value}/{self.credentials.identity}/{self.credentials.seed}"
        return hashlib.sha256(proof.encode()).hexdigest()

    @property
    def label(self) -> str:
        return f"{self.credentials.role.value} {self.credentials.identity}"


def _role_and_identity(username: str) -> tuple[Role, str]:
    role_name, slash, identity = username.partition("/")
    if not slash:
        identity = username
        role_name = username if username in RESERVED_NAMES else Role.USER.value
    try:
        role = Role(role_name)
    except ValueError:
        raise BadCredentials(f"unknown role {role_name[:40]!r} in the user name") from None
    if role not in SIGN_IN_ROLES:
        raise BadCredentials(f"a {role.value} identity cannot sign in to the dashboard (only users and operators)")
    try:
        return role, validate_identity(role, identity)
    except ValueError as exc:
        raise BadCredentials(str(exc)) from None


def parse_basic(header: str | None) -> Visitor | None:
    """The visitor an ``Authorization: Basic ...`` header names; None without a header, BadCredentials
    for one that cannot be credentials (another scheme, bad base64, no seed, a seed that is not one)."""
    if not header:
        return None
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        raise BadCredentials("only HTTP Basic authentication is accepted")
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise BadCredentials("the Basic credentials are not base64 of user:password") from None
    username, colon, seed = decoded.partition(":")
    if not colon or not seed.strip():
        raise BadCredentials("no password: give the nkey seed of your credentials file")
    role, identity = _role_and_identity(username)
    credentials = Credentials(role, identity, seed.strip())
    try:
        credentials.public_key  # noqa: B018 (checks that the seed is a user nkey seed)
    except CredentialsError as exc:
        raise BadCredentials(f"the password is not a credentials file's seed: {exc}") from None
    return Visitor(credentials)
